package seccompagent

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NetnsID returns the NS_GET_ID of the network namespace at path (a
// /run/netns file, /proc/PID/ns/net): the key the Registry is asked with.
// Unlike an inode number, the ID is never reused while the machine runs.
func NetnsID(path string) (uint64, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("netns %s: %w", path, err)
	}
	defer unix.Close(fd)
	id, err := nsID(fd)
	if err != nil {
		return 0, fmt.Errorf("netns %s: %w", path, err)
	}
	return id, nil
}

func nsID(nsfd int) (uint64, error) {
	var id uint64
	if err := ioctlPtr(nsfd, unix.NS_GET_ID, unsafe.Pointer(&id)); err != nil {
		return 0, fmt.Errorf("NS_GET_ID: %w", err)
	}
	return id, nil
}

// fileNetns opens the network namespace of an open /dev/net/tun file: the
// one TUNSETIFF looks the name up in, whatever netns its holder is in now.
func fileNetns(tunfd int) (int, error) {
	nsfd, err := unix.IoctlRetInt(tunfd, unix.SIOCGSKNS)
	if err != nil {
		return -1, fmt.Errorf("SIOCGSKNS: %w", err)
	}
	return nsfd, nil
}

// netnsSwitcher looks links up in other network namespaces from a thread
// of napitapd's.
type netnsSwitcher struct {
	home int // napitapd's own netns, to come back to
}

func newNetnsSwitcher() (*netnsSwitcher, error) {
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("own netns: %w", err)
	}
	return &netnsSwitcher{home: fd}, nil
}

func (s *netnsSwitcher) close() { unix.Close(s.home) }

// linkExists reports whether a link named name exists in the netns nsfd.
// TUNSETIFF by napitapd on a name that is gone would create a tap with
// napitapd's rights, which the caller could not have done itself.
func (s *netnsSwitcher) linkExists(nsfd int, name string) (bool, error) {
	sock, err := s.socketIn(nsfd)
	if err != nil {
		return false, err
	}
	defer unix.Close(sock)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return false, err
	}
	// Any socket answers SIOCGIFINDEX for the netns it was made in.
	err = unix.IoctlIfreq(sock, unix.SIOCGIFINDEX, ifr)
	if errors.Is(err, unix.ENODEV) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("SIOCGIFINDEX %q: %w", name, err)
	}
	return true, nil
}

// socketIn makes a socket in the netns nsfd.
func (s *netnsSwitcher) socketIn(nsfd int) (int, error) {
	runtime.LockOSThread()
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("setns: %w", err)
	}
	sock, serr := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err := unix.Setns(s.home, unix.CLONE_NEWNET); err != nil {
		// This thread stays locked, and Go ends it with its goroutine,
		// rather than run anything else in a pod's netns.
		if serr == nil {
			unix.Close(sock)
		}
		return -1, fmt.Errorf("setns back to napitapd's netns: %w", err)
	}
	runtime.UnlockOSThread()
	if serr != nil {
		return -1, fmt.Errorf("socket: %w", serr)
	}
	return sock, nil
}
