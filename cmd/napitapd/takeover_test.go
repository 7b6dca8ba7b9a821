package main

import (
	"golang.org/x/sys/unix"

	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/fdtest"
	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// launchSleepEnv makes the re-executed test binary `napitapctl launch --
// sleep 60` against the seccomp socket it names: a process under the
// filter whose listener napitapd serves until it is killed.
const launchSleepEnv = "NAPITAPD_TEST_LAUNCH_SLEEP"

func init() {
	if socket := os.Getenv(launchSleepEnv); socket != "" {
		// Before TestMain: the launch must not run the tests.
		err := seccompagent.Launch(socket, []string{"sleep", "60"}, os.Environ())
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
}

// napitapd is a napitapd process of the test's.
type napitapd struct {
	cmd  *exec.Cmd
	log  *syncbuf.Buffer
	done chan struct{} // closed at its exit, with err
	err  error
}

// paths are one napitapd's --socket, --seccomp-socket and --state-dir.
type paths struct{ socket, seccomp, state string }

func startNapitapdProc(t testing.TB, p paths, flags ...string) *napitapd {
	t.Helper()
	cmd := mainexec.Command("napitapd", append([]string{"--socket", p.socket, "--seccomp-socket", p.seccomp, "--state-dir", p.state}, flags...)...)
	d := &napitapd{cmd: cmd, log: &syncbuf.Buffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = d.log, d.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.err = cmd.Wait(); close(d.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("napitapd pid %d log:\n%s", cmd.Process.Pid, d.log)
		}
	})
	return d
}

// seccompListeners counts the seccomp listeners process pid holds: open
// files, not fds (napitapd keeps a copy of each for its fd holder).
func seccompListeners(t testing.TB, pid int) int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var fds []int
	for _, e := range ents {
		fd, _ := strconv.Atoi(e.Name())
		target, _ := os.Readlink(filepath.Join(dir, e.Name()))
		if !strings.HasPrefix(target, "anon_inode:seccomp notify") {
			continue
		}
		if !slices.ContainsFunc(fds, func(other int) bool { same, _ := fdtest.Same(pid, fd, pid, other); return same }) {
			fds = append(fds, fd)
		}
	}
	return len(fds)
}

// TestASecondNapitapdTakesEverythingOverAndTheFirstExits: a napitapd
// started on the paths of a running one takes its sockets, its seccomp
// listener and its held queues; the first exits 0, a client polling the
// socket throughout sees no error, the queues fetched from the second are
// NAPI queues, and the sockets it took over have its --socket-group (a
// rollout that changes it).
func TestASecondNapitapdTakesEverythingOverAndTheFirstExits(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "takeover")
	const tap = "napitk0"
	key := handoff.Key{ContainerID: "takeover", IfName: "net1"}
	dir := t.TempDir()
	p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}

	first := startNapitapdProc(t, p)
	waitFile(t, p.socket)
	waitFile(t, p.seccomp)
	var queues []*os.File
	err := ns.WithNetNSPath(pod.Path(), func(ns.NetNS) error {
		var err error
		if _, queues, err = tapsetup.Create(tapsetup.Spec{Name: tap, Queues: 2, VnetHdrSize: 12,
			Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}}); err != nil {
			return err
		}
		link, err := netlink.LinkByName(tap)
		if err == nil {
			err = netlink.LinkSetAlias(link, tapsetup.OwnerAlias(key.ContainerID, key.IfName))
		}
		if err == nil {
			err = netlink.LinkSetUp(link)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	gro := uint64(200_000)
	if err := tapsetup.ApplyNAPIKnobs(pod.Path(), tap, tapsetup.NAPIKnobs{GROFlushTimeout: &gro}); err != nil {
		t.Fatal(err)
	}
	client := &handoff.Client{Socket: p.socket}
	err = client.Register(&handoff.Attachment{Key: key, Network: "net-a", Netns: pod.Path(), TapName: tap,
		Queues: 2, MultiQueue: true, NAPI: true, VnetHdr: true, VnetHdrSize: 12}, queues)
	tapsetup.CloseQueues(queues)
	if err != nil {
		t.Fatal(err)
	}

	launchUnderFilter(t, p.seccomp, first.cmd.Process.Pid)

	var polls, failures atomic.Int64
	var firstFailure atomic.Value
	stopPolling := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stopPolling:
				return
			default:
			}
			if _, err := client.List(); err != nil {
				failures.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
			polls.Add(1)
		}
	}()
	time.Sleep(100 * time.Millisecond)

	start := time.Now()
	second := startNapitapdProc(t, p, "--socket-group", "107")
	select {
	case <-first.done:
		if first.err != nil {
			t.Fatalf("the first napitapd exited with %v, want 0\n%s", first.err, first.log)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the first napitapd did not exit after the takeover\nfirst:\n%s\nsecond:\n%s", first.log, second.log)
	}
	exited := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	close(stopPolling)
	<-polled
	took := regexp.MustCompile(`tookOver=true took=(\S+)`).FindStringSubmatch(second.log.String())
	if took == nil {
		t.Fatalf("the second napitapd's log does not say it took over:\n%s", second.log)
	}
	t.Logf("takeover: %s from request to serving; the first exited %v after the second started; %d polls through it", took[1], exited.Round(time.Millisecond), polls.Load())
	if n := failures.Load(); n > 0 {
		t.Errorf("%d of %d polls of the socket failed, the first: %v", n, polls.Load(), firstFailure.Load())
	}
	if n := seccompListeners(t, second.cmd.Process.Pid); n != 1 {
		t.Errorf("the second napitapd holds %d seccomp listeners, want the launched process's", n)
	}
	// What napitapctl filtered prints: the listener, by origin.
	if st, err := client.Status(); err != nil || st.Filter == nil || len(st.Filter.Listeners) != 1 {
		t.Errorf("the second napitapd's status: %+v, %v; want the launched process's listener in its filter", st, err)
	} else {
		t.Logf("the second napitapd's filter serves %q", st.Filter.Listeners)
	}
	for _, path := range []string{p.socket, p.seccomp} {
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			t.Errorf("after the takeover: %v", err)
		} else if st.Gid != 107 {
			t.Errorf("after the takeover: %s has group %d, want the second napitapd's --socket-group 107", path, st.Gid)
		}
	}

	atts, err := client.List()
	if err != nil || len(atts) != 1 || atts[0].Held != 2 {
		t.Fatalf("List from the second napitapd: %+v, %v; want %s holding 2 queues", atts, err, key)
	}
	probeFetched(t, client, key, "the takeover")

	// SIGTERM still stops the second napitapd in order.
	second.stop(t, "the second napitapd")
}

