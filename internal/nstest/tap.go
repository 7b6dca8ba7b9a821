package nstest

import (
	"fmt"

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
