package seccompagent

import (
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/syncbuf"
)

// TestContinueWaitingLetsACallGoOnUnlessItsFdMayBeAttached: what the fd
// holder does when no napitapd has answered for too long. Every waiting
// TUNSETIFF goes on in the kernel and opens a plain queue, whether nobody
// received it or a dead napitapd did; one whose fd the slot records an
// attach of stays for the next napitapd, which answers 0.
func TestContinueWaitingLetsACallGoOnUnlessItsFdMayBeAttached(t *testing.T) {
	pod, tap, reg := slotTestPod(t, "seccompcont")
	tests := []struct {
		name string
		// prepare plays the dead napitapd, and returns the slot the
		// holder keeps (nil: none).
		prepare  func(t *testing.T, listener *os.File) *slot
		wantLeft bool
	}{
		{"a call nobody received goes on in the kernel", func(t *testing.T, listener *os.File) *slot {
			waitPending(t, listener)
			s, err := newSlot()
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, false},
		{"a call nobody received goes on without a slot too", func(t *testing.T, listener *os.File) *slot {
			waitPending(t, listener)
			return nil
		}, false},
		{"a call a dead napitapd received and never answered goes on", receiveInSlot, false},
		{"a call whose fd the slot records attached is left for the next napitapd", func(t *testing.T, listener *os.File) *slot {
			s := receiveInSlot(t, listener)
			n := s.notif()
			s.setLast(n.Pid, attachedQueue{fd: int32(n.Data.Args[0]), tap: tap})
			return s
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			listener, res := callerUnderFilter(t, pod, tap)
			s := tc.prepare(t, listener)
			var slotFile *os.File
			if s != nil {
				slotFile = s.f
			}
			flags := fileFlags(t, listener)
			got, err := ContinueWaiting(listener, slotFile)
			if err != nil {
				t.Fatalf("ContinueWaiting: %v", err)
			}
			if tc.wantLeft {
				if got.Left == 0 || len(got.Tids) != 0 {
					t.Fatalf("ContinueWaiting: %+v, want the caller left and nothing continued", got)
				}
				expectBlocked(t, res)
				// The next napitapd answers it.
				agent := newSlotTestAgent(t, reg, &syncbuf.Buffer{}, nil)
				if err := agent.Adopt(Listener{File: listener, Slot: s.release(), Origin: "the next napitapd"}); err != nil {
					t.Fatal(err)
				}
				if r := awaitCaller(t, res); r.errno != 0 || r.flags&unix.IFF_NAPI == 0 {
					t.Errorf("the caller after the next napitapd: %v, flags 0x%x; want 0 and IFF_NAPI", r.errno, r.flags)
				}
				waitServed(t, agent, 0)
				agent.Close()
				waitFDs(t, before, "after the agent closed")
				return
			}
			if len(got.Tids) != 1 || got.Left != 0 {
				t.Errorf("ContinueWaiting: %+v, want one caller continued", got)
			}
			r := awaitCaller(t, res)
			if r.errno != 0 || r.flags&unix.IFF_NAPI != 0 {
				t.Errorf("the caller's TUNSETIFF: %v, flags 0x%x; want 0 and a queue without IFF_NAPI", r.errno, r.flags)
			}
			if again, err := ContinueWaiting(listener, slotFile); err != nil || !slices.Equal(again.Tids, nil) {
				t.Errorf("a second ContinueWaiting: %+v, %v; want nothing to do", again, err)
			}
			if after := fileFlags(t, listener); after != flags {
				t.Errorf("the listener's file flags went from 0x%x to 0x%x: napitapd shares them", flags, after)
			}
			listener.Close()
			if s != nil {
				s.close()
			}
			waitFDs(t, before, "after the test closed listener and slot")
		})
	}
}

// waitPending waits for a notification on listener, without taking it.
func waitPending(t *testing.T, listener *os.File) {
	t.Helper()
	rc, err := listener.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	_ = rc.Control(func(fd uintptr) {
		n, _ = unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 10_000)
	})
	if n != 1 {
		t.Fatal("no notification within 10 s")
	}
}

// fileFlags are f's file status flags, read without Fd, which would
// change them.
func fileFlags(t *testing.T, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var flags int
	if err := rc.Control(func(fd uintptr) { flags, err = unix.FcntlInt(fd, unix.F_GETFL, 0) }); err != nil {
		t.Fatal(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return flags
}

// TestTheSlotsAttachRecordLastsOnlyTheRestartWindow: the record of the last
// attach is for a TUNSETIFF a signal restarts at once; kept longer, it
// would make the fd holder leave a later call on the same fd number (a NIC
// hot-plugged after one was removed reuses its fds) to the next napitapd.
func TestTheSlotsAttachRecordLastsOnlyTheRestartWindow(t *testing.T) {
	pod, tap, reg := slotTestPod(t, "seccompwin")
	// A caller that stays, as a VMM does: its filter's listener stays
	// served after the attach.
	release := make(chan struct{})
	defer close(release)
	listener, res := callerUnderFilterUntil(t, pod, tap, release)
	mine, err := newSlot()
	if err != nil {
		t.Fatal(err)
	}
	defer mine.close()
	dupFD, err := unix.FcntlInt(mine.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	theirs := os.NewFile(uintptr(dupFD), "slot")
	agent := newSlotTestAgent(t, reg, &syncbuf.Buffer{}, nil)
	if err := agent.Adopt(Listener{File: listener, Slot: theirs, Origin: "window test"}); err != nil {
		t.Fatal(err)
	}
	if r := awaitCaller(t, res); r.errno != 0 || r.flags&unix.IFF_NAPI == 0 {
		t.Fatalf("the caller: %v, flags 0x%x; want a NAPI queue", r.errno, r.flags)
	}
	if _, _, ok := mine.last(); !ok {
		t.Fatal("no record of the attach right after it")
	}
	time.Sleep(restartWindow + 500*time.Millisecond)
	if tid, q, ok := mine.last(); ok {
		t.Errorf("the record of thread %d's fd %d is still in the slot %v after the attach", tid, q.fd, restartWindow+500*time.Millisecond)
	}
}
