package seccompagent

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is a seccomp listener as Detach hands it to the next napitapd,
// or the Store keeps it: the open file and what the agent knows of it.
type Listener struct {
	File *os.File
	// Slot is the memfd the agent receives the listener's notifications
	// in (slot.go); nil from a napitapd that had none.
	Slot *os.File
	UID  uint32 // the sender's, for its share of the listeners
	// PodRoot: the sender was uid 0 without napitapd's capabilities (a
	// pod's root), a tenant like any other uid; any other uid 0 was
	// napitapd's equal, which no bound refuses.
	PodRoot bool
	Origin  string // names it in logs
	// ID names the listener for the Store; the agent makes one when it
	// is empty.
	ID string
	// OwnTaps: the listener is napitapctl launch's, and the taps its
	// processes create get NAPI too (owntaps.go).
	OwnTaps bool
}

// Detach stops serving every listener and returns them open, for another
// napitapd to serve (Adopt): while any process holds a listener, its
// filter's notifications wait for an answer instead of failing (ENOSYS
// comes only when the last holder closes it). A notification being
// answered is answered first; one that arrives meanwhile stays queued in
// the kernel for the next holder. The agent serves nothing afterwards.
//
// Each listener comes with its slot, the caller's, which carries the last
// queue it attached (restart.go); what it remembered of the queues before
// stays behind: a TUNSETIFF that a signal restarts exactly across the
// takeover can get EEXIST from the kernel, as under a filter without
// SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV before the agent remembered.
func (a *Agent) Detach() []Listener {
	a.mu.Lock()
	a.stop()
	a.detaching = true
	for f := range a.listeners {
		// A deadline in the past wakes the goroutine parked in the poller
		// and leaves the file open; closing it would end the filter.
		_ = f.SetReadDeadline(time.Unix(1, 0))
	}
	a.mu.Unlock()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	out := a.detached
	a.detached = nil
	return out
}

// Adopt serves a listener another agent detached, or one the Store kept
// of a napitapd that died, as Add does (the same checks, counted against
// l.UID's share). The agent owns l.File and l.Slot from then on, error or
// not. Before anything new it answers the notification the slot shows
// received and not answered, whose caller still waits; a slot it cannot
// trust is replaced by a fresh one.
func (a *Agent) Adopt(l Listener) error {
	defer l.File.Close()
	fail := func(err error) error {
		if l.Slot != nil {
			l.Slot.Close()
		}
		return fmt.Errorf("listener from %s: %w", l.Origin, err)
	}
	rc, err := l.File.SyscallConn()
	if err != nil {
		return fail(err)
	}
	fd, dupErr := -1, error(nil)
	// A copy that add owns: l.File's own fd belongs to the os.File.
	if err := rc.Control(func(f uintptr) { fd, dupErr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return fail(err)
	}
	if dupErr != nil {
		return fail(fmt.Errorf("dup: %w", dupErr))
	}
	return a.add(fd, l)
}

// napitapds: the listener's sender was napitapd's equal.
func (l Listener) napitapds() bool { return l.UID == 0 && !l.PodRoot }
