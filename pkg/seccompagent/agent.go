// Package seccompagent makes napitapd a seccomp user-notification agent:
// a runtime that opens napitap's tap by name (libvirt, QEMU ifname=, Kata,
// Cloud Hypervisor, Firecracker) runs under a filter that sends its
// TUNSETIFF here, and the agent performs that TUNSETIFF on the caller's
// own open file with IFF_NAPI added (DESIGN.md facts 11-13).
//
// Agent serves listener fds; Server takes them from runc, crun or
// `napitapctl launch` over a unix socket; Filter, InstallFilter and Launch
// are the caller's side.
package seccompagent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/unixsock"
)

const (
	// DefaultMaxListeners bounds the listeners one agent serves: one per
	// container or launched runtime on the node.
	DefaultMaxListeners = 1024
	// DefaultMaxListenersPerUID bounds those of one tenant: a sender uid,
	// root's included, unless the sender is napitapd's equal (pkg/peer),
	// as runc and Kata's shim are, whose listeners no bound refuses. A
	// pod's root is a tenant. A uid of the socket's group that launches
	// VMMs itself (napitapctl launch)
	// may run every VM pod of the node: KubeVirt runs each VM's QEMU as
	// uid 107, and a node runs up to the kubelet's max-pods (110 by
	// default; 250 is the most the managed Kubernetes services set). A
	// listener lasts as long as its VM, so 64 refused the 65th VM for
	// good (napitap-bench capacity, issue 36). 256 is a quarter of
	// DefaultMaxListeners: a flood from one tenant still leaves the other
	// tenants 768.
	DefaultMaxListenersPerUID = 256
)

// ErrFull is returned by Add when the agent serves as many listeners as
// it may, in all or for the sender's uid.
var ErrFull = errors.New("seccomp agent: too many listeners")

// Options tune an Agent; the zero value is fine.
type Options struct {
	MaxListeners int // DefaultMaxListeners when 0
	// MaxListenersPerUID: DefaultMaxListenersPerUID when 0, and at most
	// half of MaxListeners.
	MaxListenersPerUID int
	// AttachLevel is the log level of "attached with NAPI", one line per
	// queue; Info when zero.
	AttachLevel slog.Level
	// Store keeps copies of the listeners outside napitapd; nil: none.
	Store Store
	// Observe, if set, is told how each TUNSETIFF was answered, one of
	// the Outcome* strings, and how long the answer took from the
	// notification's read (napitapd's metrics).
	Observe func(outcome string, took time.Duration)
	// OnQueue, if set, is told of each queue of a napitap tap the agent
	// attached with NAPI or left to the kernel without, once the answer is
	// out: napitapd's record of which queues have NAPI (napitapctl node)
	// and its count of plain ones (napitapd_plain_queues_total).
	OnQueue func(QueueEvent)
}

// QueueEvent is one TUNSETIFF the agent answered for a napitap tap
// (Options.OnQueue).
type QueueEvent struct {
	Tid        int    // the caller's thread
	PID        int    // its process, read with its credentials while it was blocked in the call; 0: unread
	FD         int32  // the caller's fd number
	NetnsID    uint64 // the tap's netns (tapsetup.NetnsID); 0 with Tap ""
	Tap        string // "" when the agent could not read which tap
	Attachment string // napitapd's key of the tap's attachment
	Listener   string // the listener's origin: the pod or launched command
	// NAPI: the agent attached the queue with IFF_NAPI. Otherwise the
	// kernel ran the caller's own TUNSETIFF, without it, for Why.
	NAPI bool
	Why  string
	// NAPIOff: the network sets napi false; plain by choice.
	NAPIOff bool
}

// How a TUNSETIFF was answered (Options.Observe).
const (
	OutcomeNAPI    = "napi"           // the caller's queue attached with IFF_NAPI
	OutcomePassed  = "passed_through" // not napitap's to answer: the kernel did
	OutcomeRefused = "refused"        // an errno the kernel would give (EPERM, EINVAL)
	OutcomeError   = "error"          // napitapd failed to answer
)

// Store keeps copies of the agent's listeners outside napitapd's process
// (pkg/fdstore, through pkg/daemon), so that a napitapd killed by SIGKILL
// or the OOM killer loses none of them. Keep copies l.File through its
// SyscallConn, not Fd, which would take the listener the agent serves out
// of non-blocking mode.
type Store interface {
	Keep(l Listener)  // l.File and l.Slot are lent: the store copies what it keeps, before returning
	Forget(id string) // the listener is done: every process under its filter has exited
}

