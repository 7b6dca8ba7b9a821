package seccompagent

import (
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/tapsetup"
)

// A filter installed without SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV, as
// runc 1.1 (libseccomp 2.5) installs every OCI profile, lets a signal
// interrupt the caller while the agent works, and the kernel restarts
// the TUNSETIFF, which comes back as a new notification on an fd the
// agent has attached already. Answered by the kernel, that is EEXIST, and
// QEMU or libvirt fail to start ("Device or resource busy"). The answer
// that went out does not tell: it fails with ENOENT when the caller has
// left, but also succeeds when the signal crossed it (the woken caller
// prefers its signal to a reply it has not collected yet). So a listener
// remembers the queue it last attached for each caller thread, and that
// thread's next TUNSETIFF, on the same fd and the same tap, gets the 0
// the attach earned. The one difference from the kernel: a thread that
// repeats TUNSETIFF on the very fd the agent just attached for it gets 0,
// not EEXIST; no runtime does that (Cloud Hypervisor repeats it on fds
// another process opened, which are not remembered).

// attachedQueue is a caller's fd the agent attached.
type attachedQueue struct {
	fd      int32 // the caller's fd number
	tap     string
	netnsID uint64
}

// maxRecentAttaches bounds what a listener remembers: a thread that dies
// never comes back for its entry.
const maxRecentAttaches = 256

// recentAttaches is the queue last attached for each caller thread. The
// listener's goroutine owns it.
type recentAttaches map[uint32]attachedQueue

// take returns and forgets what tid left: only that thread's next
// TUNSETIFF can be the restarted one.
func (r recentAttaches) take(tid uint32) *attachedQueue {
	q, ok := r[tid]
	if !ok {
		return nil
	}
	delete(r, tid)
	return &q
}

func (r recentAttaches) put(tid uint32, q attachedQueue) {
	if _, ok := r[tid]; !ok && len(r) >= maxRecentAttaches {
		for old := range r {
			delete(r, old)
			break
		}
	}
	r[tid] = q
}

// restartOf reports whether fd, the caller's fd number fdNum, attached
// already, is the queue prev names: the same fd, attached to the tap the
// caller asks for, in the same netns.
func restartOf(prev *attachedQueue, fd int, fdNum int32, name string) bool {
	if prev == nil || prev.fd != fdNum || prev.tap != name {
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
	id, err := tapsetup.NetnsIDOf(nsfd)
	return err == nil && id == prev.netnsID
}
