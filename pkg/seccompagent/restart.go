package seccompagent

import (
	"errors"

	"golang.org/x/sys/unix"
)

// A filter installed without SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, as
// runc 1.1 and libseccomp < 2.6 install every OCI profile, lets a signal
// interrupt the caller while the agent works: the answer then finds no
// notification (ENOENT), and the kernel restarts the TUNSETIFF, which
// comes back as a new notification on an fd the agent has attached
// already. Answered by the kernel that would be EEXIST, and QEMU or
// libvirt would fail to start ("Device or resource busy"). So a listener
// remembers the queue whose answer was lost, per caller thread, and the
// thread's next TUNSETIFF, on that fd and that tap, gets the 0 the first
// one earned.

// attachedQueue is a caller's fd the agent attached.
type attachedQueue struct {
	fd      int32 // the caller's fd number
	tap     string
	netnsID uint64
}

// maxLostAnswers bounds what a listener remembers: a thread killed after
// a lost answer never comes back for its entry.
const maxLostAnswers = 64

// lostAnswers are the attached queues whose answer found no caller, by
// caller thread. One listener goroutine owns it.
type lostAnswers map[uint32]attachedQueue

// take returns and forgets what tid left: only the very next TUNSETIFF
// of that thread can be the restarted one.
func (l lostAnswers) take(tid uint32) *attachedQueue {
	q, ok := l[tid]
	if !ok {
		return nil
	}
	delete(l, tid)
	return &q
}

func (l lostAnswers) put(tid uint32, q attachedQueue) {
	if len(l) >= maxLostAnswers {
		clear(l)
	}
	l[tid] = q
}

// restartOf reports whether fd (the caller's fd number fdNum, attached
// already) is the queue lost names: the same fd, attached to the tap the
// caller asks for, in the same netns.
func restartOf(lost *attachedQueue, fd int, fdNum int32, name string) bool {
	if lost == nil || lost.fd != fdNum || lost.tap != name {
		return false
	}
	ifr, err := unix.NewIfreq("")
	if err != nil || unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr) != nil || ifr.Name() != name {
		return false
	}
	nsfd, err := fileNetns(fd)
	if err != nil {
		return false
	}
	defer unix.Close(nsfd)
	id, err := nsID(nsfd)
	return err == nil && id == lost.netnsID
}

// lostAnswer: the answer to a notification found no caller waiting.
func lostAnswer(err error) bool { return errors.Is(err, unix.ENOENT) }
