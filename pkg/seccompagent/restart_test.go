package seccompagent

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// TestATUNSETIFFRestartedByASignalGetsTheAttachNotEEXIST: runc 1.1.5
// (libseccomp 2.5.4) installs an OCI profile's filter without
// WAIT_KILLABLE_RECV, so a signal that reaches the caller while the agent
// attaches its queue interrupts the wait, the answer is lost and the
// kernel restarts the TUNSETIFF on an fd that is attached now. That
// restarted call must get the 0 the attach earned, not the kernel's
// EEXIST. The signal is sent from the agent's own answer path, after the
// attach: deterministic, no storm needed.
func TestATUNSETIFFRestartedByASignalGetsTheAttachNotEEXIST(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomprst")
	const tap = "napirst0"
	pod.Run(t, func() error { return makePersistentTap(tap) })
	netnsID, err := NetnsID(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	var reg MapRegistry
	reg.Set(netnsID, tap, Target{Key: "restart-test/net1", NAPI: true, MultiQueue: true})
	logs := &syncBuffer{}
	agent, err := New(&reg, slog.New(slog.NewTextHandler(logs, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Close)

	cases := []struct {
		name        string
		flags       uintptr
		wantAnswers int32 // notifications answered: 2 when the call restarted
	}{
		{"under runc's filter, without WAIT_KILLABLE_RECV, the restarted call gets the attach's 0", unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, 2},
		{"under launch's filter, with WAIT_KILLABLE_RECV, the signal waits for the one answer", filterFlags, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			var answers atomic.Int32
			// Set while no listener is served: no goroutine reads it now.
			agent.beforeReply = func(tid int) {
				if answers.Add(1) == 1 {
					if err := unix.Tgkill(os.Getpid(), tid, unix.SIGURG); err != nil {
						t.Errorf("tgkill %d: %v", tid, err)
					}
					time.Sleep(20 * time.Millisecond) // the caller takes the signal meanwhile
				}
			}
			flags, err := tunsetiffUnderFilter(pod.Path(), tap, tc.flags, agent)
			if err != nil {
				t.Fatalf("TUNSETIFF under the filter: %v\nagent log:\n%s", err, logs.String())
			}
			if flags&unix.IFF_NAPI == 0 {
				t.Errorf("queue flags 0x%x lack IFF_NAPI", flags)
			}
			if got := answers.Load(); got != tc.wantAnswers {
				t.Errorf("the agent answered %d notifications, want %d (the signal did not act as expected)\n%s", got, tc.wantAnswers, logs.String())
			}
			restarted := strings.Contains(logs.String(), "TUNSETIFF restarted by a signal")
			if restarted != (tc.wantAnswers == 2) {
				t.Errorf("agent logged a restart: %v, want %v\n%s", restarted, tc.wantAnswers == 2, logs.String())
			}
			// The thread that carried the filter has ended: the listener goes.
			deadline := time.Now().Add(5 * time.Second)
			for agent.Listeners() > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := agent.Listeners(); n > 0 {
				t.Fatalf("%d listeners still served", n)
			}
			agent.beforeReply = nil
		})
	}
}

// tunsetiffUnderFilter opens tap as QEMU does (multiqueue, vnet header)
// from a thread of its own in netnsPath that carries the filter, whose
// listener agent serves, and returns the flags TUNGETIFF then reports.
// The thread is never unlocked: it ends with its goroutine, filter and
// netns with it. Go starts new threads from its template thread, never
// from a locked one, so no other thread inherits the filter.
func tunsetiffUnderFilter(netnsPath, tap string, filterFlags uintptr, agent *Agent) (uint16, error) {
	type result struct {
		flags uint16
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		defer func() { done <- r }()
		nsfd, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			r.err = err
			return
		}
		err = unix.Setns(nsfd, unix.CLONE_NEWNET)
		unix.Close(nsfd)
		if err != nil {
			r.err = fmt.Errorf("setns: %w", err)
			return
		}
		listener, err := installFilter(filterFlags)
		if err != nil {
			r.err = err
			return
		}
		if err := agent.Add(listener, "restart test"); err != nil {
			r.err = err
			return
		}
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			r.err = err
			return
		}
		defer unix.Close(fd)
		ifr, err := unix.NewIfreq(tap)
		if err != nil {
			r.err = err
			return
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			r.err = fmt.Errorf("TUNSETIFF: %w", err)
			return
		}
		got, _ := unix.NewIfreq("")
		if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, got); err != nil {
			r.err = fmt.Errorf("TUNGETIFF: %w", err)
			return
		}
		r.flags = got.Uint16()
	}()
	select {
	case r := <-done:
		return r.flags, r.err
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("TUNSETIFF still blocked after 30 s")
	}
}

// makePersistentTap makes a multiqueue tap with no queue attached, as
// napitap leaves one in intercept mode.
func makePersistentTap(name string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1)
}

// syncBuffer is a log sink the agent's goroutines write while the test
// reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}
