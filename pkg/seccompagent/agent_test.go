package seccompagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func TestAManagedTapGetsNAPIQueuesOnlyThroughTheAgent(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napisc0"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	ta := startAgent(t, slog.LevelInfo)
	ta.manage(t, pod, tap, Target{NAPI: true, MultiQueue: true})

	tests := []struct {
		name     string
		socket   string
		wantNAPI bool
	}{
		{"a QEMU-like open of 4 queues under the agent gets NAPI queues that merge in GRO", ta.socket, true},
		{"the same open without the agent gets plain queues that do not merge", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			spec := targetSpec{Netns: pod.Path(), Tap: tap, Queues: 4, Flags: qemuFlags, Again: true, Probe: true}
			res := runTargetProc(t, spec, tc.socket)
			for i, e := range res.Errnos {
				if e != 0 {
					t.Fatalf("queue %d: TUNSETIFF: %v", i, unix.Errno(e))
				}
				if got := res.Flags[i]&unix.IFF_NAPI != 0; got != tc.wantNAPI {
					t.Errorf("queue %d: TUNGETIFF flags 0x%x, IFF_NAPI %v, want %v", i, res.Flags[i], got, tc.wantNAPI)
				}
			}
			// Cloud Hypervisor repeats TUNSETIFF on fds it was given.
			if res.Again != int(unix.EEXIST) {
				t.Errorf("TUNSETIFF again on an attached queue: %v, want EEXIST as natively", unix.Errno(res.Again))
			}
			if res.Merged != tc.wantNAPI {
				t.Errorf("GRO probe on the last queue: merged %v, want %v; frame lengths %v", res.Merged, tc.wantNAPI, res.SKBLens)
			} else {
				t.Logf("GRO probe frame lengths: %v", res.SKBLens)
			}
			ta.waitIdle(t)
			waitFDs(t, before, "after the target exited")
		})
	}
}

