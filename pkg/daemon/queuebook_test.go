package daemon

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/metrics"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestEveryPlainQueueIsCountedOnceAndNamed: the book accounts for every
// open queue of an intercept tap, real queues of a real tap: one open
// before napitapd's first scan is unknown; one the agent attached is napi;
// one it left to the kernel, one the holder let go, one whose caller's
// ifreq it could not read, and one that never reached the agent are
// plain, each counted once under its reason and logged as a WARN naming
// its pod or attachment.
func TestEveryPlainQueueIsCountedOnceAndNamed(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "plainq")
	const tap = "plainq0"
	pod.Run(t, func() error { return nstest.MakePersistentTap(tap) })
	netnsID, err := tapsetup.NetnsID(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	// open attaches a queue in this process, plain, as a VMM not under
	// napitap's filter would; closeQueue closes one before the test ends.
	closed := map[int]bool{}
	closeQueue := func(fd int) { closed[fd] = true; unix.Close(fd) }
	open := func() int {
		var fd int
		pod.Run(t, func() error {
			var err error
			if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
				return err
			}
			ifr, err := unix.NewIfreq(tap)
			if err != nil {
				return err
			}
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
			return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		})
		t.Cleanup(func() {
			if !closed[fd] {
				unix.Close(fd)
			}
		})
		return fd
	}
	att := handoff.Attachment{Key: handoff.Key{ContainerID: "plainq-pod", IfName: "net1"}, Netns: pod.Path(), TapName: tap,
		Queues: 8, MultiQueue: true, NAPI: true, Intercept: true, NetnsID: netnsID}
	atts := []handoff.Attachment{att}
	var log syncbuf.Buffer
	m := metrics.New()
	b := newQueueBook(slog.New(slog.NewTextHandler(&log, nil)), m)
	const origin = "pod plainq-ns/plainq-vm container compute"
	b.keepOrigin("listener/L1", origin)
	// The agent tells the caller's process of a queue it attached, read
	// with its credentials; of one it left to the kernel, napitapd reads
	// it.
	event := func(fd int, napi bool, why string) seccompagent.QueueEvent {
		ev := seccompagent.QueueEvent{Tid: os.Getpid(), FD: int32(fd), NetnsID: netnsID, Tap: tap, Attachment: att.Key.String(), Listener: origin, NAPI: napi, Why: why}
		if napi {
			ev.PID = os.Getpid()
		}
		return ev
	}

	before := open()
	b.scan(atts)
	napi := open()
	b.agentEvent(event(napi, true, ""))
	left := open()
	b.agentEvent(event(left, false, "cannot read the caller's credentials"))
	bypass := open()
	b.scan(atts) // once: it may be an attach the agent has not told yet
	b.scan(atts)
	// The notes below are per process: the queue each explains is the
	// process's next unaccounted one.
	b.letGo(fdstore.LetGoReport{Calls: []fdstore.LetGo{{Entry: "listener/L1", Tid: uint32(os.Getpid()), At: time.Now()}}})
	letGo := open()
	b.scan(atts)
	b.agentEvent(seccompagent.QueueEvent{Tid: os.Getpid(), FD: -1, Listener: origin, Why: "the caller's ifreq could not be read in time"})
	unread := open()
	b.scan(atts)
	b.scan(atts)

	got := map[int]handoff.QueueState{}
	for _, st := range b.states(att) {
		got[st.FD] = st
	}
	tests := []struct {
		name       string
		fd         int
		napi       string
		reason     string
		warnNaming string
	}{
		{"a queue open before napitapd's first scan is unknown", before, handoff.QueueUnknown, "", ""},
		{"a queue the agent attached with NAPI is napi", napi, handoff.QueueNAPI, "", ""},
		{"a queue the agent left to the kernel is plain, left_to_kernel", left, handoff.QueuePlain, metrics.PlainLeftToKernel, origin},
		{"a queue that never reached the agent is plain, not_intercepted", bypass, handoff.QueuePlain, metrics.PlainNotIntercepted, att.Key.String()},
		{"a queue the holder let go is plain, holder_bounded_wait", letGo, handoff.QueuePlain, metrics.PlainHolderWait, origin},
		{"a queue whose caller's ifreq went unread is plain, caller_unreadable", unread, handoff.QueuePlain, metrics.PlainCallerUnreadable, origin},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, ok := got[tc.fd]
			if !ok {
				t.Fatalf("fd %d: no state; the book has %+v", tc.fd, got)
			}
			if st.NAPI != tc.napi || st.Reason != tc.reason || st.PID != os.Getpid() {
				t.Errorf("fd %d: %+v; want napi %q, reason %q, pid %d", tc.fd, st, tc.napi, tc.reason, os.Getpid())
			}
			if tc.reason == "" {
				return
			}
			if n := m.PlainQueues(tc.reason); n != 1 {
				t.Errorf("napitapd_plain_queues_total{reason=%q} = %v, want 1", tc.reason, n)
			}
			if !hasWarn(log.String(), tc.reason, tc.warnNaming) {
				t.Errorf("no WARN with reason=%s naming %q:\n%s", tc.reason, tc.warnNaming, log.String())
			}
		})
	}
	t.Run("a closed queue leaves the book at the next scan", func(t *testing.T) {
		closeQueue(bypass)
		b.scan(atts)
		for _, st := range b.states(att) {
			if st.FD == bypass {
				t.Errorf("fd %d closed, still in the book: %+v", bypass, st)
			}
		}
		if n := m.PlainQueues(metrics.PlainNotIntercepted); n != 1 {
			t.Errorf("not_intercepted = %v after the close, want still 1", n)
		}
	})
}

// hasWarn reports whether log has a WARN line with reason that names who.
func hasWarn(log, reason, who string) bool {
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "reason="+reason) && strings.Contains(line, who) {
			return true
		}
	}
	return false
}
