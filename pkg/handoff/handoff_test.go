package handoff_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	_ "github.com/napitap/napitap/internal/ownuserns"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// Every tap these tests make is called napiho<something>; every netns
// napitap-handoff-<random> (nstest.New(t, "handoff")).

func ptr[T any](v T) *T { return &v }

// ---------------------------------------------------------------------------
// An in-process napitapd.

type daemon struct {
	srv      *handoff.Server
	l        *net.UnixListener
	socket   string
	stateDir string
	serveErr error
	done     chan struct{}
	once     sync.Once
}

// testLog sends the server's log to t.Log while the test runs and drops
// what a straggling connection goroutine writes after it ended.
type testLog struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func newLogger(t testing.TB) *slog.Logger {
	w := &testLog{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, nil))
}

// startDaemon serves stateDir on socket (mode applied with handoff.Listen)
// until the test ends or stop is called.
func startDaemon(t testing.TB, stateDir, socket string, mode os.FileMode, configure ...func(*handoff.Server)) *daemon {
	t.Helper()
	logger := newLogger(t)
	srv, err := handoff.NewServer(stateDir, logger)
	if err != nil {
		t.Fatalf("NewServer(%s): %v", stateDir, err)
	}
	for _, c := range configure {
		c(srv)
	}
	l, err := handoff.Listen(socket, mode, -1)
	if err != nil {
		srv.Close()
		t.Fatalf("Listen(%s): %v", socket, err)
	}
	d := &daemon{srv: srv, l: l, socket: socket, stateDir: stateDir, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		d.serveErr = srv.Serve(context.Background(), l)
	}()
	t.Cleanup(func() {
		d.stop()
		if d.serveErr != nil {
			t.Errorf("Serve: %v", d.serveErr)
		}
	})
	return d
}

// newDaemon is startDaemon on a fresh state dir and socket.
func newDaemon(t testing.TB) *daemon {
	t.Helper()
	dir := t.TempDir()
	return startDaemon(t, filepath.Join(dir, "state"), filepath.Join(dir, "napitapd.sock"), 0o660)
}

// stop is what napitapd does on SIGTERM: stop accepting, drop every fd.
func (d *daemon) stop() {
	d.once.Do(func() {
		d.l.Close()
		<-d.done
		d.srv.Close()
	})
}

func (d *daemon) client() *handoff.Client {
	return &handoff.Client{Socket: d.socket, Timeout: 10 * time.Second}
}

func (d *daemon) statePath(k handoff.Key) string {
	return filepath.Join(d.stateDir, k.ContainerID+":"+k.IfName+".json")
}

func (d *daemon) hasState(k handoff.Key) bool {
	_, err := os.Stat(d.statePath(k))
	return err == nil
}

// ---------------------------------------------------------------------------
// Real taps.

func queueFlags(queues int) tapsetup.QueueFlags {
	return tapsetup.QueueFlags{MultiQueue: queues > 1, VnetHdr: true, NAPI: true}
}

// newTap creates the persistent NAPI tap name with its queues open, as ADD
// does, in pod. The queues are closed when the test ends at the latest.
func newTap(t testing.TB, pod *nstest.NetNS, name string, queues int, owner, group *uint32) []*os.File {
	t.Helper()
	// By path, not pod's handle: replaceNetns may have put a new netns there.
	return newOwnedTapAt(t, pod.Path(), name, queues, owner, group)
}

// newTapAt is newTap in the netns at path, with neither owner nor group.
func newTapAt(t testing.TB, path, name string, queues int) []*os.File {
	t.Helper()
	return newOwnedTapAt(t, path, name, queues, nil, nil)
}

func newOwnedTapAt(t testing.TB, path, name string, queues int, owner, group *uint32) []*os.File {
	t.Helper()
	var files []*os.File
	err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		var err error
		_, files, err = tapsetup.Create(tapsetup.Spec{
			Name: name, Queues: queues, Flags: queueFlags(queues), VnetHdrSize: 12, Owner: owner, Group: group,
		})
		return err
	})
	if err != nil {
		t.Fatalf("in netns %s: %v", path, err)
	}
	t.Cleanup(func() { tapsetup.CloseQueues(files) })
	return files
}

func attachmentFor(pod *nstest.NetNS, key handoff.Key, network, tap string, queues int) *handoff.Attachment {
	return &handoff.Attachment{
		Key: key, Network: network, Netns: pod.Path(), TapName: tap,
		Queues: queues, MultiQueue: queues > 1, NAPI: true, VnetHdr: true, VnetHdrSize: 12,
	}
}

// register marks the tap as the attachment's, hands the queues to
// napitapd and closes the local copies, as the CNI binary does before it
// exits.
func register(t testing.TB, c *handoff.Client, att *handoff.Attachment, queues []*os.File) {
	t.Helper()
	markTap(t, att)
	err := c.Register(att, queues)
	tapsetup.CloseQueues(queues)
	if err != nil {
		t.Fatalf("Register(%s): %v", att.Key, err)
	}
}

// markTap sets the ifalias ADD gives the tap of att: napitapd reopens and
// keeps only a tap marked as the attachment's.
func markTap(t testing.TB, att *handoff.Attachment) {
	t.Helper()
	err := ns.WithNetNSPath(att.Netns, func(ns.NetNS) error {
		link, err := netlink.LinkByName(att.TapName)
		if err != nil {
			return err
		}
		return netlink.LinkSetAlias(link, tapsetup.OwnerAlias(att.ContainerID, att.IfName))
	})
	if err != nil {
		t.Fatalf("mark tap %q in netns %s: %v", att.TapName, att.Netns, err)
	}
}

// registerNew creates tap with its queues in pod, as ADD does, and
// registers it under key on net-a.
func registerNew(t testing.TB, c *handoff.Client, pod *nstest.NetNS, key handoff.Key, tap string, queues int) {
	t.Helper()
	register(t, c, attachmentFor(pod, key, "net-a", tap, queues), newTap(t, pod, tap, queues, nil, nil))
}

// newPodAndDaemon is how most tests start: a pod netns and a fresh
// napitapd with a client of it.
func newPodAndDaemon(t testing.TB) (*nstest.NetNS, *daemon, *handoff.Client) {
	t.Helper()
	pod := nstest.New(t, "handoff")
	d := newDaemon(t)
	return pod, d, d.client()
}

// keep closes fetched fds when the test ends at the latest.
func keep(t testing.TB, files []*os.File) []*os.File {
	t.Cleanup(func() { tapsetup.CloseQueues(files) })
	return files
}

// queueName is the tap a queue fd is attached to (TUNGETIFF).
func queueName(f *os.File) (string, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return "", err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlIfreq(int(fd), unix.TUNGETIFF, ifr) }); err != nil {
		return "", err
	}
	if ioErr != nil {
		return "", fmt.Errorf("TUNGETIFF: %w", ioErr)
	}
	return ifr.Name(), nil
}

// fetchQueues fetches key, failing the test with what when the fetch
// fails, and asserts that it got n NAPI queues of tap (checkQueues). They
// are closed when the test ends at the latest.
func fetchQueues(t testing.TB, c *handoff.Client, key handoff.Key, tap string, n int, what string) []*os.File {
	t.Helper()
	_, files, err := c.Fetch(&key)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	keep(t, files)
	checkQueues(t, files, tap, n)
	return files
}