func TestWhatTheAgentDoesNotManageIsLeftToTheKernel(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	other := nstest.New(t, "seccomp")
	owner, group := uint32(1000), uint32(1001)
	me, myGroup := uint32(1234), uint32(1001)
	taps := []tapSpec{
		{name: "napisc0", multiQueue: true},
		{name: "napisc1", multiQueue: true}, // not in the registry
		{name: "napisc2", multiQueue: true, owner: &owner, group: &group},
		{name: "napisc3", multiQueue: true, owner: &me, group: &myGroup},
		{name: "napisc4", multiQueue: true, group: &myGroup},
	}
	ta := startAgent(t, slog.LevelInfo)
	for _, s := range taps {
		newTap(t, pod, s)
		if s.name != "napisc1" {
			ta.manage(t, pod, s.name, Target{NAPI: true, MultiQueue: true})
		}
	}
	newTap(t, other, tapSpec{name: "napisc0", multiQueue: true}) // same name, not managed there
	// Recorded, but gone: napitapd's TUNSETIFF would create it.
	ta.manage(t, pod, "napisc8", Target{NAPI: true, MultiQueue: true})

	tests := []struct {
		name    string
		netns   *nstest.NetNS
		tap     string
		flags   uint16
		uid     *int
		groups  []int
		gid     *int
		wantErr unix.Errno
		// managed: a success through the agent carries NAPI.
		managed bool
		wantLog string
	}{
		{name: "an unmanaged tap in the pod netns", netns: pod, tap: "napisc1", flags: qemuFlags},
		{name: "a managed tap's name in another netns", netns: other, tap: "napisc0", flags: qemuFlags},
		{name: "a TUN open of a managed tap is EINVAL", netns: pod, tap: "napisc0", flags: unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE, wantErr: unix.EINVAL},
		{name: "IFF_TUN_EXCL on a managed tap is EBUSY", netns: pod, tap: "napisc0", flags: qemuFlags | unix.IFF_TUN_EXCL, wantErr: unix.EBUSY},
		{name: "a single-queue open of a multiqueue managed tap is EINVAL and logged", netns: pod, tap: "napisc0", flags: qemuFlags &^ unix.IFF_MULTI_QUEUE, wantErr: unix.EINVAL,
			wantLog: "multiqueue mode mismatch"},
		{name: "a name that does not exist, asked by a non-root caller, is EPERM", netns: pod, tap: "napisc9", flags: qemuFlags, uid: ptr(1234), gid: ptr(1234), wantErr: unix.EPERM},
		{name: "a managed name whose tap is gone is the kernel's: EPERM for a non-root caller", netns: pod, tap: "napisc8", flags: qemuFlags, uid: ptr(1234), gid: ptr(1234), wantErr: unix.EPERM,
			wantLog: "managed tap is not in its netns"},
		{name: "a caller that is neither the owner nor in the group is EPERM", netns: pod, tap: "napisc2", flags: qemuFlags, uid: ptr(1234), gid: ptr(1234), wantErr: unix.EPERM, managed: true,
			wantLog: "caller may not attach"},
		{name: "the owner outside the group is EPERM: the kernel wants both", netns: pod, tap: "napisc3", flags: qemuFlags, uid: ptr(1234), gid: ptr(1234), wantErr: unix.EPERM, managed: true},
		{name: "the owner with the group among its supplementary groups attaches", netns: pod, tap: "napisc3", flags: qemuFlags, uid: ptr(1234), gid: ptr(1234), groups: []int{1001}, managed: true},
		{name: "a caller whose egid is the tap's only group attaches", netns: pod, tap: "napisc4", flags: qemuFlags, uid: ptr(4321), gid: ptr(1001), managed: true},
		{name: "root attaches whatever owner and group say: CAP_NET_ADMIN", netns: pod, tap: "napisc2", flags: qemuFlags, managed: true},
		{name: "any caller attaches a tap with neither owner nor group", netns: pod, tap: "napisc0", flags: qemuFlags, uid: ptr(1234), gid: ptr(1234), managed: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := targetSpec{Netns: tc.netns.Path(), Tap: tc.tap, Queues: 2, Flags: tc.flags, UID: tc.uid, GID: tc.gid, Groups: tc.groups, Again: true}
			native := runTargetProc(t, spec, "")
			logBefore := len(ta.log.String())
			agent := runTargetProc(t, spec, ta.socket)
			for i := range spec.Queues {
				if got := unix.Errno(native.Errnos[i]); got != tc.wantErr {
					t.Errorf("queue %d natively: %v, want %v", i, got, tc.wantErr)
				}
				if got, want := unix.Errno(agent.Errnos[i]), unix.Errno(native.Errnos[i]); got != want {
					t.Errorf("queue %d under the agent: %v, natively %v", i, got, want)
				}
				const napi = unix.IFF_NAPI | unix.IFF_NAPI_FRAGS
				if a, n := agent.Flags[i]&^napi, native.Flags[i]&^napi; a != n {
					t.Errorf("queue %d: flags 0x%x under the agent, 0x%x natively (NAPI bits aside)", i, a, n)
				}
				if native.Flags[i]&unix.IFF_NAPI != 0 {
					t.Errorf("queue %d natively: flags 0x%x have IFF_NAPI", i, native.Flags[i])
				}
				wantNAPI := tc.managed && tc.wantErr == 0
				if got := agent.Flags[i]&unix.IFF_NAPI != 0; got != wantNAPI {
					t.Errorf("queue %d under the agent: flags 0x%x, IFF_NAPI %v, want %v", i, agent.Flags[i], got, wantNAPI)
				}
			}
			if agent.Again != native.Again {
				t.Errorf("TUNSETIFF again: %v under the agent, %v natively", unix.Errno(agent.Again), unix.Errno(native.Again))
			}
			if tc.wantLog != "" {
				logs := ta.log.String()[logBefore:]
				if !strings.Contains(logs, tc.wantLog) || !strings.Contains(logs, "tap="+tc.tap) {
					t.Errorf("agent log lacks %q naming tap %s:\n%s", tc.wantLog, tc.tap, logs)
				}
				if tc.wantLog == "multiqueue mode mismatch" && (!strings.Contains(logs, "asked_mode=single-queue") || !strings.Contains(logs, "tap_mode=multi-queue")) {
					t.Errorf("mismatch log names neither mode asked nor the tap's:\n%s", logs)
				}
			}
		})
	}
}

