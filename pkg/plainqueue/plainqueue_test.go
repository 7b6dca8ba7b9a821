package plainqueue

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// TestAHolderWithoutNapitapdLetsAWaitingCallGoOnAfterItsBound: a VMM's
// TUNSETIFF under the filter waits while napitapd is connected to the
// holder (napitapd answers it, in life), and once none has been for the
// bound, the holder lets it go on: the VMM gets a queue, without NAPI.
// The other entries the holder keeps are left alone, and the next napitapd
// to sync is told of the call once (napitapd_plain_queues_total).
func TestAHolderWithoutNapitapdLetsAWaitingCallGoOnAfterItsBound(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "plainqueue")
	const tap = "napipq0"
	pod.Run(t, func() error { return nstest.MakePersistentTap(tap) })

	socket := filepath.Join(t.TempDir(), "fdstore.sock")
	l, err := fdstore.Listen(socket)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	h := fdstore.NewHolder(slog.New(slog.NewTextHandler(logs, nil)))
	go func() { _ = h.Serve(l) }()
	t.Cleanup(func() { l.Close(); h.Close() })
	const after = 300 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Run(ctx, h, after, slog.New(slog.NewTextHandler(logs, nil)))

	listener, res := callerUnderFilter(t, pod.Path(), tap)
	defer listener.Close()
	napitapd, err := fdstore.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, e := range []fdstore.Entry{
		{Name: "listener/a", Files: []*os.File{listener}},
		{Name: "pipe", Files: []*os.File{w}},
	} {
		if err := napitapd.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	w.Close()

	select {
	case got := <-res:
		t.Fatalf("the call returned while napitapd was connected: %+v", got)
	case <-time.After(3 * after):
	}
	gone := time.Now()
	napitapd.Close()
	var got callResult
	select {
	case got = <-res:
	case <-time.After(after + 5*time.Second):
		t.Fatalf("the call still waits %v after napitapd left\n%s", after+5*time.Second, logs.String())
	}
	waited := time.Since(gone)
	if got.err != nil || got.errno != 0 || got.flags&unix.IFF_NAPI != 0 {
		t.Errorf("the call: %+v; want 0 and a queue without IFF_NAPI\n%s", got, logs.String())
	}
	if waited < after {
		t.Errorf("the call went on %v after napitapd left, before the bound of %v", waited, after)
	}
	// The holder logs once it has answered: the call can return first.
	for deadline := time.Now().Add(2 * time.Second); !strings.Contains(logs.String(), "a TUNSETIFF went on in the kernel, its queue without NAPI"); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Errorf("the holder did not say so:\n%s", logs.String())
			break
		}
	}
	next, err := fdstore.Dial(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	for _, want := range []int{1, 0} {
		_, report, err := next.ListTakingLetGo()
		if err != nil {
			t.Fatal(err)
		}
		if len(report.Calls) != want || report.Dropped != 0 {
			t.Errorf("the next napitapd's sync is told of %+v; want %d call(s), each told once", report, want)
		}
		for _, c := range report.Calls {
			if c.Entry != "listener/a" || c.Tid == 0 {
				t.Errorf("let-go call %+v: want entry listener/a and the caller's thread", c)
			}
		}
	}
	// The pipe's write end is still held: read would block, not EOF.
	_ = r.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the pipe the holder keeps: read %v, want a timeout", err)
	}
}

type callResult struct {
	errno unix.Errno
	flags uint16
	err   error
}

// callerUnderFilter makes a TUNSETIFF on tap, the way QEMU does, from a
// thread of this process in netnsPath under napitap's filter; the thread
// ends with the call. The listener is the test's.
func callerUnderFilter(t *testing.T, netnsPath, tap string) (*os.File, <-chan callResult) {
	t.Helper()
	fds := make(chan int, 1)
	res := make(chan callResult, 1)
	// The thread, with its netns and filter, ends with the call.
	nstest.OnThreadThatEnds(func() {
		fd, err := func() (int, error) {
			nsfd, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, err
			}
			defer unix.Close(nsfd)
			if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
				return -1, err
			}
			return seccompagent.InstallFilter()
		}()
		if err != nil {
			fds <- -1
			res <- callResult{err: err}
			return
		}
		fds <- fd
		res <- tunsetiff(tap)
	})
	fd := <-fds
	if fd < 0 {
		t.Fatalf("under the filter: %v", (<-res).err)
	}
	return os.NewFile(uintptr(fd), "seccomp-listener"), res
}

func tunsetiff(tap string) callResult {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return callResult{err: err}
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(tap)
	if err != nil {
		return callResult{err: err}
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		var errno unix.Errno
		if errors.As(err, &errno) {
			return callResult{errno: errno}
		}
		return callResult{err: err}
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return callResult{err: err}
	}
	return callResult{flags: ifr.Uint16()}
}