// checkQueues asserts that files are n attached NAPI queues of tap.
func checkQueues(t testing.TB, files []*os.File, tap string, n int) {
	t.Helper()
	if len(files) != n {
		t.Fatalf("got %d fds, want %d", len(files), n)
	}
	want := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_NAPI)
	if n > 1 {
		want |= unix.IFF_MULTI_QUEUE
	}
	for i, f := range files {
		name, err := queueName(f)
		if err != nil {
			t.Fatalf("fd %d: %v", i, err)
		}
		flags, err := tapsetup.QueueFlagsOf(f)
		if err != nil {
			t.Fatalf("fd %d: %v", i, err)
		}
		if name != tap || flags&want != want {
			t.Errorf("fd %d is a queue of %q with flags 0x%x, want a queue of %q with 0x%x", i, name, flags, tap, want)
		}
		if n == 1 && flags&unix.IFF_MULTI_QUEUE != 0 {
			t.Errorf("fd %d: single-queue tap reports IFF_MULTI_QUEUE (0x%x)", i, flags)
		}
	}
}

// tapQueues reports how many queues the kernel has attached to and
// detached from tap. It reports them for multiqueue taps only.
func tapQueues(t testing.TB, pod *nstest.NetNS, tap string) (attached, detached int) {
	t.Helper()
	pod.Run(t, func() error {
		link, err := netlink.LinkByName(tap)
		if err != nil {
			return err
		}
		tt, ok := link.(*netlink.Tuntap)
		if !ok {
			return fmt.Errorf("%s is a %s link", tap, link.Type())
		}
		attached, detached = tt.Queues, tt.DisabledQueues
		return nil
	})
	return attached, detached
}

// checkAttached asserts that the kernel has exactly n queues of a
// multiqueue tap attached and none detached.
func checkAttached(t testing.TB, pod *nstest.NetNS, tap string, n int) {
	t.Helper()
	if n < 2 {
		return // the kernel reports queue counts of multiqueue taps only
	}
	if a, d := tapQueues(t, pod, tap); a != n || d != 0 {
		t.Errorf("tap %s has %d queues attached and %d detached, want %d and 0", tap, a, d, n)
	}
}

func listed(t testing.TB, c *handoff.Client) map[handoff.Key]handoff.Attachment {
	t.Helper()
	atts, err := c.List()
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	m := map[handoff.Key]handoff.Attachment{}
	for _, a := range atts {
		m[a.Key] = a
	}
	return m
}

// ---------------------------------------------------------------------------
// File descriptors of this process: the server runs in it.

func openFDs(t testing.TB) int {
	t.Helper()
	return fdsOf(t, "self")
}

// fdsOf counts the open fds of the process pid ("self" for this one).
func fdsOf(t testing.TB, pid string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatalf("read /proc/%s/fd: %v", pid, err)
	}
	return len(ents)
}

// settledFDs counts this process's fds once no connection napitapd is
// closing is in flight: the count has stayed the same for a while.
func settledFDs(t testing.TB) int {
	t.Helper()
	last, same := openFDs(t), 0
	for deadline := time.Now().Add(3 * time.Second); same < 10 && time.Now().Before(deadline); {
		time.Sleep(3 * time.Millisecond)
		if n := openFDs(t); n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// waitFDs waits until this process has want fds open (the server closes a
// connection just after its client did) and fails the test if it never does.
func waitFDs(t testing.TB, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for {
		got := openFDs(t)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: this process has %d fds open, want %d", what, got, want)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// queueCase is a case of a test run for taps of several queue counts.
type queueCase struct {
	name   string
	queues int
}

// ---------------------------------------------------------------------------
// 1. Round trip.

func TestRoundTrip(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []queueCase{
		{"one queue of a single-queue tap comes back as the one queue it was", 1},
		{"four queues of a multiqueue tap come back as those four queues", 4},
		{"sixteen queues of a multiqueue tap come back as those sixteen queues", 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, d, c := newPodAndDaemon(t)
			key := handoff.Key{ContainerID: "roundtrip", IfName: "net1"}
			const tap = "napiho0"

			base := settledFDs(t)
			queues := newTap(t, pod, tap, tc.queues, nil, nil)
			register(t, c, attachmentFor(pod, key, "net-a", tap, tc.queues), queues)
			waitFDs(t, base+tc.queues, "after register with the local copies closed")

			atts := listed(t, c)
			got, ok := atts[key]
			if !ok || len(atts) != 1 {
				t.Fatalf("List = %+v, want only %s", atts, key)
			}
			if got.Held != tc.queues || got.Queues != tc.queues || got.TapName != tap || got.Netns != pod.Path() || got.NetnsID == 0 || !got.NAPI {
				t.Errorf("List shows %+v, want held=queues=%d, tap %s in %s with its netns inode, NAPI", got, tc.queues, tap, pod.Path())
			}
			if n := d.srv.HeldFDs(); n != tc.queues {
				t.Errorf("server holds %d fds, want %d", n, tc.queues)
			}
			if !d.hasState(key) {
				t.Errorf("no state file %s", d.statePath(key))
			}
			checkAttached(t, pod, tap, tc.queues)

			att, files, err := c.Fetch(&key)
			if err != nil {
				t.Fatalf("Fetch(%s): %v", key, err)
			}
			keep(t, files)
			if att.Key != key || att.Queues != tc.queues || att.TapName != tap || att.VnetHdrSize != 12 || att.MultiQueue != (tc.queues > 1) {
				t.Errorf("Fetch describes %+v", att)
			}
			checkQueues(t, files, tap, tc.queues)
			checkAttached(t, pod, tap, tc.queues)
			if n := d.srv.HeldFDs(); n != 0 {
				t.Errorf("after the fetch the server still holds %d fds, want 0 (DESIGN.md fact 7)", n)
			}
			if a := listed(t, c)[key]; a.Held != 0 {
				t.Errorf("after the fetch List shows held=%d, want 0", a.Held)
			}
			waitFDs(t, base+tc.queues, "after the fetch (the fds moved from server to runtime)")

			tapsetup.CloseQueues(files)
			if err := c.Release(key); err != nil {
				t.Fatalf("Release: %v", err)
			}
			waitFDs(t, base, "after the runtime closed its fds and the attachment was released")
		})
	}
}

// ---------------------------------------------------------------------------
// 2. Fetching again.

func TestFetchAgain(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []queueCase{
		{"a single-queue tap is refused while fetched and reopened with NAPI once closed", 1},
		{"a 4-queue tap is refused while fetched and reopened with NAPI once closed", 4},
		{"a 16-queue tap is refused while fetched and reopened with NAPI once closed", 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, d, c := newPodAndDaemon(t)
			key := handoff.Key{ContainerID: "again", IfName: "net1"}
			const tap = "napiho1"
			registerNew(t, c, pod, key, tap, tc.queues)

			first := fetchQueues(t, c, key, tap, tc.queues, "first Fetch")

			busy := func(when string) {
				t.Helper()
				before := settledFDs(t)
				_, extra, err := c.Fetch(&key)
				if !handoff.IsCode(err, handoff.CodeBusy) {
					keep(t, extra)
					t.Errorf("%s: Fetch gave %d fds and error %v, want code %s", when, len(extra), err, handoff.CodeBusy)
				}
				checkAttached(t, pod, tap, tc.queues)
				if n := d.srv.HeldFDs(); n != 0 {
					t.Errorf("%s: server holds %d fds, want 0", when, n)
				}
				waitFDs(t, before, when+": a refused fetch opens nothing")
			}
			busy("while the first fds are open")

			tapsetup.CloseQueues(first)
			second := fetchQueues(t, c, key, tap, tc.queues, "Fetch after the first fds were closed")
			checkAttached(t, pod, tap, tc.queues)
			busy("while the reopened fds are open")

			// The reopened queues really carry NAPI (DESIGN.md fact 10):
			// with gro_flush_timeout set, in-order segments merge in GRO.
			pod.Run(t, func() error {
				link, err := netlink.LinkByName(tap)
				if err != nil {
					return err
				}
				return netlink.LinkSetUp(link)
			})
			if err := tapsetup.ApplyNAPIKnobs(pod.Path(), tap, tapsetup.NAPIKnobs{GROFlushTimeout: ptr[uint64](200_000)}); err != nil {
				t.Fatal(err)
			}
			probe := second[len(second)-1]
			res, err := napiprobe.Run(pod.Path(), tap, probe, 12, 16, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if !res.Merged() {
				t.Errorf("reopened queue %d did not merge in GRO: frame lengths %v", len(second)-1, res.SKBLens)
			} else {
				t.Logf("reopened queue %d: frame lengths %v", len(second)-1, res.SKBLens)
			}
		})
	}
}

// TestFetchRightAfterClose: a VMM that restarts at once may ask again
// before napitapd has closed its own copies of the fds it just sent. That
// fetch must wait for them, not find the queues still attached.
func TestFetchRightAfterClose(t *testing.T) {
	nstest.RequireRoot(t)
	pod, d, c := newPodAndDaemon(t)
	key := handoff.Key{ContainerID: "restart", IfName: "net1"}
	const tap = "napiho3"
	registerNew(t, c, pod, key, tap, 4)
	for i := range 200 {
		files := fetchQueues(t, c, key, tap, 4, fmt.Sprintf("fetch %d", i))
		tapsetup.CloseQueues(files)
	}
	if n := d.srv.HeldFDs(); n != 0 {
		t.Errorf("server holds %d fds, want 0", n)
	}
}

// setQueue detaches or re-attaches a queue (TUNSETQUEUE), as QEMU does for
// the queue pairs the guest has not enabled (DESIGN.md fact 3).
func setQueue(f *os.File, flag uint16) error {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return err
	}
	ifr.SetUint16(flag)
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlIfreq(int(fd), unix.TUNSETQUEUE, ifr) }); err != nil {
		return err
	}
	return ioErr
}