// TestASignalStormNeverYieldsEEXIST: a signal that restarted the caller's
// TUNSETIFF after the agent had attached its fd would make the restarted
// call find it attached: EEXIST (DESIGN.md fact 12). WAIT_KILLABLE_RECV
// prevents that; for filters without it (runc's), restart_test.go.
func TestASignalStormNeverYieldsEEXIST(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napisc0"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	ta := startAgent(t, slog.LevelWarn)
	ta.manage(t, pod, tap, Target{NAPI: true, MultiQueue: true})
	// Hold each answer a while after the attach: the window a signal hits.
	ta.agent.mu.Lock()
	ta.agent.beforeReply = func(_ int, attached bool) {
		if attached {
			time.Sleep(20 * time.Millisecond)
		}
	}
	ta.agent.mu.Unlock()

	tests := []struct {
		name       string
		flags      uintptr
		wantEEXIST bool
	}{
		{"with WAIT_KILLABLE_RECV every queue attaches with NAPI", filterFlags, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spec := targetSpec{Netns: pod.Path(), Tap: tap, Queues: 8, Flags: qemuFlags}
			cmd := targetCmd(ctx, t, spec, ta.socket, tc.flags)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			var sent int
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				// SIGURG: Go's own preemption signal, handled with
				// SA_RESTART, and harmless to a process that has none.
				for {
					select {
					case <-stop:
						return
					default:
					}
					if syscall.Kill(cmd.Process.Pid, syscall.SIGURG) != nil {
						return
					}
					sent++
					time.Sleep(50 * time.Microsecond)
				}
			}()
			var res targetResult
			decErr := json.NewDecoder(stdout).Decode(&res)
			err = cmd.Wait()
			close(stop)
			wg.Wait()
			if decErr != nil || err != nil {
				t.Fatalf("target: %v, output: %v; stderr: %s", err, decErr, stderr.String())
			}
			t.Logf("%d signals sent; errnos %v", sent, res.Errnos)
			eexist := 0
			for i, e := range res.Errnos {
				switch {
				case e == int(unix.EEXIST):
					eexist++
				case e != 0:
					t.Errorf("queue %d: %v", i, unix.Errno(e))
				case !tc.wantEEXIST && res.Flags[i]&unix.IFF_NAPI == 0:
					t.Errorf("queue %d: flags 0x%x lack IFF_NAPI", i, res.Flags[i])
				}
			}
			if tc.wantEEXIST && eexist == 0 {
				t.Errorf("no EEXIST without WAIT_KILLABLE_RECV: the storm did not hit the window, the test proves nothing")
			}
			if !tc.wantEEXIST && eexist > 0 {
				t.Errorf("%d queues got EEXIST", eexist)
			}
		})
	}
}

// agentProc is a napitapd in a process of its own, to be killed.
type agentProc struct {
	cmd *exec.Cmd
	out *bufio.Reader
}

// daemonSetCaps are the capabilities deploy/base/daemonset.yaml gives
// napitapd, in setpriv's spelling.
const daemonSetCaps = "-all,+net_admin,+setgid,+setuid,+sys_admin,+sys_ptrace"

// agentProcOpts: stall makes the agent decide and never answer; caps, in
// setpriv's spelling, bound its capabilities (daemonSetCaps: as on a node).
type agentProcOpts struct {
	stall bool
	caps  string
}

func startAgentProc(t *testing.T, socket string, opts agentProcOpts, reg []registryEntry) *agentProc {
	t.Helper()
	b, err := json.Marshal(reg)
	if err != nil {
		t.Fatal(err)
	}
	env := []string{socketEnv + "=" + socket, registryEnv + "=" + string(b)}
	if opts.stall {
		env = append(env, stallEnv+"=1")
	}
	cmd := helperCmd(context.Background(), "agent", env...)
	if opts.caps != "" {
		cmd.Args = append([]string{"setpriv", "--bounding-set=" + opts.caps, "--inh-caps=-all", "--"}, cmd.Args...)
		if cmd.Path, err = exec.LookPath("setpriv"); err != nil {
			t.Fatal(err)
		}
	}
	cmd.Stderr = &logBuf{t: t}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	p := &agentProc{cmd: cmd, out: bufio.NewReader(stdout)}
	if line, err := readLine(p.out, 10*time.Second); line != "ready" {
		t.Fatalf("agent process: %q, %v", line, err)
	}
	return p
}

