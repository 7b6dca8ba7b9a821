package seccompagent

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is a seccomp listener as Detach hands it to the next napitapd:
// the open file and what the agent knows of it.
type Listener struct {
	File   *os.File
	UID    uint32 // the sender's, for its share of the listeners
	Origin string // names it in logs
}

// Detach stops serving every listener and returns them open, for another
// napitapd to serve (Adopt): while any process holds a listener, its
// filter's notifications wait for an answer instead of failing (ENOSYS
// comes only when the last holder closes it). A notification being
// answered is answered first; one that arrives meanwhile stays queued in
// the kernel for the next holder. The agent serves nothing afterwards.
//
// What each listener remembered of the queues it attached (restart.go)
// stays behind: a TUNSETIFF that a signal restarts exactly across the
// takeover can get EEXIST from the kernel, as under a filter without
// SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV before the agent remembered.
func (a *Agent) Detach() []Listener {
	a.mu.Lock()
	a.closed, a.detaching = true, true
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

// Adopt serves a listener another agent detached, as Add does (the same
// checks, counted against l.UID's share). The agent owns l.File from then
// on, error or not.
func (a *Agent) Adopt(l Listener) error {
	defer l.File.Close()
	rc, err := l.File.SyscallConn()
	if err != nil {
		return fmt.Errorf("listener from %s: %w", l.Origin, err)
	}
	fd, dupErr := -1, error(nil)
	// A copy that Add owns: l.File's own fd belongs to the os.File.
	if err := rc.Control(func(f uintptr) { fd, dupErr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return fmt.Errorf("listener from %s: %w", l.Origin, err)
	}
	if dupErr != nil {
		return fmt.Errorf("listener from %s: dup: %w", l.Origin, dupErr)
	}
	return a.Add(fd, l.UID, l.Origin)
}