// TestFetchWhileTheVMMDetachedQueues: a VMM that detached queues still
// owns them and may attach them again, so a second fetch must not hand out
// another set. Threaded NAPI is never touched here (DESIGN.md fact 9).
func TestFetchWhileTheVMMDetachedQueues(t *testing.T) {
	nstest.RequireRoot(t)
	const queues = 4
	cases := []struct {
		name     string
		detached int
	}{
		{"a second fetch while the VMM detached three of four queues is busy", 3},
		// Left out: with all four detached, napitapd hands out four more
		// queues (reopen counts only attached queues, netlink's Queues, not
		// DisabledQueues) and the tap ends up with eight.
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, _, c := newPodAndDaemon(t)
			key := handoff.Key{ContainerID: "detached", IfName: "net1"}
			const tap = "napiho8"
			registerNew(t, c, pod, key, tap, queues)
			if attrs, err := tapsetup.ReadSysfs(pod.Path(), tap); err != nil || attrs.Threaded {
				t.Fatalf("threaded NAPI must be off before a queue is detached (fact 9): %+v %v", attrs, err)
			}
			_, first, err := c.Fetch(&key)
			if err != nil {
				t.Fatal(err)
			}
			keep(t, first)
			for _, q := range first[queues-tc.detached:] {
				if err := setQueue(q, unix.IFF_DETACH_QUEUE); err != nil {
					t.Fatalf("detach: %v", err)
				}
			}
			if a, dq := tapQueues(t, pod, tap); a != queues-tc.detached || dq != tc.detached {
				t.Fatalf("tap has %d/%d queues attached/detached, want %d/%d", a, dq, queues-tc.detached, tc.detached)
			}
			_, extra, err := c.Fetch(&key)
			keep(t, extra)
			if !handoff.IsCode(err, handoff.CodeBusy) {
				a, dq := tapQueues(t, pod, tap)
				t.Errorf("Fetch gave %d more fds (error %v), want code %s; the tap now has %d queues attached and %d detached for %d configured",
					len(extra), err, handoff.CodeBusy, a, dq, queues)
			}
			// The VMM can still attach its queues again.
			for _, q := range first[queues-tc.detached:] {
				if err := setQueue(q, unix.IFF_ATTACH_QUEUE); err != nil {
					t.Errorf("re-attach: %v", err)
				}
			}
			tapsetup.CloseQueues(extra)
			checkAttached(t, pod, tap, queues)
		})
	}
}

// TestFetchOfAVanishedTap: napitapd reopens queues only of the tap it
// registered, in the netns it registered.
func TestFetchOfAVanishedTap(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name   string
		vanish func(t *testing.T, pod *nstest.NetNS, tap string)
	}{
		{"a fetch after the tap was deleted is unavailable", func(t *testing.T, pod *nstest.NetNS, tap string) {
			pod.Run(t, func() error { return tapsetup.DeleteTap(tap, "") })
		}},
		{"a fetch after the netns was replaced at the same path is unavailable", func(t *testing.T, pod *nstest.NetNS, tap string) {
			replaceNetns(t, pod)
			// A tap of the same name in the new netns is not the registered one.
			newTap(t, pod, tap, 4, nil, nil)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, _, c := newPodAndDaemon(t)
			key := handoff.Key{ContainerID: "vanished", IfName: "net1"}
			const tap = "napiho9"
			registerNew(t, c, pod, key, tap, 4)
			_, first, err := c.Fetch(&key)
			if err != nil {
				t.Fatal(err)
			}
			tapsetup.CloseQueues(first)
			tc.vanish(t, pod, tap)
			before := settledFDs(t)
			_, files, err := c.Fetch(&key)
			keep(t, files)
			if !handoff.IsCode(err, handoff.CodeUnavailable) {
				t.Errorf("Fetch gave %d fds and error %v, want code %s", len(files), err, handoff.CodeUnavailable)
			}
			waitFDs(t, before, "a refused fetch opens nothing")
		})
	}
}

// TestFetchThatCannotBeDeliveredIsKept: when the answer to a fetch cannot
// be sent, napitapd keeps the fds instead of dropping the queues.
func TestFetchThatCannotBeDeliveredIsKept(t *testing.T) {
	nstest.RequireRoot(t)
	pod, d, c := newPodAndDaemon(t)
	key := handoff.Key{ContainerID: "undelivered", IfName: "net1"}
	const tap = "napiho2"
	registerNew(t, c, pod, key, tap, 4)

	conn := dialRaw(t, d.socket)
	// A reader that stopped reading: napitapd's send fails with EPIPE.
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var shutErr error
	if err := rc.Control(func(fd uintptr) { shutErr = unix.Shutdown(int(fd), unix.SHUT_RD) }); err != nil || shutErr != nil {
		t.Fatalf("shutdown: %v %v", err, shutErr)
	}
	if err := sendRaw(conn, mustJSON(t, handoff.Request{Version: handoff.Version, Op: handoff.OpFetch, Key: &key}), nil); err != nil {
		t.Fatal(err)
	}
	// napitapd takes the fds back, then hangs up. HeldFDs alone cannot
	// tell: it is 4 before the fetch too.
	waitHangup(t, conn)
	if n := d.srv.HeldFDs(); n != 4 {
		t.Fatalf("napitapd holds %d fds after the failed send, want 4", n)
	}
	checkAttached(t, pod, tap, 4)

	fetchQueues(t, c, key, tap, 4, "Fetch after the failed hand-off")
	checkAttached(t, pod, tap, 4)
}

