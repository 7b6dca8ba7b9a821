package tapsetup

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NetnsID identifies the network namespace at path by a number the kernel
// never gives to another namespace while it runs. An inode would not do:
// the kernel hands a freed netns inode to the next netns at once, so a key
// recorded for a pod that went could match the next pod's netns. Anything
// but a netns at path, a file left after the netns went included, is an
// error.
func NetnsID(path string) (uint64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	id, err := NetnsIDOf(fd)
	if err != nil {
		return 0, fmt.Errorf("netns %s: %w", path, err)
	}
	return id, nil
}

// ErrNoNetnsID marks a kernel that offers no unique netns id (before 5.14):
// callers fail closed.
var ErrNoNetnsID = errors.New("kernel offers no unique netns id (NS_GET_ID or SO_NETNS_COOKIE)")

// NetnsIDOf is NetnsID for an open netns file: NS_GET_ID (Linux 6.18) or,
// on older kernels, the netns cookie (SO_NETNS_COOKIE, 5.14) of a socket
// made inside it. On 6.18 the two are the same number.
func NetnsIDOf(fd int) (uint64, error) {
	if kind, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE); err != nil || kind != unix.CLONE_NEWNET {
		return 0, errors.New("not a network namespace")
	}
	var id uint64
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.NS_GET_ID, uintptr(unsafe.Pointer(&id)))
	switch errno {
	case 0:
		return id, nil
	case unix.ENOTTY, unix.EINVAL:
		return netnsCookie(fd)
	}
	return 0, fmt.Errorf("NS_GET_ID: %w", errno)
}

// netnsCookie enters the netns on a locked thread just long enough to make
// a socket there; the socket's cookie outlives the switch back. The
// thread's own netns needs no setns, and so no CAP_SYS_ADMIN: a process
// that is not root learns its own netns's id as it does from NS_GET_ID.
func netnsCookie(nsfd int) (uint64, error) {
	type result struct {
		cookie uint64
		err    error
	}
	res := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		defer func() { res <- r }()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			r.err = err
			return
		}
		defer unix.Close(self)
		if sameFile(self, nsfd) {
			r.cookie, r.err = socketNetnsCookie()
			runtime.UnlockOSThread()
			return
		}
		if r.err = unix.Setns(nsfd, unix.CLONE_NEWNET); r.err != nil {
			return
		}
		sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if unix.Setns(self, unix.CLONE_NEWNET) != nil {
			// Leave the thread locked: the runtime ends it with the
			// goroutine rather than reuse it in the wrong netns.
			if err == nil {
				unix.Close(sock)
			}
			r.err = errors.New("cannot return to the thread's own netns")
			return
		}
		runtime.UnlockOSThread()
		if err != nil {
			r.err = err
			return
		}
		r.cookie, r.err = sockNetnsCookie(sock)
		unix.Close(sock)
	}()
	r := <-res
	return r.cookie, r.err
}

// socketNetnsCookie is the cookie of the calling thread's netns.
func socketNetnsCookie() (uint64, error) {
	sock, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(sock)
	return sockNetnsCookie(sock)
}

func sockNetnsCookie(sock int) (uint64, error) {
	cookie, err := unix.GetsockoptUint64(sock, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if errors.Is(err, unix.ENOPROTOOPT) {
		err = ErrNoNetnsID
	}
	return cookie, err
}

// sameFile: fds a and b are the same inode (for nsfs: the same namespace).
func sameFile(a, b int) bool {
	var sa, sb unix.Stat_t
	return unix.Fstat(a, &sa) == nil && unix.Fstat(b, &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}