// Agent answers TUNSETIFF notifications for any number of listeners, one
// goroutine each, parked in Go's poller between notifications.
type Agent struct {
	reg         Registry
	log         *slog.Logger
	quota       unixsock.UIDQuota // listeners per sender uid
	attachLevel slog.Level
	store       Store
	observe     func(outcome string, took time.Duration)
	onQueue     func(QueueEvent)

	mu        sync.Mutex
	listeners map[*os.File]string
	closed    bool
	wg        sync.WaitGroup
	// detaching: Detach wakes the goroutines, which leave their listener
	// open in detached instead of closing it.
	detaching bool
	detached  []Listener
	// quit is closed by Close and Detach: a read of a caller's memory
	// still under way is given up (readCallerIfreq).
	quit    chan struct{}
	stalled atomic.Int32 // reads given up and still blocked in the kernel
	// givenUp spaces out the log lines about them, which a caller that
	// stalls call after call would repeat.
	givenUp unixsock.Every

	// beforeReply, for tests (set under mu), runs after the decision and
	// before the answer, attached telling whether the caller's fd was
	// attached: where a signal or napitapd's death hurts most.
	beforeReply func(tid int, attached bool)
}

// New makes an agent that gives NAPI to the taps reg names.
func New(reg Registry, logger *slog.Logger, opts Options) (*Agent, error) {
	if opts.MaxListeners <= 0 {
		opts.MaxListeners = DefaultMaxListeners
	}
	if opts.MaxListenersPerUID <= 0 {
		opts.MaxListenersPerUID = DefaultMaxListenersPerUID
	}
	opts.MaxListenersPerUID = max(1, min(opts.MaxListenersPerUID, opts.MaxListeners/2))
	return &Agent{
		reg: reg, log: logger, attachLevel: opts.AttachLevel, store: opts.Store, observe: opts.Observe, onQueue: opts.OnQueue,
		quota:     unixsock.UIDQuota{Max: opts.MaxListeners, MaxPerUID: opts.MaxListenersPerUID},
		givenUp:   unixsock.Every{Interval: 10 * time.Second},
		listeners: map[*os.File]string{}, quit: make(chan struct{}),
	}, nil
}

// Add serves the seccomp listener fd until every process under its filter
// has exited. The agent owns fd from then on, error or not. uid is the
// sender's, for its share of the listeners; origin names it in logs.
func (a *Agent) Add(fd int, uid uint32, origin string) error {
	return a.add(fd, Listener{UID: uid, Origin: origin})
}

// add serves fd as l describes it (l.File aside); it owns fd and l.Slot.
func (a *Agent) add(fd int, l Listener) error {
	fail := func(format string, args ...any) error {
		unix.Close(fd)
		if l.Slot != nil {
			l.Slot.Close()
		}
		return fmt.Errorf("listener from %s: "+format, append([]any{l.Origin}, args...)...)
	}
	if target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd)); err != nil || target != "anon_inode:seccomp notify" {
		return fail("fd is %q, not a seccomp listener", target)
	}
	// Non-blocking, so that os.NewFile hands it to Go's poller: a parked
	// listener costs a goroutine, not a thread.
	if err := unix.SetNonblock(fd, true); err != nil {
		return fail("%w", err)
	}
	if err := notifSyncWakeUp(fd); err != nil {
		// Only slower for it.
		a.log.Warn("seccomp listener: no synchronous wake-ups", "listener", l.Origin, "err", err)
	}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return fail("agent closed")
	}
	if ok, why := a.quota.Admit(l.UID, l.napitapds()); !ok {
		a.mu.Unlock()
		return fail("%w: %s (%d for every tenant together, %d per uid; a pod's root is a tenant)", ErrFull, why, a.quota.Max, a.quota.MaxPerUID)
	}
	f := os.NewFile(uintptr(fd), "seccomp-listener")
	a.listeners[f] = l.Origin
	a.wg.Add(1)
	a.mu.Unlock()

	s := takeSlot(l.Slot, a.log.With("listener", l.Origin))
	if l.ID == "" {
		l.ID = newListenerID()
	}
	l.File, l.Slot = f, s.f
	if a.store != nil {
		// Before the goroutine, whose Forget must come after, and before
		// Add returns: the sender's listener is in the holder by the time
		// the socket's server reads the next message.
		a.store.Keep(l)
	}
	go a.serve(l, s)
	return nil
}

// Listeners counts the listeners being served.
func (a *Agent) Listeners() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.listeners)
}