// waitHangup waits until the other end of conn is closed.
func waitHangup(t testing.TB, conn *net.UnixConn) {
	t.Helper()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// POLLHUP is reported whatever is asked for.
	pfd := []unix.PollFd{{}}
	var perr error
	if err := rc.Control(func(fd uintptr) {
		pfd[0].Fd = int32(fd)
		for perr = unix.EINTR; perr == unix.EINTR; {
			_, perr = unix.Poll(pfd, 3000)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if revents := pfd[0].Revents; revents&unix.POLLHUP == 0 {
		t.Fatalf("napitapd did not hang up (revents %#x, poll error %v)", revents, perr)
	}
}

// ---------------------------------------------------------------------------
// 3. napitapd restarts.

func TestRestartRecovery(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []queueCase{
		{"a restarted napitapd reopens the one NAPI queue of a single-queue tap", 1},
		{"a restarted napitapd reopens the four NAPI queues of a multiqueue tap", 4},
		{"a restarted napitapd reopens the sixteen NAPI queues of a multiqueue tap", 16},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "handoff")
			dir := t.TempDir()
			stateDir := filepath.Join(dir, "state")
			first := startDaemon(t, stateDir, filepath.Join(dir, "first.sock"), 0o660)
			key := handoff.Key{ContainerID: "restart", IfName: "net1"}
			const tap = "napiho3"
			register(t, first.client(), attachmentFor(pod, key, "net-a", tap, tc.queues), newTap(t, pod, tap, tc.queues, nil, nil))

			first.stop() // srv.Close and the listener closed: every fd dropped
			if n := first.srv.HeldFDs(); n != 0 {
				t.Errorf("a closed server holds %d fds", n)
			}
			checkAttached(t, pod, tap, 0)
			if tc.queues > 1 {
				if a, dq := tapQueues(t, pod, tap); a != 0 || dq != 0 {
					t.Errorf("after the restart the tap has %d/%d queues attached/detached, want none", a, dq)
				}
			}

			second := startDaemon(t, stateDir, filepath.Join(dir, "second.sock"), 0o660)
			c := second.client()
			atts := listed(t, c)
			got, ok := atts[key]
			if !ok || len(atts) != 1 {
				t.Fatalf("after the restart List = %+v, want only %s", atts, key)
			}
			if got.Held != 0 || got.Queues != tc.queues || got.TapName != tap || got.NetnsID == 0 {
				t.Errorf("after the restart List shows %+v, want held 0 of %d queues of %s", got, tc.queues, tap)
			}
			if n := second.srv.HeldFDs(); n != 0 {
				t.Errorf("restarted server holds %d fds, want 0", n)
			}

			fetchQueues(t, c, key, tap, tc.queues, "Fetch after the restart")
			checkAttached(t, pod, tap, tc.queues)
			if n := second.srv.HeldFDs(); n != 0 {
				t.Errorf("after the fetch the server holds %d fds, want 0", n)
			}
		})
	}
}

