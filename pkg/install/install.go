// Package install puts an executable into a directory that others exec
// from at any moment, such as the node's CNI bin dir, the way the DaemonSet's
// init container installs the napitap plugin: a runtime exec'ing it
// meanwhile runs the old file or the new one, never half of one.
package install

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Result is what Executable did.
type Result struct {
	Path   string // the installed file
	Size   int64
	SHA256 string // hex digest of what was written
	// Previous is the hex digest of the file it replaced; empty for a
	// first install.
	Previous string
}

// String says what happened, for the init container's log.
func (r Result) String() string {
	s := fmt.Sprintf("installed %s (%d bytes, sha256 %s)", r.Path, r.Size, r.SHA256)
	switch r.Previous {
	case "":
		return s + ", where there was none"
	case r.SHA256:
		return s + ", replacing an identical copy"
	default:
		return s + ", replacing one with sha256 " + r.Previous
	}
}

// Executable copies src into dir as name, mode 0755. It writes a temporary
// file in dir (O_EXCL, so never through a link), syncs it and renames it
// over dir/name: rename(2) swaps the name in one step, and it succeeds
// where opening a running executable for writing fails with ETXTBSY. A
// failed install removes its temporary file and leaves dir/name as it was.
//
// A symlink or anything but a regular file at dir/name is refused, not
// replaced: it is someone else's arrangement (a rename would replace the
// link itself, never write through it, so this is no defence against a
// link made after the check, and needs none).
func Executable(src, dir, name string) (Result, error) {
	if name == "" || name == "." || name == ".." || strings.ContainsRune(name, '/') {
		return Result{}, fmt.Errorf("install %q: not a file name", name)
	}
	dst := filepath.Join(dir, name)
	res := Result{Path: dst}

	in, err := os.Open(src)
	if err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}
	defer in.Close()
	if st, err := in.Stat(); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	} else if !st.Mode().IsRegular() {
		return res, fmt.Errorf("install %s: source %s is a %s, not a file", dst, src, kind(st.Mode()))
	}
	if st, err := os.Stat(dir); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	} else if !st.IsDir() {
		return res, fmt.Errorf("install %s: %s is not a directory", dst, dir)
	}
	if res.Previous, err = previous(dst); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}

	tmp, err := os.CreateTemp(dir, "."+name+".install-*")
	if err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := sha256.New()
	if res.Size, err = io.Copy(io.MultiWriter(tmp, h), in); err != nil {
		return res, fmt.Errorf("install %s: copy %s: %w", dst, src, err)
	}
	// Executable before it has the name a runtime execs, and on disk
	// before the rename, so that a crash cannot leave a renamed but empty
	// plugin behind.
	if err := tmp.Chmod(0o755); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}
	if err := tmp.Sync(); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}
	if err := tmp.Close(); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return res, fmt.Errorf("install %s: %w", dst, err)
	}
	done = true
	res.SHA256 = hex.EncodeToString(h.Sum(nil))
	if err := syncDir(dir); err != nil {
		return res, fmt.Errorf("install %s: installed, but: %w", dst, err)
	}
	return res, nil
}

// previous hashes the regular file at dst, "" if there is none, and
// refuses anything else there.
func previous(dst string) (string, error) {
	st, err := os.Lstat(dst)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	if st.Mode()&fs.ModeSymlink != 0 {
		target, _ := os.Readlink(dst)
		return "", fmt.Errorf("%s is a symlink (to %s), not replacing it: remove it to install here", dst, target)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is a %s, not replacing it", dst, kind(st.Mode()))
	}
	f, err := os.OpenFile(dst, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("read %s: %w", dst, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// syncDir makes the rename durable. Filesystems that cannot sync a
// directory (EINVAL) have nothing more to write.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "non-regular file"
}