func TestAnAgentKilledMidNotificationGivesENOSYSAndARestartedOneServes(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napisc0"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	socket := t.TempDir() + "/seccomp.sock"
	reg := []registryEntry{{Netns: pod.Path(), Tap: tap, Target: Target{Key: "test/" + tap, NAPI: true, MultiQueue: true}}}
	spec := targetSpec{Netns: pod.Path(), Tap: tap, Queues: 1, Flags: qemuFlags}

	agent := startAgentProc(t, socket, agentProcOpts{stall: true}, reg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := targetCmd(ctx, t, spec, socket, filterFlags)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := readLine(agent.out, 10*time.Second); line != "stalled" {
		t.Fatalf("agent never held a notification: %q, %v", line, err)
	}
	killed := time.Now()
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var res targetResult
	decErr := json.NewDecoder(stdout).Decode(&res)
	err = cmd.Wait()
	if decErr != nil || err != nil {
		t.Fatalf("target: %v, output: %v; stderr: %s", err, decErr, stderr.String())
	}
	t.Logf("the caller returned %v after the agent was killed", time.Since(killed).Round(time.Millisecond))
	if got := unix.Errno(res.Errnos[0]); got != unix.ENOSYS {
		t.Errorf("pending TUNSETIFF after the agent died: %v, want ENOSYS", got)
	}

	startAgentProc(t, socket, agentProcOpts{}, reg)
	res = runTargetProc(t, spec, socket)
	if res.Errnos[0] != 0 || res.Flags[0]&unix.IFF_NAPI == 0 {
		t.Errorf("launch served by the restarted agent: %v, flags 0x%x, want NAPI", unix.Errno(res.Errnos[0]), res.Flags[0])
	}
}

func TestEightProcessesOfAHundredTUNSETIFFsAllGetNAPI(t *testing.T) {
	nstest.RequireRoot(t)
	const procs, cycles = 8, 100
	pod := nstest.New(t, "seccomp")
	ta := startAgent(t, slog.LevelWarn)
	for i := range procs {
		// A tap each: a cycle's queue is then the tap's only one, so its
		// TUNGETIFF flags are that queue's (DESIGN.md fact 2).
		name := fmt.Sprintf("napisc%d", i)
		newTap(t, pod, tapSpec{name: name, multiQueue: true})
		ta.manage(t, pod, name, Target{NAPI: true, MultiQueue: true})
	}
	before := openFDs(t)
	results := make([]targetResult, procs)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spec := targetSpec{Netns: pod.Path(), Tap: fmt.Sprintf("napisc%d", i), Cycles: cycles, Queues: 1, Flags: qemuFlags, Probe: i%4 == 0}
			results[i] = runTargetProc(t, spec, ta.socket)
		}()
	}
	wg.Wait()
	t.Logf("%d processes x %d TUNSETIFFs in %v", procs, cycles+1, time.Since(start).Round(time.Millisecond))
	for i, r := range results {
		if r.CycleNAPI != cycles || len(r.CycleErrs) > 0 {
			t.Errorf("process %d: %d of %d cycles got NAPI; errors %v", i, r.CycleNAPI, cycles, r.CycleErrs)
		}
		if r.Errnos[0] != 0 || r.Flags[0]&unix.IFF_NAPI == 0 {
			t.Errorf("process %d: last queue %v, flags 0x%x", i, unix.Errno(r.Errnos[0]), r.Flags[0])
		}
		if i%4 == 0 && !r.Merged {
			t.Errorf("process %d: GRO probe did not merge: %v", i, r.SKBLens)
		}
	}
	ta.waitIdle(t)
	waitFDs(t, before, "after every target exited")
}

