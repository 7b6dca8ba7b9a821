// Package safefile keeps napitap's root-written files and sockets where
// only root can put them: a directory another user may write to would let
// that user swap a file napitap writes for a symlink to any file on the
// node, or put a socket of theirs where runtimes look for napitapd's.
package safefile

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// TrustedDir makes dir (and its parents) with perm if missing, then refuses
// it unless it is a real directory owned by this process's euid that
// neither group nor others may write: MkdirAll keeps whatever owner and
// mode a directory made beforehand has.
func TrustedDir(dir string, perm os.FileMode) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return fmt.Errorf("dir %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("dir %s: %w", dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("dir %s: not a directory (a symlink?)", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("dir %s: owned by uid %d, not %d: refusing a directory someone else controls", dir, st.Uid, os.Geteuid())
	case st.Mode&0o022 != 0:
		return fmt.Errorf("dir %s: mode %04o lets group or others write it", dir, st.Mode&0o7777)
	}
	return nil
}

// WriteAtomic replaces path with b through path+".tmp" and a rename, so a
// reader never sees half a file. The temp file is created afresh, never
// through a symlink or into a file someone else made.
func WriteAtomic(path string, b []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	// A writer killed between write and rename leaves this behind; a
	// symlink there is removed, not followed.
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// Listen makes a unix socket ("unix" or "unixpacket") at path, in a
// TrustedDir: a stale socket is removed, and mode and group are applied
// before anyone can connect (the umask keeps it root's alone until then).
func Listen(network, path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	if err := TrustedDir(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if gid >= 0 {
		if err := os.Chown(path, 0, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("chown %s to gid %d: %w", path, gid, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return l, nil
}