// Origins names the listeners served, sorted.
func (a *Agent) Origins() []string {
	a.mu.Lock()
	out := make([]string, 0, len(a.listeners))
	for _, origin := range a.listeners {
		out = append(out, origin)
	}
	a.mu.Unlock()
	slices.Sort(out)
	return out
}

// Close stops serving and closes every listener and its slot. The
// processes under them get ENOSYS from then on for TUNSETIFF, as when
// napitapd dies, unless the Store keeps the listeners: then their
// TUNSETIFFs wait for the next napitapd, which is why Close forgets none.
func (a *Agent) Close() {
	a.mu.Lock()
	a.stop()
	for f := range a.listeners {
		f.Close() // wakes its goroutine out of the poller
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// stop, under mu, ends serving: a goroutine waiting on a read of a
// caller's memory leaves it at once.
func (a *Agent) stop() {
	if !a.closed {
		close(a.quit)
	}
	a.closed = true
}

func (a *Agent) isClosed() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.closed
}

func (a *Agent) serve(l Listener, s *slot) {
	defer a.wg.Done()
	defer a.quota.Done(l.UID, l.napitapds())
	f := l.File
	log := a.log.With("listener", l.Origin)
	exited := false
	defer func() {
		a.mu.Lock()
		delete(a.listeners, f)
		left := len(a.listeners)
		if a.detaching && !exited {
			l.Slot = s.release()
			a.detached = append(a.detached, l)
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		f.Close()
		s.close()
		if exited {
			if a.store != nil {
				a.store.Forget(l.ID)
			}
			// Info: the pair of "serving seccomp listener", so that a
			// node's log shows every listener let go.
			log.Info("seccomp listener done: every process under its filter has exited", "listeners", left)
		}
	}()
	rc, err := f.SyscallConn()
	if err != nil {
		log.Error("seccomp listener", "err", err)
		return
	}
	a.mu.Lock()
	hook := a.beforeReply
	a.mu.Unlock()
	sock := newNetnsSocket()
	defer sock.close()
	var sysf syscallFile
	defer sysf.close()
	recent := recentAttaches{}
	var own ownTaps
	if l.OwnTaps {
		own = ownTaps{}
	}
	// What a napitapd that died serving this listener left in its slot,
	// before anything new: its last attach, for that TUNSETIFF's restart,
	// and the notification it received and never answered, whose caller
	// still waits (if the dead one attached its fd, that record answers
	// 0).
	if tid, q, ok := s.last(); ok {
		recent.put(tid, q)
	}
	// The slot is a record for the next napitapd, never an input to this
	// one's decisions: a notification is acted on only once the kernel
	// confirms it (pending, and its caller blocked in that very call),
	// whether a dead napitapd left it there or RECV just wrote it.
	attachedAt := time.Time{} // of the slot's record, while it may be wanted
	confirmAndAnswer := func(fd int, n *seccompNotif, confirmed string) {
		gone, err := confirmReceived(fd, n, &sysf)
		switch {
		case gone:
			// Its caller left the call and makes it again: a new one.
		case err != nil:
			log.Warn("a TUNSETIFF's record does not match its caller: left to the kernel", "pid", n.Pid, "err", err)
			_ = notifSend(fd, n.ID, 0, true)
		default:
			if confirmed != "" {
				log.Info(confirmed, "pid", n.Pid)
			}
			if a.answer(fd, n, s, sock, recent, own, hook, l.Origin, log) {
				attachedAt = time.Now()
			}
		}
	}
	if n := *s.notif(); n.ID != 0 {
		_ = rc.Control(func(fd uintptr) {
			if notifIDValid(int(fd), n.ID) {
				confirmAndAnswer(int(fd), &n, "answering a TUNSETIFF the previous napitapd received and never answered")
			}
		})
	}
	// Under Detach's lock: its deadline in the past must not be undone.
	setDeadline := func(t time.Time) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if !a.closed {
			_ = f.SetReadDeadline(t)
		}
	}
	var n seccompNotif
	for {
		var got, hup bool
		var recvErr error
		err := rc.Read(func(fd uintptr) bool {
			got, hup, recvErr = recvReady(int(fd), &n, s.notif())
			return got || hup || recvErr != nil
		})
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded) && !attachedAt.IsZero() && !a.isClosed():
			// The last attach's restart window is over: its record would
			// only make the fd holder leave a later call on the same fd
			// number (a NIC hot-plugged after one was removed) to the
			// next napitapd (plainqueue).
			s.putLast(lastAttach{})
			attachedAt = time.Time{}
			setDeadline(time.Time{})
			continue
		case err != nil:
			if !a.isClosed() {
				log.Error("waiting on the seccomp listener", "err", err)
			}
			return
		case recvErr != nil:
			log.Error("SECCOMP_IOCTL_NOTIF_RECV", "err", recvErr)
			return
		case hup:
			exited = true
			return
		}
		before := attachedAt
		_ = rc.Control(func(fd uintptr) { confirmAndAnswer(int(fd), &n, "") })
		if attachedAt != before {
			setDeadline(attachedAt.Add(restartWindow))
		}
	}
}