// TestOnlyATapMarkedAsTheAttachmentsGetsNAPI: napitapd's record names the
// tap, and the tap found under that name must carry the attachment's
// ifalias; a link of that name that napitap did not make is the kernel's.
func TestOnlyATapMarkedAsTheAttachmentsGetsNAPI(t *testing.T) {
	nstest.RequireRoot(t)
	const mark = "napitap:vmi/net1"
	cases := []struct {
		name     string
		alias    string
		wantNAPI bool
	}{
		{"a tap marked as the attachment's gets NAPI", mark, true},
		{"a tap of that name marked as another attachment's is left to the kernel", "napitap:other/net1", false},
		{"an unmarked tap of that name is left to the kernel", "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "seccomp")
			const tap = "napiscm"
			newTap(t, pod, tapSpec{name: tap, multiQueue: true})
			pod.Run(t, func() error {
				link, err := netlink.LinkByName(tap)
				if err != nil {
					return err
				}
				return netlink.LinkSetAlias(link, tc.alias)
			})
			ta := startAgent(t, slog.LevelInfo)
			ta.manage(t, pod, tap, Target{NAPI: true, MultiQueue: true, Mark: mark})
			res := runTargetProc(t, targetSpec{Netns: pod.Path(), Tap: tap, Queues: 2, Flags: qemuFlags}, ta.socket)
			for i, e := range res.Errnos {
				if e != 0 {
					t.Fatalf("queue %d: TUNSETIFF: %v", i, unix.Errno(e))
				}
				if got := res.Flags[i]&unix.IFF_NAPI != 0; got != tc.wantNAPI {
					t.Errorf("queue %d: flags 0x%x, IFF_NAPI %v, want %v", i, res.Flags[i], got, tc.wantNAPI)
				}
			}
			ta.waitIdle(t)
		})
	}
}

// TestNAPIKnobsHoldForQueuesTheRuntimeAttaches: ADD sets the tap's NAPI
// knobs while its own queues are attached, then closes them; the queues a
// runtime attaches later through the agent are threaded (one kernel thread
// each) and merge under the tap's gro_flush_timeout.
func TestNAPIKnobsHoldForQueuesTheRuntimeAttaches(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napisck"
	flush := uint64(200_000)
	pod.Run(t, func() error {
		link, queues, err := tapsetup.Create(tapsetup.Spec{Name: tap, Queues: 1, VnetHdrSize: vnetHdrLen,
			Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}})
		if err != nil {
			return err
		}
		defer tapsetup.CloseQueues(queues)
		if err := netlink.LinkSetUp(link); err != nil {
			return err
		}
		// While every queue is attached (DESIGN.md fact 9); never off.
		return tapsetup.ApplyNAPIKnobs(pod.Path(), tap, tapsetup.NAPIKnobs{Threaded: true, GROFlushTimeout: &flush})
	})
	t.Cleanup(func() { _ = pod.Do(func(ns.NetNS) error { return tapsetup.DeleteTap(tap, "") }) })
	ta := startAgent(t, slog.LevelWarn)
	ta.manage(t, pod, tap, Target{NAPI: true, MultiQueue: true})

	const queues = 4
	res := runTargetProc(t, targetSpec{Netns: pod.Path(), Tap: tap, Queues: queues, Flags: qemuFlags, Probe: true, Threads: true}, ta.socket)
	for i, e := range res.Errnos {
		if e != 0 {
			t.Fatalf("queue %d: TUNSETIFF: %v", i, unix.Errno(e))
		}
	}
	if res.NAPIThreads != queues {
		t.Errorf("%d napi/%s-* kernel threads while %d queues were attached, want one per queue", res.NAPIThreads, tap, queues)
	}
	if !res.Merged {
		t.Errorf("GRO probe: frame lengths %v, want one merged skb under gro_flush_timeout", res.SKBLens)
	}
	t.Logf("%d threaded NAPI instances; GRO probe frame lengths %v", res.NAPIThreads, res.SKBLens)
}

