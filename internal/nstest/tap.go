package nstest

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// MakePersistentTap makes a multiqueue tap with no queue attached in the
// calling thread's netns, as napitap leaves one in intercept mode; it goes
// with its netns.
func MakePersistentTap(name string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1)
}

// OnThreadThatEnds runs fn in a goroutine locked to a thread that ends
// with it, for what cannot be undone on a thread (a seccomp filter, a
// setns kept). Go keeps the main thread (wedged) when a goroutine locked
// to it exits, so that one is held while another goroutine takes another
// thread.
func OnThreadThatEnds(fn func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			fn() // never unlocked
			return
		}
		held := make(chan struct{})
		OnThreadThatEnds(func() {
			defer close(held)
			fn()
		})
		<-held
		runtime.UnlockOSThread()
	}()
}