// probeFetched fetches key's held queues and wants the first to be a NAPI
// queue: GRO merges what is written into it.
func probeFetched(t *testing.T, client *handoff.Client, key handoff.Key, after string) {
	t.Helper()
	_, fetched, err := client.Fetch(&key)
	if err != nil {
		t.Fatalf("Fetch after %s: %v", after, err)
	}
	defer tapsetup.CloseQueues(fetched)
	res, err := napiprobe.RunQueue(fetched[0], 16, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Merged() {
		t.Errorf("a held queue fetched after %s: %s", after, res)
	} else {
		t.Logf("a held queue fetched after %s: %s", after, res)
	}
}

// stop SIGTERMs d and wants it to exit 0.
func (d *napitapd) stop(t *testing.T, what string) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	d.waitExit(t, time.Minute, what)
}

// waitExit waits up to within for d to exit, which it must with status 0.
func (d *napitapd) waitExit(t *testing.T, within time.Duration, what string) {
	t.Helper()
	select {
	case <-d.done:
		if d.err != nil {
			t.Errorf("%s exited with %v, want 0\n%s", what, d.err, d.log)
		}
	case <-time.After(within):
		t.Fatalf("%s still runs after %v\n%s", what, within, d.log)
	}
}

// TestWithWaitAfterTakeoverTheOldNapitapdHoldsNothingAndStopsOnSIGTERM:
// the DaemonSet's old pod hands everything over and keeps running, so that
// the kubelet does not restart its container (whose napitapd would take
// everything back); its SIGTERM, when the controller deletes the pod,
// leaves the new napitapd's sockets and listeners alone.
func TestWithWaitAfterTakeoverTheOldNapitapdHoldsNothingAndStopsOnSIGTERM(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}
	old := startNapitapdProc(t, p, "--wait-after-takeover")
	waitFile(t, p.socket)
	waitFile(t, p.seccomp)

	launchUnderFilter(t, p.seccomp, old.cmd.Process.Pid)

	next := startNapitapdProc(t, p)
	for deadline := time.Now().Add(15 * time.Second); !strings.Contains(old.log.String(), "waiting for SIGTERM"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the old napitapd never said it handed over\nold:\n%s\nnext:\n%s", old.log, next.log)
		}
	}
	time.Sleep(300 * time.Millisecond)
	select {
	case <-old.done:
		t.Fatalf("the old napitapd exited (%v) after the takeover; want it waiting for SIGTERM\n%s", old.err, old.log)
	default:
	}
	if n := seccompListeners(t, old.cmd.Process.Pid); n != 0 {
		t.Errorf("the old napitapd still holds %d seccomp listeners", n)
	}
	if n := seccompListeners(t, next.cmd.Process.Pid); n != 1 {
		t.Errorf("the new napitapd holds %d seccomp listeners, want 1", n)
	}

	old.stop(t, "the old napitapd")
	for _, path := range []string{p.socket, p.seccomp} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("after the old napitapd stopped: %v", err)
		}
	}
	if _, err := (&handoff.Client{Socket: p.socket}).List(); err != nil {
		t.Errorf("the new napitapd after the old one stopped: %v", err)
	}
	if n := seccompListeners(t, next.cmd.Process.Pid); n != 1 {
		t.Errorf("after the old napitapd stopped the new one holds %d seccomp listeners, want 1", n)
	}
}

// launchUnderFilter starts a process that sends its seccomp listener to the
// agent at seccomp, then sleeps under the filter until the test ends, and
// waits for napitapd pid to serve that listener.
func launchUnderFilter(t *testing.T, seccomp string, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	launched := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	launched.Env = append(os.Environ(), launchSleepEnv+"="+seccomp)
	if err := launched.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = launched.Process.Kill(); _ = launched.Wait() })
	// Until it runs sleep: the launch has had napitapd's answer, so a
	// napitapd killed from now on cannot fail it.
	comm := fmt.Sprintf("/proc/%d/comm", launched.Process.Pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(comm)
		if seccompListeners(t, pid) == 1 && strings.TrimSpace(string(b)) == "sleep" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("napitapd pid %d never got the launched process's listener, or the launch never ran sleep (%q)", pid, b)
		}
	}
}