// restartWindow is how long an attach's record stays in the slot after the
// answer: a signal that interrupts the caller makes the kernel restart its
// TUNSETIFF at once (restart.go), well within it.
const restartWindow = time.Second

// recvReady takes a pending notification if there is one, without
// blocking (the kernel's RECV ignores O_NONBLOCK, so poll first): RECV
// writes it into the slot's record, so that a napitapd killed from then
// on leaves it to the next (the kernel marks it received, and never hands
// it out again), and it is copied into n, which the caller confirms
// before acting on it: the slot is shared memory.
func recvReady(fd int, n, record *seccompNotif) (got, hup bool, err error) {
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, 0); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return false, false, err
		}
		switch {
		case pfd[0].Revents&unix.POLLIN != 0:
			err := notifRecv(fd, record)
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINTR) {
				continue // the caller was killed meanwhile
			}
			if err == nil {
				*n = *record
			}
			return err == nil, false, err
		case pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0:
			return false, true, nil
		}
		return false, false, nil
	}
}

// answer answers n, which s records.
func (a *Agent) answer(listener int, n *seccompNotif, s *slot, sock *netnsSocket, recent recentAttaches, own ownTaps, hook func(int, bool), origin string, log *slog.Logger) (attached bool) {
	start := time.Now()
	defer func() {
		// A panic must not end the listener's goroutine, which would close
		// the listener: every process under it would get ENOSYS for good.
		if r := recover(); r != nil {
			log.Error("panic answering a notification: left to the kernel", "pid", n.Pid, "panic", r, "stack", string(debug.Stack()))
			_ = notifSend(listener, n.ID, 0, true)
			a.observed(OutcomeError, time.Since(start))
		}
	}()
	prev := recent.take(n.Pid)
	was := s.d.Last
	v := a.decide(listener, n, sock, prev, s, own)
	switch {
	case v.queue != nil:
		// In the slot before the answer: the next napitapd answers a
		// caller this one attached and then died on 0, not EEXIST.
		s.setLast(n.Pid, *v.queue)
	case s.d.Last != was:
		s.putLast(was) // decide announced an attach that did not happen
	}
	if v.gone {
		if prev != nil {
			recent.put(n.Pid, *prev) // interrupted again: still to restart
		}
		return v.queue != nil
	}
	if hook != nil {
		hook(int(n.Pid), !v.cont && v.errno == 0)
	}
	err := notifSend(listener, n.ID, v.errno, v.cont)
	took := time.Since(start)
	// The caller now waits on this CPU (notifSyncWakeUp) for as long as
	// this thread runs on, through what follows and Go's parking: let it
	// run first.
	if err == nil {
		schedYield()
	}
	if v.announce != nil {
		v.announce()
	}
	switch {
	case v.queue != nil:
		// Even when the answer went out: a signal may have crossed it.
		recent.put(n.Pid, *v.queue)
	case prev != nil && errors.Is(err, unix.ENOENT):
		recent.put(n.Pid, *prev)
	}
	if err != nil && !errors.Is(err, unix.ENOENT) {
		log.Error("SECCOMP_IOCTL_NOTIF_SEND", "pid", n.Pid, "err", err)
		a.observed(OutcomeError, took)
		return v.queue != nil
	}
	if v.event != nil && a.onQueue != nil {
		ev := *v.event
		ev.Tid, ev.FD, ev.Listener = int(n.Pid), int32(n.Data.Args[0]), origin
		a.onQueue(ev)
	}
	switch {
	case v.cont:
		a.observed(OutcomePassed, took)
	case v.errno != 0:
		a.observed(OutcomeRefused, took)
	default:
		a.observed(OutcomeNAPI, took)
	}
	return v.queue != nil
}

// observed tells Observe of an answer and how long it took, from the
// notification's read to the answer's send: what the caller waited for
// napitapd beyond the kernel's own work and the wakeups.
func (a *Agent) observed(outcome string, took time.Duration) {
	if a.observe != nil {
		a.observe(outcome, took)
	}
}