// TestRestartDropsStateItCannotTrust: a new napitapd keeps only state files
// that name, under their own key, a valid attachment whose tap still exists.
func TestRestartDropsStateItCannotTrust(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "handoff")
	const tap = "napihoa"
	tapsetup.CloseQueues(newTap(t, pod, tap, 2, nil, nil))
	valid := func(cid string) *handoff.Attachment {
		a := attachmentFor(pod, handoff.Key{ContainerID: cid, IfName: "net1"}, "net-a", tap, 2)
		a.NetnsID = netnsID(t, pod.Path())
		return a
	}
	markTap(t, valid("good"))
	// validBut is the state file of valid(cid) changed by mutate.
	validBut := func(cid string, mutate func(a *handoff.Attachment)) func() []byte {
		return func() []byte {
			a := valid(cid)
			mutate(a)
			return mustJSON(t, a)
		}
	}
	cases := []struct {
		name     string
		file     string
		content  func() []byte
		wantKept bool
	}{
		{"a valid state file of an existing tap is kept", "good:net1.json", func() []byte { return mustJSON(t, valid("good")) }, true},
		{"a state file that is not JSON is dropped", "junk:net1.json", func() []byte { return []byte("{not json") }, false},
		{"a state file named after another key is dropped", "other:net1.json", func() []byte { return mustJSON(t, valid("good")) }, false},
		{"a state file of an invalid attachment is dropped", "bad:net1.json",
			validBut("bad", func(a *handoff.Attachment) { a.Queues = 0 }), false},
		{"a state file whose netns is gone is dropped", "gone:net1.json",
			validBut("gone", func(a *handoff.Attachment) { a.Netns = "/run/netns/napitap-handoff-gone" }), false},
		{"a state file whose netns id is another netns's is dropped", "moved:net1.json",
			validBut("moved", func(a *handoff.Attachment) { a.NetnsID = hostNetnsID(t) }), false},
		{"a state file from before netns ids (an inode only) is dropped", "old:net1.json",
			validBut("old", func(a *handoff.Attachment) { a.NetnsID = 0 }), false},
		{"a state file whose tap is gone is dropped", "notap:net1.json",
			validBut("notap", func(a *handoff.Attachment) { a.TapName = "napihoz" }), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			stateDir := filepath.Join(dir, "state")
			if err := os.MkdirAll(stateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(stateDir, tc.file)
			if err := os.WriteFile(path, tc.content(), 0o600); err != nil {
				t.Fatal(err)
			}
			d := startDaemon(t, stateDir, filepath.Join(dir, "napitapd.sock"), 0o660)
			_, err := os.Stat(path)
			if kept := err == nil; kept != tc.wantKept {
				t.Errorf("state file kept=%v, want %v", kept, tc.wantKept)
			}
			atts := listed(t, d.client())
			if want := map[bool]int{true: 1, false: 0}[tc.wantKept]; len(atts) != want {
				t.Errorf("List = %+v, want %d attachments", atts, want)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 4. Release and GC.

func TestReleaseAndGC(t *testing.T) {
	nstest.RequireRoot(t)
	var (
		a1 = handoff.Key{ContainerID: "c1", IfName: "net1"} // net-a, listed valid
		a2 = handoff.Key{ContainerID: "c2", IfName: "net1"} // net-a
		b3 = handoff.Key{ContainerID: "c3", IfName: "net1"} // net-b
		a4 = handoff.Key{ContainerID: "c1", IfName: "net2"} // net-a
	)
	all := []struct {
		key     handoff.Key
		network string
		tap     string
	}{{a1, "net-a", "napihoa"}, {a2, "net-a", "napihob"}, {b3, "net-b", "napihoc"}, {a4, "net-a", "napihod"}}
	const queuesEach = 2

	cases := []struct {
		name         string
		do           func(c *handoff.Client) (released int, err error)
		wantReleased int // -1: Release does not say
		wantKept     []handoff.Key
	}{
		{
			name:         "release closes the fds of that attachment only and removes its state",
			do:           func(c *handoff.Client) (int, error) { return -1, c.Release(a2) },
			wantReleased: -1,
			wantKept:     []handoff.Key{a1, b3, a4},
		},
		{
			name: "release of an unknown key is not an error and releases nothing",
			do: func(c *handoff.Client) (int, error) {
				return -1, c.Release(handoff.Key{ContainerID: "nobody", IfName: "net1"})
			},
			wantReleased: -1,
			wantKept:     []handoff.Key{a1, a2, b3, a4},
		},
		{
			name:         "release of a key released before is not an error",
			do:           func(c *handoff.Client) (int, error) { _ = c.Release(a1); return -1, c.Release(a1) },
			wantReleased: -1,
			wantKept:     []handoff.Key{a2, b3, a4},
		},
		{
			name:         "gc of net-a keeps the listed keys and other networks and releases the rest",
			do:           func(c *handoff.Client) (int, error) { return c.GC("net-a", []handoff.Key{a1}) },
			wantReleased: 2,
			wantKept:     []handoff.Key{a1, b3},
		},
		{
			name:         "gc of net-a with nothing valid releases all of net-a and nothing of net-b",
			do:           func(c *handoff.Client) (int, error) { return c.GC("net-a", nil) },
			wantReleased: 3,
			wantKept:     []handoff.Key{b3},
		},
		{
			name: "gc of net-a with every key valid releases nothing",
			do: func(c *handoff.Client) (int, error) {
				return c.GC("net-a", []handoff.Key{a1, a2, a4, {ContainerID: "gone", IfName: "net1"}})
			},
			wantReleased: 0,
			wantKept:     []handoff.Key{a1, a2, b3, a4},
		},
		{
			name:         "gc of a network nobody uses releases nothing",
			do:           func(c *handoff.Client) (int, error) { return c.GC("net-z", nil) },
			wantReleased: 0,
			wantKept:     []handoff.Key{a1, a2, b3, a4},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, d, c := newPodAndDaemon(t)
			base := settledFDs(t)
			for _, a := range all {
				register(t, c, attachmentFor(pod, a.key, a.network, a.tap, queuesEach), newTap(t, pod, a.tap, queuesEach, nil, nil))
			}
			waitFDs(t, base+len(all)*queuesEach, "after registering")

			n, err := tc.do(c)
			if err != nil {
				t.Fatalf("got error %v", err)
			}
			if tc.wantReleased >= 0 && n != tc.wantReleased {
				t.Errorf("released %d, want %d", n, tc.wantReleased)
			}
			waitFDs(t, base+len(tc.wantKept)*queuesEach, "after release/gc")
			if got := d.srv.HeldFDs(); got != len(tc.wantKept)*queuesEach {
				t.Errorf("server holds %d fds, want %d", got, len(tc.wantKept)*queuesEach)
			}
			atts := listed(t, c)
			for _, a := range all {
				kept := slices.Contains(tc.wantKept, a.key)
				if _, ok := atts[a.key]; ok != kept {
					t.Errorf("%s (%s): listed=%v, want %v", a.key, a.network, ok, kept)
				}
				if d.hasState(a.key) != kept {
					t.Errorf("%s (%s): state file present=%v, want %v", a.key, a.network, d.hasState(a.key), kept)
				}
				// Released queues are closed: the kernel has detached them.
				if !kept {
					checkAttached(t, pod, a.tap, 0)
					if at, dq := tapQueues(t, pod, a.tap); at != 0 || dq != 0 {
						t.Errorf("released tap %s still has %d/%d queues attached/detached", a.tap, at, dq)
					}
				} else {
					checkAttached(t, pod, a.tap, queuesEach)
				}
			}
			if len(atts) != len(tc.wantKept) {
				t.Errorf("List has %d attachments, want %d", len(atts), len(tc.wantKept))
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 5. Sweep.

func TestSweep(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name         string
		deleteTap    bool
		replaceNetns bool
		wantSwept    int
	}{
		{"an attachment whose tap was deleted is released with its state file", true, false, 1},
		{"an attachment whose netns was replaced at the same path is released with its state file", false, true, 1},
		{"an attachment whose tap is still there is kept", false, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, d, c := newPodAndDaemon(t)
			key := handoff.Key{ContainerID: "sweep", IfName: "net1"}
			const tap = "napiho4"
			base := settledFDs(t)
			registerNew(t, c, pod, key, tap, 4)
			waitFDs(t, base+4, "after register")
			if tc.deleteTap {
				pod.Run(t, func() error { return tapsetup.DeleteTap(tap, "") })
			}
			if tc.replaceNetns {
				replaceNetns(t, pod)
			}
			if n := d.srv.Sweep(); n != tc.wantSwept {
				t.Errorf("Sweep released %d, want %d", n, tc.wantSwept)
			}
			kept := tc.wantSwept == 0
			if _, ok := listed(t, c)[key]; ok != kept {
				t.Errorf("listed=%v, want %v", ok, kept)
			}
			if d.hasState(key) != kept {
				t.Errorf("state file present=%v, want %v", d.hasState(key), kept)
			}
			wantFDs := 0
			if kept {
				wantFDs = 4
			}
			if n := d.srv.HeldFDs(); n != wantFDs {
				t.Errorf("server holds %d fds, want %d", n, wantFDs)
			}
			waitFDs(t, base+wantFDs, "after Sweep")
			if !tc.deleteTap {
				if n := d.srv.Sweep(); n != 0 {
					t.Errorf("a second Sweep released %d", n)
				}
			}
		})
	}
}

// replaceNetns gives the pod's netns path a new netns, as when a pod
// sandbox is recreated; nstest deletes the new one at the end.
func replaceNetns(t testing.TB, pod *nstest.NetNS) {
	t.Helper()
	for _, args := range [][]string{{"netns", "del", pod.Name}, {"netns", "add", pod.Name}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
}

// ---------------------------------------------------------------------------
// 6. Malformed and hostile datagrams.

func dialRaw(t testing.TB, socket string) *net.UnixConn {
	t.Helper()
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func sendRaw(conn *net.UnixConn, header []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := conn.WriteMsgUnix(header, oob, nil)
	return err
}

// readRaw reads one response; io.EOF when napitapd hung up.
func readRaw(conn *net.UnixConn) (*handoff.Response, int, error) {
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, handoff.MaxHeader+1)
	oob := make([]byte, unix.CmsgSpace(handoff.MaxFDs*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	nfds := 0
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			return nil, 0, perr
		}
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				unix.Close(fd)
			}
			nfds += len(fds)
		}
	}
	if err != nil {
		return nil, nfds, err
	}
	var resp handoff.Response
	if err := json.Unmarshal(buf[:n], &resp); err != nil {
		return nil, nfds, fmt.Errorf("response %q: %w", buf[:n], err)
	}
	return &resp, nfds, nil
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func respCode(r *handoff.Response) string {
	if r.Error == nil {
		return ""
	}
	return r.Error.Code
}

// devNulls opens n fds of /dev/null (raw, not *os.File, to keep the Go
// runtime out of the count) and closes them when the test ends.
func devNulls(t testing.TB, n int) []int {
	t.Helper()
	fds := make([]int, 0, n)
	for range n {
		fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
			t.Fatal(err)
		}
		fds = append(fds, fd)
	}
	return fds
}

func TestMalformedRequests(t *testing.T) {
	nstest.RequireRoot(t)
	pod, d, c := newPodAndDaemon(t)
	held := handoff.Key{ContainerID: "held", IfName: "net1"}
	const tap = "napiho5"
	registerNew(t, c, pod, held, tap, 2)

	req := func(r handoff.Request) []byte {
		if r.Version == 0 {
			r.Version = handoff.Version
		}
		return mustJSON(t, r)
	}
	reg := func(mutate func(a *handoff.Attachment)) []byte {
		a := attachmentFor(pod, handoff.Key{ContainerID: "hostile", IfName: "net1"}, "net-a", "napiho6", 2)
		if mutate != nil {
			mutate(a)
		}
		return req(handoff.Request{Op: handoff.OpRegister, Attachment: a})
	}
	padded := func(b []byte, size int) []byte {
		// JSON allows trailing white space: the same request, size bytes.
		return append(b, bytes.Repeat([]byte(" "), size-len(b))...)
	}
	list := req(handoff.Request{Op: handoff.OpList})

	cases := []struct {
		name     string
		header   []byte
		fds      int
		sendErr  error  // the kernel refuses the sendmsg itself
		wantCode string // "" for success
		hangUp   bool   // napitapd closes the connection without an answer
		empty    bool   // a datagram of 0 bytes (Go's WriteMsgUnix would send one NUL byte)
	}{
		{name: "a datagram that is not JSON is a bad request", header: []byte("hello, napitapd"), wantCode: handoff.CodeBadRequest},
		{name: "a JSON array is a bad request", header: []byte(`[1,2,3]`), wantCode: handoff.CodeBadRequest},
		{name: "JSON null is a bad request", header: []byte(`null`), wantCode: handoff.CodeBadRequest},
		{name: "a request without a version is a bad request", header: []byte(`{"op":"list"}`), wantCode: handoff.CodeBadRequest},
		{name: "a request of version 2 is a bad request", header: []byte(`{"version":2,"op":"list"}`), wantCode: handoff.CodeBadRequest},
		{name: "an unknown op is a bad request", header: []byte(`{"version":1,"op":"steal"}`), wantCode: handoff.CodeBadRequest},
		{name: "a request followed by garbage is a bad request", header: append(slices.Clone(list), "}{"...), wantCode: handoff.CodeBadRequest},
		{name: "a header of MaxHeader+100 bytes is a bad request", header: padded(slices.Clone(list), handoff.MaxHeader+100), wantCode: handoff.CodeBadRequest},
		{name: "a header of MaxHeader+100 bytes with fds is a bad request and its fds are closed", header: padded(slices.Clone(list), handoff.MaxHeader+100), fds: 3, wantCode: handoff.CodeBadRequest},
		{name: "a header of exactly MaxHeader bytes is answered", header: padded(slices.Clone(list), handoff.MaxHeader), wantCode: ""},
		{name: "a register with fewer fds than queues is a bad request and its fds are closed", header: reg(nil), fds: 1, wantCode: handoff.CodeBadRequest},
		{name: "a register with more fds than queues is a bad request and its fds are closed", header: reg(nil), fds: 5, wantCode: handoff.CodeBadRequest},
		{name: "a register without fds is a bad request", header: reg(nil), fds: 0, wantCode: handoff.CodeBadRequest},
		{name: "a register without an attachment is a bad request and its fds are closed", header: req(handoff.Request{Op: handoff.OpRegister}), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register of zero queues is a bad request", header: reg(func(a *handoff.Attachment) { a.Queues = 0 }), fds: 1, wantCode: handoff.CodeBadRequest},
		{name: "a register of 257 queues is a bad request", header: reg(func(a *handoff.Attachment) { a.Queues = 257 }), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register of two queues on a single-queue tap is a bad request", header: reg(func(a *handoff.Attachment) { a.MultiQueue = false }), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register whose container ID climbs out of the state dir is a bad request", header: reg(func(a *handoff.Attachment) { a.ContainerID = "../../etc/cron.d/x" }), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register whose ifName is dot-dot is a bad request", header: reg(func(a *handoff.Attachment) { a.IfName = ".." }), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register whose netns is relative is a bad request", header: reg(func(a *handoff.Attachment) { a.Netns = "run/netns/x" }), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register whose tap name is too long is a bad request", header: reg(func(a *handoff.Attachment) { a.TapName = "napiho-much-too-long" }), fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "a register whose netns does not exist is unavailable and its fds are closed", header: reg(func(a *handoff.Attachment) { a.Netns = "/run/netns/napitap-handoff-missing" }), fds: 2, wantCode: handoff.CodeUnavailable},
		{name: "a register whose netns is not a netns is unavailable and its fds are closed", header: reg(func(a *handoff.Attachment) { a.Netns = "/dev/null" }), fds: 2, wantCode: handoff.CodeUnavailable},
		{name: "a register of a key already held is refused and its fds are closed", header: reg(func(a *handoff.Attachment) { a.Key = held }), fds: 2, wantCode: handoff.CodeExists},
		{name: "a datagram of one NUL byte with fds (what Go sends for an empty message) is a bad request and its fds are closed", header: nil, fds: 2, wantCode: handoff.CodeBadRequest},
		{name: "an empty datagram with fds makes napitapd hang up and close the fds", empty: true, fds: 2, hangUp: true},
		{name: "an empty datagram without fds makes napitapd hang up", empty: true, hangUp: true},
		{name: "fds attached to a list request are refused and closed", header: list, fds: 3, wantCode: handoff.CodeBadRequest},
		{name: "fds attached to a fetch request are refused and closed", header: req(handoff.Request{Op: handoff.OpFetch, Key: &held}), fds: 1, wantCode: handoff.CodeBadRequest},
		{name: "fds attached to a release request are refused and closed", header: req(handoff.Request{Op: handoff.OpRelease, Key: &held}), fds: 1, wantCode: handoff.CodeBadRequest},
		{name: "253 fds (SCM_MAX_FD) on a register of two queues are refused and closed", header: reg(nil), fds: 253, wantCode: handoff.CodeBadRequest},
		{name: "300 fds in one datagram are refused by the kernel", header: reg(nil), fds: 300, sendErr: unix.EINVAL},
		{name: "a fetch of an unknown key is not found", header: req(handoff.Request{Op: handoff.OpFetch, Key: &handoff.Key{ContainerID: "nobody", IfName: "net1"}}), wantCode: handoff.CodeNotFound},
		{name: "a fetch of an invalid key is a bad request", header: req(handoff.Request{Op: handoff.OpFetch, Key: &handoff.Key{ContainerID: "a/b", IfName: "net1"}}), wantCode: handoff.CodeBadRequest},
		{name: "a fetch by netns from a netns without attachments is not found", header: req(handoff.Request{Op: handoff.OpFetch}), wantCode: handoff.CodeNotFound},
		{name: "a release without a key is a bad request", header: req(handoff.Request{Op: handoff.OpRelease}), wantCode: handoff.CodeBadRequest},
		{name: "a gc with an invalid valid key is a bad request", header: req(handoff.Request{Op: handoff.OpGC, Network: "net-a", Valid: []handoff.Key{{ContainerID: "", IfName: "net1"}}}), wantCode: handoff.CodeBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn := dialRaw(t, d.socket)
			// The first exchange makes sure napitapd has accepted the
			// connection, so that the count below includes its end.
			if resp, _, err := readAfter(conn, list); err != nil || resp.Error != nil {
				t.Fatalf("list before: %+v %v", resp, err)
			}
			before := settledFDs(t)
			fds := devNulls(t, tc.fds)
			var err error
			if tc.empty {
				err = sendEmpty(conn, fds)
			} else {
				err = sendRaw(conn, tc.header, fds)
			}
			for _, fd := range fds {
				unix.Close(fd) // napitapd has its own copies now, or none
			}
			switch {
			case tc.sendErr != nil:
				if !errors.Is(err, tc.sendErr) {
					t.Fatalf("sendmsg: got %v, want %v", err, tc.sendErr)
				}
			case err != nil:
				t.Fatalf("sendmsg: %v", err)
			case tc.hangUp:
				if resp, n, err := readRaw(conn); !errors.Is(err, io.EOF) {
					t.Fatalf("got %+v (%d fds) %v, want napitapd to hang up", resp, n, err)
				}
			default:
				resp, n, err := readRaw(conn)
				if err != nil {
					t.Fatalf("no response: %v", err)
				}
				if got := respCode(resp); got != tc.wantCode {
					t.Errorf("response %+v: code %q, want %q", resp.Error, got, tc.wantCode)
				}
				if resp.Version != handoff.Version {
					t.Errorf("response version %d", resp.Version)
				}
				if n != 0 {
					t.Errorf("response carried %d fds", n)
				}
			}
			if tc.hangUp {
				before -= serverFDsPerConnection(t) // napitapd's end of the connection
			}
			waitFDs(t, before, "napitapd closes every fd it was sent and did not keep")

			if tc.hangUp {
				conn = dialRaw(t, d.socket)
			}
			resp, _, err := readAfter(conn, list)
			if err != nil || resp.Error != nil {
				t.Fatalf("a following list on the same connection: %+v %v", resp, err)
			}
			if len(resp.Attachments) != 1 || resp.Attachments[0].Key != held || resp.Attachments[0].Held != 2 {
				t.Errorf("a following list shows %+v, want only %s holding 2 fds", resp.Attachments, held)
			}
			if n := d.srv.HeldFDs(); n != 2 {
				t.Errorf("server holds %d fds, want the 2 of %s", n, held)
			}
		})
	}
	checkAttached(t, pod, tap, 2)
}

// sendEmpty sends a datagram of 0 bytes, with fds if any, by sendmsg(2)
// itself: Go's WriteMsgUnix (syscall.SendmsgN) adds a NUL byte to an empty
// message with ancillary data on a non-datagram socket.
func sendEmpty(conn *net.UnixConn, fds []int) error {
	var msg unix.Msghdr
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
		msg.Control = &oob[0]
		msg.SetControllen(len(oob))
	}
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var errno syscall.Errno
	if err := rc.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_SENDMSG, fd, uintptr(unsafe.Pointer(&msg)), 0)
	}); err != nil {
		return err
	}
	runtime.KeepAlive(oob)
	if errno != 0 {
		return errno
	}
	return nil
}

func readAfter(conn *net.UnixConn, header []byte) (*handoff.Response, int, error) {
	if err := sendRaw(conn, header, nil); err != nil {
		return nil, 0, err
	}
	return readRaw(conn)
}

// ---------------------------------------------------------------------------
// 7. Who may do what: a real peer of another uid and netns.

const helperEnv = "NAPITAP_HANDOFF_HELPER"

func init() {
	if os.Getenv(helperEnv) != "" {
		// TestMain, and so runHelper, runs on the main goroutine; locked
		// here it stays on the main thread, whose netns is the one napitapd
		// reads from /proc/<pid>/ns/net.
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper())
	}
	if os.Getenv(floodEnv) != "" {
		os.Exit(runFlood())
	}
	os.Exit(m.Run())
}

// TestHelperProcess is what the re-executed binary is told to run; the
// work happens in TestMain on the main thread before any test starts.
func TestHelperProcess(t *testing.T) {
	t.Skip("runs only as the peer process of other tests")
}

type helperResult struct {
	Uid, Gid    int
	CapEff      uint64 // as its own /proc/self/status shows it
	UserNS      string // its user namespace, as /proc/self/ns/user links it
	NetnsID     uint64
	Code        string // "" on success, the protocol code, or "error"
	Err         string
	FDs         int
	TapNames    []string
	NAPI        bool // every fd received is a NAPI queue (TUNGETIFF)
	Attachments []string
	Released    int
}

func runHelper() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "helper: "+format+"\n", a...)
		return 2
	}
	if p := os.Getenv("NAPITAP_HELPER_NETNS"); p != "" {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fail("open %s: %v", p, err)
		}
		err = unix.Setns(fd, unix.CLONE_NEWNET)
		unix.Close(fd)
		if err != nil {
			return fail("setns %s: %v", p, err)
		}
	}
	if socket := os.Getenv("NAPITAP_HELPER_DAEMON"); socket != "" {
		return runDaemonHelper(socket, os.Getenv("NAPITAP_HELPER_STATE"))
	}
	var res helperResult
	var err error
	if res.NetnsID, err = tapsetup.NetnsID("/proc/thread-self/ns/net"); err != nil {
		return fail("own netns: %v", err)
	}
	if s := os.Getenv("NAPITAP_HELPER_UID"); s != "" {
		uid, err1 := strconv.Atoi(s)
		gid, err2 := strconv.Atoi(os.Getenv("NAPITAP_HELPER_GID"))
		if err := errors.Join(err1, err2); err != nil {
			return fail("uid/gid: %v", err)
		}
		var groups []int
		for _, g := range strings.Fields(os.Getenv("NAPITAP_HELPER_GROUPS")) {
			n, err := strconv.Atoi(g)
			if err != nil {
				return fail("groups: %v", err)
			}
			groups = append(groups, n)
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fail("setgroups: %v", err)
		}
		if err := syscall.Setresgid(gid, gid, gid); err != nil {
			return fail("setresgid %d: %v", gid, err)
		}
		if err := syscall.Setresuid(uid, uid, uid); err != nil {
			return fail("setresuid %d: %v", uid, err)
		}
	}
	res.Uid, res.Gid = os.Getuid(), os.Getgid()
	res.UserNS, _ = os.Readlink("/proc/self/ns/user")
	if res.CapEff, err = capEff("/proc/self/status"); err != nil {
		return fail("%v", err)
	}

	switch os.Getenv("NAPITAP_HELPER_OP") {
	case "borrow":
		return runBorrow(fail)
	case "borrowed-fetch":
		return runBorrowedFetch(fail)
	}
	c := &handoff.Client{Socket: os.Getenv("NAPITAP_HELPER_SOCKET"), Timeout: 10 * time.Second}
	var key *handoff.Key
	if s := os.Getenv("NAPITAP_HELPER_KEY"); s != "" {
		cid, ifName, _ := strings.Cut(s, "/")
		key = &handoff.Key{ContainerID: cid, IfName: ifName}
	}
	switch op := os.Getenv("NAPITAP_HELPER_OP"); op {
	case "fetch":
		var files []*os.File
		_, files, err = c.Fetch(key)
		res.FDs, res.NAPI = len(files), len(files) > 0
		for _, f := range files {
			name, nerr := queueName(f)
			flags, ferr := tapsetup.QueueFlagsOf(f)
			if nerr != nil || ferr != nil {
				return fail("inspect fetched fd: %v %v", nerr, ferr)
			}
			res.TapNames = append(res.TapNames, name)
			res.NAPI = res.NAPI && flags&unix.IFF_NAPI != 0
			f.Close()
		}
	case "list":
		var atts []handoff.Attachment
		atts, err = c.List()
		for _, a := range atts {
			res.Attachments = append(res.Attachments, a.Key.String())
		}
	case "release":
		err = c.Release(*key)
	case "gc":
		res.Released, err = c.GC("net-a", nil)
	case "register", "register-own-tap":
		var att handoff.Attachment
		if jerr := json.Unmarshal([]byte(os.Getenv("NAPITAP_HELPER_ATTACHMENT")), &att); jerr != nil {
			return fail("attachment: %v", jerr)
		}
		var files []*os.File
		if op == "register-own-tap" {
			// The attack of issue 33: a tap of its own, in a netns of its
			// own, registered under another pod's key and netns path.
			var terr error
			if files, terr = ownTap(att.TapName, att.Queues, tapsetup.OwnerAlias(att.ContainerID, att.IfName)); terr != nil {
				return fail("a tap of its own: %v", terr)
			}
		}
		for len(files) < att.Queues {
			f, oerr := os.Open("/dev/null")
			if oerr != nil {
				return fail("%v", oerr)
			}
			files = append(files, f)
		}
		err = c.Register(&att, files)
	default:
		return fail("unknown op %q", op)
	}
	if err != nil {
		var perr *handoff.Error
		if errors.As(err, &perr) {
			res.Code = perr.Code
		} else {
			res.Code = "error"
		}
		res.Err = err.Error()
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return fail("%v", err)
	}
	return 0
}

