// Package safefile keeps napitap's root-written files where only root can
// put them: a directory another user may write to would let that user swap
// a file napitap writes for a symlink to any file on the node, or put a
// socket of theirs where runtimes look for napitapd's.
package safefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

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
