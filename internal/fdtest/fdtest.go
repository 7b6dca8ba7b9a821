// Package fdtest compares open files for tests that pass fds between
// processes: the fd holder, napitapd's store, the node e2e.
package fdtest

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// kcmpFile is kcmp(2)'s KCMP_FILE, which x/sys/unix does not name.
const kcmpFile = 0

// Same: fd1 of pid1 and fd2 of pid2 are the same open file (kcmp(2)
// KCMP_FILE), not just the same inode. Comparing another process's fds
// needs ptrace access to it.
func Same(pid1, fd1, pid2, fd2 int) (bool, error) {
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(pid1), uintptr(pid2), kcmpFile, uintptr(fd1), uintptr(fd2), 0)
	if errno != 0 {
		return false, errno
	}
	return r == 0, nil
}

// SameFile: a and b, both this process's, are the same open file.
func SameFile(t testing.TB, a, b *os.File) bool {
	t.Helper()
	same, err := Same(os.Getpid(), FD(t, a), os.Getpid(), FD(t, b))
	if err != nil {
		t.Fatalf("kcmp: %v", err)
	}
	return same
}

// FD is f's fd, read without Fd, which would make it blocking.
func FD(t testing.TB, f *os.File) int {
	t.Helper()
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		t.Fatal(err)
	}
	return fd
}