// capEff reads the CapEff line of a /proc status file.
func capEff(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("%s: no CapEff", path)
}

// ownTap makes a netns of the calling thread's own (the helper's last act
// there) and a tap in it with the mark given, and returns its queues.
func ownTap(name string, queues int, mark string) ([]*os.File, error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the helper
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("unshare netns: %w", err)
	}
	_, files, err := tapsetup.Create(tapsetup.Spec{Name: name, Queues: queues, Flags: queueFlags(queues), VnetHdrSize: 12, Alias: mark})
	return files, err
}

type helperArgs struct {
	netns    string // "" stays in the test's netns
	uid, gid *int   // nil stays root
	groups   []int  // supplementary groups of a non-root peer
	op       string
	key      *handoff.Key
	att      *handoff.Attachment
	capless  bool // root without any capability (a pod's root); needs netns ""
	// userns: capless, and then every capability in a user namespace of
	// its own (DESIGN.md fact 25), as issue 33's attacker.
	userns bool
}

func runPeer(t testing.TB, socket string, a helperArgs) helperResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=1",
		"NAPITAP_HELPER_SOCKET="+socket, "NAPITAP_HELPER_NETNS="+a.netns, "NAPITAP_HELPER_OP="+a.op)
	switch {
	case a.userns:
		cmd = nstest.AsRootInOwnUserns(t, cmd)
	case a.capless:
		cmd = nstest.AsCaplessRoot(t, cmd)
	}
	if a.uid != nil {
		cmd.Env = append(cmd.Env, fmt.Sprintf("NAPITAP_HELPER_UID=%d", *a.uid), fmt.Sprintf("NAPITAP_HELPER_GID=%d", *a.gid),
			"NAPITAP_HELPER_GROUPS="+strings.Trim(fmt.Sprint(a.groups), "[]"))
	}
	if a.key != nil {
		cmd.Env = append(cmd.Env, "NAPITAP_HELPER_KEY="+a.key.String())
	}
	if a.att != nil {
		cmd.Env = append(cmd.Env, "NAPITAP_HELPER_ATTACHMENT="+string(mustJSON(t, a.att)))
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("peer process: %v\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	var res helperResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("peer process output %q: %v (stderr: %s)", out, err, stderr.String())
	}
	return res
}

