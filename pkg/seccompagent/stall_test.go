package seccompagent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/uffdtest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// stopGrace is daemon.StopGrace, which imports this package.
const stopGrace = 2 * time.Second

func waitFor(t testing.TB, d time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !ok(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// stalledCall is a thread under napitap's filter, served by an agent,
// whose TUNSETIFF has its ifreq on a uffdtest.Page; once that call is over
// and again is closed, it makes a plain TUNSETIFF on the same filter.
type stalledCall struct {
	tid     chan int   // sent just before the stalled TUNSETIFF
	stalled chan error // its outcome, once the page is filled
	flags   uint16     // TUNGETIFF's after it, if it succeeded
	again   chan struct{}
	goOn    func() // closes again
	next    chan error
}

func startStalledCall(t *testing.T, netnsPath, tap string, agent *Agent, page *uffdtest.Page) *stalledCall {
	c := &stalledCall{tid: make(chan int, 1), stalled: make(chan error, 1), again: make(chan struct{}), next: make(chan error, 1)}
	var again sync.Once
	c.goOn = func() { again.Do(func() { close(c.again) }) }
	t.Cleanup(c.goOn)
	nstest.OnThreadThatEnds(func() {
		err := enterNetns(netnsPath)
		if err == nil {
			var l int
			if l, err = installFilter(filterFlags); err == nil {
				err = agent.Add(l, 0, "stalled read test")
			}
		}
		fd := -1
		if err == nil {
			fd, err = openTun()
		}
		if err != nil {
			c.stalled <- err
			return
		}
		c.tid <- unix.Gettid()
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, page.Addr); errno != 0 {
			err = errno
		} else {
			c.flags, _ = getIff(fd)
		}
		unix.Close(fd) // before the next subtest's first queue
		c.stalled <- err
		<-c.again
		errno, _, err := attachOnce(tap)
		if err == nil && errno != 0 {
			err = errno
		}
		c.next <- err
	})
	return c
}

// TestACallerThatStallsTheReadOfItsIfreqHoldsUpNeitherTheAgentNorItsStop:
// a TUNSETIFF whose ifreq lies on a userfaultfd page nobody fills makes
// the agent's process_vm_readv wait in the kernel for as long as the
// caller likes. The agent gives the read up at readDeadline and leaves
// the call to the kernel (CONTINUE: no NAPI, nothing granted), where the
// caller's own copy_from_user waits on its own page; Close and Detach do
// not wait for the read; and a detached listener is served by the next
// agent.
func TestACallerThatStallsTheReadOfItsIfreqHoldsUpNeitherTheAgentNorItsStop(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napisc0"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	netnsID, err := tapsetup.NetnsID(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	reg := &MapRegistry{}
	reg.Set(netnsID, tap, Target{Key: "test/" + tap, NAPI: true, MultiQueue: true})

	tests := []struct {
		name string
		// stalled: reads given up already and still blocked; at
		// maxStalledReads the agent answers at once without reading.
		stalled int32
		// stop, "close" or "detach", ends the agent while its read is
		// under way.
		stop string
		// wantNext: how the agent serving the listener answers the next
		// TUNSETIFF on the filter (ENOSYS: none does).
		wantNext string
	}{
		{name: "the agent answers within readDeadline, leaving the call to the kernel, and serves the listener's next call", wantNext: OutcomeNAPI},
		{name: "with maxStalledReads reads still stalled, the agent answers at once without reading", stalled: maxStalledReads, wantNext: OutcomeNAPI},
		{name: "Close returns within StopGrace and the listener's next call gets ENOSYS, as when napitapd dies", stop: "close", wantNext: "ENOSYS"},
		{name: "Detach returns within StopGrace and the agent that adopts the listener serves its next call", stop: "detach", wantNext: OutcomeNAPI},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			outcomes := make(chan string, 8)
			w := &logBuf{t: t}
			newAgent := func() *Agent {
				a, err := New(reg, slog.New(slog.NewTextHandler(w, nil)), Options{Observe: func(o string, _ time.Duration) { outcomes <- o }})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(a.Close)
				return a
			}
			outcome := func(within time.Duration) string {
				select {
				case o := <-outcomes:
					return o
				case <-time.After(within):
					return fmt.Sprintf("no answer within %v", within)
				}
			}
			agent := newAgent()
			agent.stalled.Store(tc.stalled)
			page, err := uffdtest.New()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(page.Release) // whatever the outcome: no thread stays
			c := startStalledCall(t, pod.Path(), tap, agent, page)
			var tid int
			select {
			case tid = <-c.tid:
			case err := <-c.stalled:
				t.Fatalf("the caller never made its TUNSETIFF: %v", err)
			}
			start := time.Now()
			// within runs fn, a stop, which must return within stopGrace.
			within := func(what string, fn func()) {
				done := make(chan struct{})
				go func() { fn(); close(done) }()
				select {
				case <-done:
					t.Logf("%s returned after %v", what, time.Since(start).Round(time.Millisecond))
				case <-time.After(stopGrace):
					t.Errorf("%s has not returned after %v with a read of a caller's memory stalled", what, stopGrace)
					page.Release() // or it never does
					<-done
				}
			}
			bound := readDeadline + 500*time.Millisecond // on a loaded machine
			switch {
			case tc.stop != "":
				waitFor(t, 5*time.Second, "the agent reading the caller's memory", func() bool { return uffdtest.ThreadIn(os.Getpid(), unix.SYS_PROCESS_VM_READV) })
				bound = stopGrace
			case tc.stalled > 0:
				bound = readDeadline / 2
			}
			switch tc.stop {
			case "close":
				within("Agent.Close", agent.Close)
			case "detach":
				var ls []Listener
				within("Agent.Detach", func() { ls = agent.Detach() })
				next := newAgent()
				for _, l := range ls {
					if err := next.Adopt(l); err != nil {
						t.Errorf("Adopt: %v", err)
					}
				}
				if len(ls) != 1 {
					t.Errorf("Detach handed over %d listeners, want 1", len(ls))
				}
			}
			if o := outcome(5 * time.Second); o != OutcomePassed || time.Since(start) > bound {
				t.Fatalf("the agent answered the stalled TUNSETIFF: %s, after %v; want %s within %v", o, time.Since(start), OutcomePassed, bound)
			}
			if !strings.Contains(w.String(), fmt.Sprintf("left to the kernel (no NAPI)\" pid=%d", tid)) {
				t.Errorf("no log line leaves the call of pid %d to the kernel", tid)
			}
			// CONTINUE: the caller's own copy_from_user waits on its page.
			wchan := fmt.Sprintf("/proc/self/task/%d/wchan", tid)
			waitFor(t, 5*time.Second, "the caller waiting in handle_userfault", func() bool {
				b, _ := os.ReadFile(wchan)
				return string(b) == "handle_userfault"
			})
			agent.stalled.Add(-tc.stalled)
			ifr, _ := unix.NewIfreq(tap)
			ifr.SetUint16(qemuFlags)
			if err := page.Fill(unsafe.Slice((*byte)(unsafe.Pointer(ifr)), unsafe.Sizeof(*ifr))); err != nil {
				t.Fatal(err)
			}
			// The first queue: TUNGETIFF shows its flags.
			if err := <-c.stalled; err != nil || c.flags&unix.IFF_NAPI != 0 {
				t.Errorf("the stalled TUNSETIFF: %v, flags 0x%x; want the kernel's own attach: 0, no IFF_NAPI", err, c.flags)
			}
			waitFor(t, 5*time.Second, "the given-up read ending once the page is filled", func() bool { return agent.stalled.Load() == 0 })
			c.goOn()
			err = <-c.next
			got := "ENOSYS"
			if !errors.Is(err, unix.ENOSYS) {
				got = outcome(5 * time.Second)
			}
			if got != tc.wantNext || (got != "ENOSYS" && err != nil) {
				t.Errorf("the next TUNSETIFF on the filter: %v, answered %s; want %s", err, got, tc.wantNext)
			}
		})
	}
}
