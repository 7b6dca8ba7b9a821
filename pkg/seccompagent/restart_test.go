package seccompagent

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestATUNSETIFFRestartedByASignalGetsTheAttachNotEEXIST: runc 1.1.5
// (libseccomp 2.5.4) installs an OCI profile's filter without
// WAIT_KILLABLE_RECV, so a signal that reaches the caller while the agent
// attaches its queue interrupts the wait and the kernel restarts the
// TUNSETIFF on an fd that is attached now. That restarted call must get
// the 0 the attach earned, not the kernel's EEXIST, whether the agent's
// answer then found no caller (ENOENT) or went out while the signal
// crossed it. The signals come from the agent's own answer path.
func TestATUNSETIFFRestartedByASignalGetsTheAttachNotEEXIST(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomprst")
	const tap = "napirst0"
	pod.Run(t, func() error { return nstest.MakePersistentTap(tap) })
	netnsID, err := tapsetup.NetnsID(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	var reg MapRegistry
	reg.Set(netnsID, tap, Target{Key: "restart-test/net1", NAPI: true, MultiQueue: true})
	logs := &syncbuf.Buffer{}
	agent, err := New(&reg, slog.New(slog.NewTextHandler(logs, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(agent.Close)
	runcFlags := uintptr(unix.SECCOMP_FILTER_FLAG_NEW_LISTENER)

	cases := []struct {
		name     string
		flags    uintptr
		attempts int
		// signal runs before each answer, n counting answers from 1.
		signal func(tid int, n int32)
		// storm: SIGURG at the caller every ~20 us besides, so that it
		// is interrupted at every stage of the agent's work.
		storm bool
		// wantAnswers: notifications answered, attempts plus restarts;
		// -1: at least attempts.
		wantAnswers int32
	}{
		{"under runc's filter, a signal after the attach: the answer finds no caller and the restarted call gets 0",
			runcFlags, 1, func(tid int, n int32) {
				if n == 1 {
					sigurg(t, tid)
					time.Sleep(20 * time.Millisecond) // the caller takes the signal meanwhile
				}
			}, false, 2},
		{"under launch's filter, with WAIT_KILLABLE_RECV, the same signal waits for the one answer",
			filterFlags, 1, func(tid int, n int32) {
				if n == 1 {
					sigurg(t, tid)
					time.Sleep(20 * time.Millisecond)
				}
			}, false, 1},
		{"under runc's filter, signals racing every other answer: 300 attaches, never EEXIST",
			runcFlags, 300, func(tid int, n int32) {
				if n%2 == 1 {
					sigurg(t, tid)
					spin(time.Duration(rand.IntN(40)) * time.Microsecond)
				}
			}, false, -1},
		{"under runc's filter, a signal storm at every stage: 300 attaches, never EEXIST",
			runcFlags, 300, func(int, int32) { spin(50 * time.Microsecond) }, true, -1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logs.Reset()
			var answers atomic.Int32
			agent.mu.Lock()
			agent.beforeReply = func(tid int, _ bool) { tc.signal(tid, answers.Add(1)) }
			agent.mu.Unlock()
			defer func() { agent.mu.Lock(); agent.beforeReply = nil; agent.mu.Unlock() }()
			errnos, napi, err := tunsetiffUnderFilter(pod.Path(), tap, tc.flags, tc.attempts, tc.storm, agent)
			if err != nil {
				t.Fatalf("under the filter: %v\nagent log:\n%s", err, logTail(logs.String()))
			}
			got := answers.Load()
			t.Logf("%d attaches, %d notifications answered, %d restarts logged: errnos %v",
				tc.attempts, got, strings.Count(logs.String(), "TUNSETIFF restarted by a signal"), errnos)
			if errnos[0] != tc.attempts || napi != tc.attempts {
				t.Errorf("%d of %d TUNSETIFFs succeeded, %d with IFF_NAPI: errnos %v", errnos[0], tc.attempts, napi, errnos)
			}
			if tc.wantAnswers >= 0 && got != tc.wantAnswers {
				t.Errorf("the agent answered %d notifications, want %d (the signal did not act as expected)\n%s", got, tc.wantAnswers, logs.String())
			}
			restarted := strings.Contains(logs.String(), "TUNSETIFF restarted by a signal")
			if wantRestart := got > int32(tc.attempts); restarted != wantRestart {
				t.Errorf("agent logged a restart: %v, want %v\n%s", restarted, wantRestart, logTail(logs.String()))
			}
			// The thread that carried the filter has ended: the listener goes.
			deadline := time.Now().Add(5 * time.Second)
			for agent.Listeners() > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := agent.Listeners(); n > 0 {
				t.Fatalf("%d listeners still served", n)
			}
		})
	}
}

func sigurg(t *testing.T, tid int) {
	// SIGURG: the Go runtime's handler has SA_RESTART, as QEMU's and
	// libvirt's handlers do.
	if err := unix.Tgkill(os.Getpid(), tid, unix.SIGURG); err != nil {
		t.Errorf("tgkill %d: %v", tid, err)
	}
}

// spin waits d without sleeping: a sleep would let the caller take the
// signal first every time.
func spin(d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
	}
}

func logTail(s string) string {
	if len(s) > 3000 {
		return "..." + s[len(s)-3000:]
	}
	return s
}

// tunsetiffUnderFilter opens tap as QEMU does (multiqueue, vnet header)
// attempts times, closing each queue again, from a thread of its own in
// netnsPath that carries the filter, whose listener agent serves. It
// counts the errnos and the queues with IFF_NAPI (each attach is the
// tap's first, so TUNGETIFF's flags are its own). The thread is never
// unlocked: it ends with its goroutine, filter and netns with it (never
// the main thread, which Go cannot end). Go starts new threads from its
// template thread, never from a locked one, so no other thread inherits
// the filter.
func tunsetiffUnderFilter(netnsPath, tap string, filterFlags uintptr, attempts int, storm bool, agent *Agent) (map[unix.Errno]int, int, error) {
	type result struct {
		errnos map[unix.Errno]int
		napi   int
		err    error
	}
	done := make(chan result, 1)
	nstest.OnThreadThatEnds(func() {
		r := result{errnos: map[unix.Errno]int{}}
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
		if err := agent.Add(listener, 0, "restart test"); err != nil {
			r.err = err
			return
		}
		if storm {
			stop := make(chan struct{})
			defer close(stop)
			pid, tid := unix.Getpid(), unix.Gettid()
			go func() { // on another thread: this one is locked
				for {
					select {
					case <-stop:
						return
					default:
					}
					_ = unix.Tgkill(pid, tid, unix.SIGURG)
					time.Sleep(20 * time.Microsecond)
				}
			}()
		}
		for range attempts {
			errno, flags, err := attachOnce(tap)
			if err != nil {
				r.err = err
				return
			}
			r.errnos[errno]++
			if errno == 0 && flags&unix.IFF_NAPI != 0 {
				r.napi++
			}
		}
	})
	select {
	case r := <-done:
		return r.errnos, r.napi, r.err
	case <-time.After(60 * time.Second):
		return nil, 0, fmt.Errorf("TUNSETIFF still blocked after 60 s")
	}
}

func attachOnce(tap string) (unix.Errno, uint16, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(tap)
	if err != nil {
		return 0, 0, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		var errno unix.Errno
		if !errors.As(err, &errno) {
			return 0, 0, err
		}
		return errno, 0, nil
	}
	got, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, got); err != nil {
		return 0, 0, fmt.Errorf("TUNGETIFF: %w", err)
	}
	return 0, got.Uint16(), nil
}
