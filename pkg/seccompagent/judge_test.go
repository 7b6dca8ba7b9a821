package seccompagent

import (
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// The agent's TUNSETIFF runs with the caller's credentials, so the kernel
// judges the caller against the tap as it is, not napitapd's record of it.

func TestTheKernelJudgesTheCallerAgainstTheLiveTapsOwner(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napiscow"
	recorded, changed := uint32(1234), 4321
	newTap(t, pod, tapSpec{name: tap, multiQueue: true, owner: &recorded})
	// A process attached to the tap (root in the pod) hands it to another
	// owner after ADD.
	pod.Run(t, func() error {
		fd, err := openTun()
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := setIff(fd, tap, qemuFlags); err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		return unix.IoctlSetInt(fd, unix.TUNSETOWNER, changed)
	})
	ta := startAgent(t, slog.LevelInfo)
	ta.manage(t, pod, tap, Target{NAPI: true, MultiQueue: true})
	tests := []struct {
		name    string
		uid     int
		wantErr unix.Errno
	}{
		{name: "the owner napitap recorded is refused once the tap has another", uid: int(recorded), wantErr: unix.EPERM},
		{name: "the tap's owner now attaches with NAPI", uid: changed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := runTargetProc(t, targetSpec{Netns: pod.Path(), Tap: tap, Queues: 2, Flags: qemuFlags, UID: ptr(tc.uid), GID: ptr(tc.uid)}, ta.socket)
			for i, e := range res.Errnos {
				if unix.Errno(e) != tc.wantErr {
					t.Fatalf("queue %d: TUNSETIFF errno %v, want %v", i, unix.Errno(e), tc.wantErr)
				}
				if e == 0 && res.Flags[i]&unix.IFF_NAPI == 0 {
					t.Errorf("queue %d: flags 0x%x, want IFF_NAPI", i, res.Flags[i])
				}
			}
			ta.waitIdle(t)
		})
	}
}

func TestATapRenamedUnderTheCallerIsNeverMadeAnewForIt(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap, away = "napiscrn", "napiscrn-away"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	ta := startAgent(t, slog.LevelWarn)
	ta.manage(t, pod, tap, Target{NAPI: true, MultiQueue: true})
	// Root in the pod renames the tap back and forth (a tap that is up
	// cannot be renamed: it goes down first).
	stop := make(chan struct{})
	var renames int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := pod.Do(func(ns.NetNS) error {
			link, err := netlink.LinkByName(tap)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetDown(link); err != nil {
				return err
			}
			defer func() { _ = netlink.LinkSetName(link, tap) }()
			for {
				select {
				case <-stop:
					return nil
				default:
				}
				if err := netlink.LinkSetName(link, away); err != nil {
					return fmt.Errorf("rename %s: %w", tap, err)
				}
				if err := netlink.LinkSetName(link, tap); err != nil {
					return fmt.Errorf("rename %s back: %w", away, err)
				}
				renames++
			}
		})
		if err != nil {
			t.Errorf("renaming in netns %s: %v", pod.Name, err)
		}
	}()
	// Under TCG (make test-kernel) an attach takes 100-300 ms: fewer opens
	// there, each still racing the renames.
	cycles := max(2000/int(nstest.TimeScale()), 100)
	res := runTargetProc(t, targetSpec{Netns: pod.Path(), Tap: tap, Flags: qemuFlags, Cycles: cycles, UID: ptr(1234), GID: ptr(1234)}, ta.socket)
	close(stop)
	wg.Wait()
	errs := map[unix.Errno]int{}
	for _, e := range res.CycleErrs {
		errs[unix.Errno(e)]++
	}
	t.Logf("%d renames; of %d opens by uid 1234: %d with NAPI, %d made a tap, failed %v",
		renames, cycles, res.CycleNAPI, res.CycleNotPersistent, errs)
	if res.CycleNotPersistent > 0 {
		t.Errorf("%d of %d opens made a new tap for a caller the kernel lets make none", res.CycleNotPersistent, cycles)
	}
	for e := range errs {
		if e != unix.EPERM {
			t.Errorf("opens failed with %v; want only the kernel's EPERM for a name that is gone", e)
		}
	}
	if res.CycleNAPI == 0 {
		t.Errorf("no open got the tap while it had its name")
	}
}

func TestWithTheDaemonSetsCapabilitiesTheAgentActsAsTheCaller(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napiscds"
	owner := uint32(107)
	newTap(t, pod, tapSpec{name: tap, multiQueue: true, owner: &owner, group: &owner})
	reg := []registryEntry{{Netns: pod.Path(), Tap: tap, Target: Target{Key: "test/" + tap, NAPI: true, MultiQueue: true}}}
	tests := []struct {
		name     string
		caps     string
		uid      *int
		wantErr  unix.Errno
		wantNAPI bool
	}{
		{name: "KubeVirt's qemu, the tap's owner and group, gets NAPI queues", caps: daemonSetCaps, uid: ptr(107), wantNAPI: true},
		{name: "another uid is refused by the kernel", caps: daemonSetCaps, uid: ptr(3000), wantErr: unix.EPERM},
		{name: "root with CAP_NET_ADMIN gets NAPI queues", caps: daemonSetCaps, wantNAPI: true},
		{name: "without SETUID and SETGID the agent leaves the owner's open to the kernel, without NAPI",
			caps: "-all,+net_admin,+sys_admin,+sys_ptrace", uid: ptr(107)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			socket := t.TempDir() + "/seccomp.sock"
			startAgentProc(t, socket, agentProcOpts{caps: tc.caps}, reg)
			res := runTargetProc(t, targetSpec{Netns: pod.Path(), Tap: tap, Queues: 2, Flags: qemuFlags, UID: tc.uid, GID: tc.uid}, socket)
			for i, e := range res.Errnos {
				if unix.Errno(e) != tc.wantErr {
					t.Fatalf("queue %d: TUNSETIFF errno %v, want %v", i, unix.Errno(e), tc.wantErr)
				}
				if got := res.Flags[i]&unix.IFF_NAPI != 0; e == 0 && got != tc.wantNAPI {
					t.Errorf("queue %d: flags 0x%x, want IFF_NAPI %v", i, res.Flags[i], tc.wantNAPI)
				}
			}
		})
	}
}