// sharedSockDir makes a directory under /tmp that every uid may search,
// for a socket that peers of other uids must reach, and removes it when
// the test ends.
func sharedSockDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "napitap-handoff-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func withOwner(a *handoff.Attachment, owner, group uint32) *handoff.Attachment {
	a.Owner, a.Group = &owner, &group
	return a
}

// hostNetnsID is the netns of this test's threads. Not /proc/self: that
// is the main thread's, which a goroutine that locked it and exited inside
// a pod netns (tapsetup's sysfs helper does so on purpose) leaves there.
func hostNetnsID(t testing.TB) uint64 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return netnsID(t, "/proc/thread-self/ns/net")
}

func netnsID(t testing.TB, path string) uint64 {
	t.Helper()
	id, err := tapsetup.NetnsID(path)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestSocketModeAndGroupAreEnforced: with the default 0660 and a socket
// group, only root and members of that group can even connect.
func TestSocketModeAndGroupAreEnforced(t *testing.T) {
	nstest.RequireRoot(t)
	sockDir := sharedSockDir(t)
	const socketGroup = 4242
	socket := filepath.Join(sockDir, "napitapd.sock")
	srv, err := handoff.NewServer(filepath.Join(t.TempDir(), "state"), newLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	l, err := handoff.Listen(socket, 0o660, socketGroup)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = srv.Serve(context.Background(), l); close(done) }()
	t.Cleanup(func() { l.Close(); <-done; srv.Close() })

	var st unix.Stat_t
	if err := unix.Stat(socket, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&0o777 != 0o660 || st.Gid != socketGroup {
		t.Errorf("socket mode %o gid %d, want 660 and %d", st.Mode&0o777, st.Gid, socketGroup)
	}
	ptr := func(v int) *int { return &v }
	cases := []struct {
		name        string
		uid, gid    int
		wantRefused bool
	}{
		{"a member of the socket group may connect", 3000, socketGroup, false},
		{"anyone else is refused by the socket's mode", 3000, 3000, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := runPeer(t, socket, helperArgs{op: "list", uid: ptr(tc.uid), gid: ptr(tc.gid)})
			refused := res.Code == "error" && strings.Contains(res.Err, "permission denied")
			if refused != tc.wantRefused {
				t.Errorf("uid %d gid %d: code %q err %q, want refused=%v", tc.uid, tc.gid, res.Code, res.Err, tc.wantRefused)
			}
		})
	}
}

// serverFDsPerConnection is what napitapd holds per connection: its socket,
// and a pidfd of the peer: SO_PEERPIDFD's, or before Linux 6.5 (which
// answers ENOPROTOOPT) pidfd_open's of SO_PEERCRED's pid (pkg/peer).
func serverFDsPerConnection(t *testing.T) int {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	pidfd, err := unix.GetsockoptInt(fds[0], unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	switch {
	case err == nil:
		unix.Close(pidfd)
	case errors.Is(err, unix.ENOPROTOOPT):
		t.Log("no SO_PEERPIDFD (Linux < 6.5): napitapd pins each peer with pidfd_open")
	default:
		t.Fatalf("SO_PEERPIDFD: %v", err)
	}
	return 2
}
