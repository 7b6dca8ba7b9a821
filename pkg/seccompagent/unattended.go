package seccompagent

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Continued is what ContinueWaiting did on one listener.
type Continued struct {
	// Tids are the caller threads whose TUNSETIFF went on in the kernel.
	Tids []uint32
	// Left is a caller whose fd the slot records an attach of: the dead
	// napitapd may have attached it already, so the kernel would answer
	// EEXIST (restart.go); it stays in the slot for the next napitapd,
	// which answers 0, and the listener's later calls wait with it.
	Left uint32
}

// ContinueWaiting lets every TUNSETIFF waiting on listener go on in the
// kernel as if no agent were there: the caller opens its queue itself,
// without NAPI, rather than wait for a napitapd. It is for the fd holder
// (pkg/plainqueue), when no napitapd has been there to answer for too
// long, and the holder's caller must make sure none is. slotFile is the
// listener's slot or nil; a notification RECV takes is written there
// first, as the agent does, so that a holder killed before its answer
// leaves it to the next napitapd. Neither file is kept, and listener is
// not taken out of non-blocking mode.
func ContinueWaiting(listener, slotFile *os.File) (Continued, error) {
	s := &slot{d: new(slotData)}
	if slotFile != nil {
		mapped, err := mapSlot(slotFile, false)
		if err != nil {
			return Continued{}, err
		}
		defer mapped.unmap() // the file stays the caller's
		s = mapped
	}
	rc, err := listener.SyscallConn()
	if err != nil {
		return Continued{}, fmt.Errorf("seccomp listener: %w", err)
	}
	var done Continued
	var opErr error
	// The fd number is all the holder can compare without access to the
	// caller's memory; a new queue is a new fd, the attached one being open.
	attached := func(n *seccompNotif) bool {
		tid, q, ok := s.last()
		return ok && tid == n.Pid && uint64(q.fd) == n.Data.Args[0]
	}
	cont := func(fd int, n *seccompNotif) {
		err := notifSend(fd, n.ID, 0, true)
		switch {
		case err == nil:
			done.Tids = append(done.Tids, n.Pid)
		case !errors.Is(err, unix.ENOENT): // ENOENT: the caller left
			opErr = fmt.Errorf("SECCOMP_IOCTL_NOTIF_SEND for thread %d: %w", n.Pid, err)
		}
	}
	err = rc.Control(func(fdp uintptr) {
		fd := int(fdp)
		// A notification a dead napitapd received and never answered.
		if n := *s.notif(); n.ID != 0 && notifIDValid(fd, n.ID) {
			if attached(&n) {
				done.Left = n.Pid
				return
			}
			cont(fd, &n)
		}
		for opErr == nil {
			var n seccompNotif
			got, _, err := recvReady(fd, &n, s.notif())
			if err != nil {
				opErr = fmt.Errorf("SECCOMP_IOCTL_NOTIF_RECV: %w", err)
			}
			if !got {
				return
			}
			if attached(&n) {
				done.Left = n.Pid
				return
			}
			cont(fd, &n)
		}
	})
	return done, errors.Join(err, opErr)
}
