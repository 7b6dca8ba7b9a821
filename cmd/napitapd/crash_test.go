package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// stormEnv makes the re-executed test binary a by-name opener under
// `napitapctl launch` (stormLaunchEnv) that opens and closes a queue of a
// tap as fast as it can until told to stop (stormSpec, JSON).
const (
	stormLaunchEnv = "NAPITAPD_TEST_STORM_LAUNCH"
	stormEnv       = "NAPITAPD_TEST_STORM"
)

type stormSpec struct {
	Seccomp, Netns, Tap, Stop, Out string
}

// stormResult is what one opener saw.
type stormResult struct {
	Opens, NoNAPI, Failed int
	FirstErr              string
	Longest               time.Duration // the longest TUNSETIFF: a wait through a crash
}

func init() {
	// The opener's environment still names the launch: look for it first.
	if spec := os.Getenv(stormEnv); spec != "" {
		os.Exit(runStorm(spec))
	}
	if spec := os.Getenv(stormLaunchEnv); spec != "" {
		var s stormSpec
		_ = json.Unmarshal([]byte(spec), &s)
		// As a runtime in the pod: its netns, then the filter, then exec.
		err := seccompagent.Launch(s.Seccomp, []string{"nsenter", "--net=" + s.Netns, "--", os.Args[0], "-test.run=^$"},
			append(os.Environ(), stormEnv+"="+spec))
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
}

func runStorm(specJSON string) int {
	var s stormSpec
	if err := json.Unmarshal([]byte(specJSON), &s); err != nil {
		return 2
	}
	var r stormResult
	fail := func(err error) {
		r.Failed++
		if r.FirstErr == "" {
			r.FirstErr = err.Error()
		}
	}
	for {
		if _, err := os.Stat(s.Stop); err == nil {
			break
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			fail(err)
			continue
		}
		ifr, _ := unix.NewIfreq(s.Tap)
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
		start := time.Now()
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		r.Longest = max(r.Longest, time.Since(start))
		r.Opens++
		if err == nil {
			err = unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr)
		}
		switch {
		case err != nil:
			fail(fmt.Errorf("TUNSETIFF %s: %w", s.Tap, err))
		case ifr.Uint16()&unix.IFF_NAPI == 0:
			r.NoNAPI++
		}
		unix.Close(fd)
	}
	b, _ := json.Marshal(r)
	_ = os.WriteFile(s.Out, b, 0o600)
	return 0
}

// startHolder serves an fd holder at path in the test's process, as the
// DaemonSet's fdstore sidecar does beside napitapd: it outlives the
// napitapd processes the test kills.
func startHolder(t testing.TB, path string) {
	t.Helper()
	l, err := fdstore.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	h := fdstore.NewHolder(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	done := make(chan struct{})
	go func() { defer close(done); _ = h.Serve(l) }()
	t.Cleanup(func() { l.Close(); <-done; h.Close() })
}

// crashAndRestart SIGKILLs d, lets its clients wait for gap, and starts
// the next napitapd on the same paths, as the kubelet restarts the
// container; it returns the next one once it serves.
func crashAndRestart(t *testing.T, d *napitapd, p paths, gap time.Duration, flags ...string) *napitapd {
	t.Helper()
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-d.done
	time.Sleep(gap)
	next := startNapitapdProc(t, p, flags...)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(next.log.String(), `msg=serving`); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the napitapd started after the crash does not serve:\n%s", next.log)
		}
	}
	return next
}