// TestNAPIFragsOnlyForACallerTheKernelWouldGiveThem: napitapd's TUNSETIFF
// passes the kernel's CAP_NET_ADMIN check for IFF_NAPI_FRAGS with its own
// capabilities, so the agent adds the flag only for a caller that could
// have asked for it itself; any other caller still gets IFF_NAPI.
func TestNAPIFragsOnlyForACallerTheKernelWouldGiveThem(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napiscf"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	ta := startAgent(t, slog.LevelInfo)
	ta.manage(t, pod, tap, Target{NAPI: true, NAPIFrags: true, MultiQueue: true})
	tests := []struct {
		name      string
		uid, gid  *int
		wantFrags bool
	}{
		{"root with CAP_NET_ADMIN gets IFF_NAPI_FRAGS as the config asks", nil, nil, true},
		{"an unprivileged caller gets IFF_NAPI without IFF_NAPI_FRAGS", ptr(1234), ptr(1234), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := runTargetProc(t, targetSpec{Netns: pod.Path(), Tap: tap, Queues: 2, Flags: qemuFlags, UID: tc.uid, GID: tc.gid}, ta.socket)
			for i, e := range res.Errnos {
				if e != 0 {
					t.Fatalf("queue %d: TUNSETIFF: %v", i, unix.Errno(e))
				}
				if res.Flags[i]&unix.IFF_NAPI == 0 || (res.Flags[i]&unix.IFF_NAPI_FRAGS != 0) != tc.wantFrags {
					t.Errorf("queue %d: TUNGETIFF flags 0x%x, want IFF_NAPI and IFF_NAPI_FRAGS %v", i, res.Flags[i], tc.wantFrags)
				}
			}
			ta.waitIdle(t)
		})
	}
}

// TestOneSenderUIDCannotTakeEveryListener: a tenant (a member of the
// seccomp socket's group, or a pod's root: uid 0 without napitapd's
// capabilities) that sends listener after listener gets its share and no
// more, other tenants get theirs, and napitapd's equal (runc, Kata's shim)
// is never refused. The listeners are real, each the filter of a thread
// kept alive until the test ends.
func TestOneSenderUIDCannotTakeEveryListener(t *testing.T) {
	nstest.RequireRoot(t)
	agent, err := New(&MapRegistry{}, slog.New(slog.NewTextHandler(&logBuf{t: t}, nil)), Options{MaxListeners: 6, MaxListenersPerUID: 2})
	if err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	t.Cleanup(agent.Close)
	t.Cleanup(func() { close(hold) }) // first: the threads end, then the agent closes
	add := func(l Listener) error {
		errc := make(chan error, 1)
		nstest.OnThreadThatEnds(func() {
			fd, err := installFilter(filterFlags)
			if err == nil {
				err = agent.add(fd, l)
			}
			errc <- err
			<-hold
		})
		return <-errc
	}
	steps := []struct {
		name string
		l    Listener
		full bool
	}{
		{"uid 1234's first listener is served", Listener{UID: 1234}, false},
		{"uid 1234's second listener is served", Listener{UID: 1234}, false},
		{"uid 1234's third is over its share", Listener{UID: 1234}, true},
		{"a pod's root gets its first", Listener{PodRoot: true}, false},
		{"a pod's root its second", Listener{PodRoot: true}, false},
		{"a pod's root's third is over its share, as any uid's", Listener{PodRoot: true}, true},
		{"uid 4321 still gets its first", Listener{UID: 4321}, false},
		{"uid 4321 its second", Listener{UID: 4321}, false},
		{"a fourth tenant finds the tenants' limit taken", Listener{UID: 5555}, true},
		{"napitapd's equal is served past the tenants' limit", Listener{}, false},
		{"and again", Listener{}, false},
	}
	for i, s := range steps {
		s.l.Origin = s.name
		err := add(s.l)
		if got := errors.Is(err, ErrFull); got != s.full || (err != nil && !got) {
			t.Fatalf("step %d, %s: add = %v, want full %v", i, s.name, err, s.full)
		}
	}
	if n := agent.Listeners(); n != 8 {
		t.Errorf("the agent serves %d listeners, want 8", n)
	}
}