// TestASIGKILLedNapitapdLosesNothingToItsHolder: napitapd is SIGKILLed
// twice in the middle of a TUNSETIFF storm by three by-name openers under
// three filters, with an fds-mode attachment's queues held. Every
// TUNSETIFF of the storm gets a NAPI queue, none fails: those made while
// napitapd was dead wait for the next one, and one the dead napitapd had
// received but not answered is answered by the next (its slot). The next
// napitapd holds every listener and the held queues, which fetch as NAPI
// queues.
func TestASIGKILLedNapitapdLosesNothingToItsHolder(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "crash")
	const stormTap, heldTap, openers = "napicr0", "napicr1", 3
	stormKey := handoff.Key{ContainerID: "crash", IfName: "net0"}
	heldKey := handoff.Key{ContainerID: "crash", IfName: "net1"}
	dir := t.TempDir()
	p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}
	holder := filepath.Join(dir, "fdstore.sock")
	startHolder(t, holder)
	flags := []string{"--fdstore-socket", holder}

	first := startNapitapdProc(t, p, flags...)
	waitFile(t, p.socket)
	waitFile(t, p.seccomp)
	client := &handoff.Client{Socket: p.socket}
	for _, a := range []struct {
		key       handoff.Key
		tap       string
		intercept bool
	}{{stormKey, stormTap, true}, {heldKey, heldTap, false}} {
		var queues []*os.File
		err := ns.WithNetNSPath(pod.Path(), func(ns.NetNS) error {
			var err error
			if _, queues, err = tapsetup.Create(tapsetup.Spec{Name: a.tap, Queues: 2, VnetHdrSize: 12,
				Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}}); err != nil {
				return err
			}
			link, err := netlink.LinkByName(a.tap)
			if err == nil {
				err = netlink.LinkSetAlias(link, tapsetup.OwnerAlias(a.key.ContainerID, a.key.IfName))
			}
			if err == nil {
				err = netlink.LinkSetUp(link)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		att := &handoff.Attachment{Key: a.key, Network: "net-a", Netns: pod.Path(), TapName: a.tap,
			Queues: 2, MultiQueue: true, NAPI: true, VnetHdr: true, VnetHdrSize: 12, Intercept: a.intercept}
		if a.intercept {
			// The runtime opens this one by name; napitap holds nothing.
			tapsetup.CloseQueues(queues)
			queues = nil
		}
		err = client.Register(att, queues)
		tapsetup.CloseQueues(queues)
		if err != nil {
			t.Fatal(err)
		}
	}
	gro := uint64(200_000)
	if err := tapsetup.ApplyNAPIKnobs(pod.Path(), heldTap, tapsetup.NAPIKnobs{GROFlushTimeout: &gro}); err != nil {
		t.Fatal(err)
	}

	stop := filepath.Join(dir, "stop")
	var outs []string
	var launched []*exec.Cmd
	for i := range openers {
		out := filepath.Join(dir, fmt.Sprintf("storm%d.json", i))
		spec, _ := json.Marshal(stormSpec{Seccomp: p.seccomp, Netns: pod.Path(), Tap: stormTap, Stop: stop, Out: out})
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), stormLaunchEnv+"="+string(spec))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		launched = append(launched, cmd)
		outs = append(outs, out)
	}
	stopped := false
	stopStorm := func() {
		if stopped {
			return
		}
		stopped = true
		_ = os.WriteFile(stop, nil, 0o600)
		for _, cmd := range launched {
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("opener pid %d: %v", cmd.Process.Pid, err)
				}
			case <-time.After(30 * time.Second):
				t.Errorf("opener pid %d still blocked 30 s after the storm ended: a TUNSETIFF nobody answers", cmd.Process.Pid)
				_ = cmd.Process.Kill()
				<-done
			}
		}
	}
	t.Cleanup(stopStorm)

	attaches := func(d *napitapd) int { return strings.Count(d.log.String(), "attached the caller's queue with NAPI") }
	waitAttaches := func(d *napitapd, n int, what string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); attaches(d) < n; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: napitapd attached %d queues, want %d:\n%s", what, attaches(d), n, d.log)
			}
		}
	}
	waitAttaches(first, 200, "the storm before the first crash")
	d := first
	recovered := 0
	for round := 1; round <= 2; round++ {
		d = crashAndRestart(t, d, p, 300*time.Millisecond, flags...)
		if n := seccompListeners(t, d.cmd.Process.Pid); n != openers {
			t.Errorf("crash %d: the next napitapd holds %d seccomp listeners, want one for each of the %d openers", round, n, openers)
		}
		waitAttaches(d, 200, fmt.Sprintf("the storm after crash %d", round))
		recovered += strings.Count(d.log.String(), "never answered")
		took := regexp.MustCompile(`fd holder: recovered[^\n]*`).FindString(d.log.String())
		t.Logf("crash %d: %s", round, took)
	}
	stopStorm()
	total := stormResult{}
	for _, out := range outs {
		var r stormResult
		b, err := os.ReadFile(out)
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil {
			t.Fatalf("opener result %s: %v", out, err)
		}
		total.Opens += r.Opens
		total.NoNAPI += r.NoNAPI
		total.Failed += r.Failed
		total.Longest = max(total.Longest, r.Longest)
		if r.FirstErr != "" && total.FirstErr == "" {
			total.FirstErr = r.FirstErr
		}
	}
	t.Logf("storm: %d TUNSETIFFs by %d openers through 2 SIGKILLs; %d failed, %d without NAPI; longest %v (a wait through a crash); %d received by a dead napitapd and answered by the next",
		total.Opens, openers, total.Failed, total.NoNAPI, total.Longest.Round(time.Millisecond), recovered)
	if total.Failed > 0 || total.NoNAPI > 0 {
		t.Errorf("%d TUNSETIFFs failed (the first: %s) and %d got no NAPI; want every one a NAPI queue", total.Failed, total.FirstErr, total.NoNAPI)
	}
	if total.Longest < 300*time.Millisecond {
		t.Errorf("no TUNSETIFF waited through a crash (longest %v): the storm did not cover the gap", total.Longest)
	}

	atts, err := client.List()
	held := map[handoff.Key]int{}
	for _, a := range atts {
		held[a.Key] = a.Held
	}
	if err != nil || held[heldKey] != 2 {
		t.Fatalf("List after the crashes: %+v, %v; want %s holding its 2 queues", atts, err, heldKey)
	}
	probeFetched(t, client, heldKey, "two crashes")
	d.stop(t, "the last napitapd")
}
