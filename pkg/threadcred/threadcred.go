// Package threadcred runs a function on an OS thread of its own that has
// taken on another process's credentials. Linux keeps credentials per
// thread (the raw setresuid, setresgid, setgroups and capset calls change
// only the calling thread; glibc and Go's syscall package broadcast them to
// every thread), so napitapd can make a system call on a caller's behalf
// with exactly the caller's rights: the kernel then judges the caller, not
// napitapd. The thread is locked to the function and never returned to Go's
// scheduler: it exits when the function returns.
package threadcred

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Creds are what the thread takes on.
type Creds struct {
	UID    uint32   // real, effective, saved and filesystem uid
	GID    uint32   // real, effective, saved and filesystem gid
	Groups []uint32 // supplementary groups
	// Caps are the capabilities (CAP_* bits) left in the thread's
	// permitted and effective sets; all others are dropped.
	Caps uint64
}

// Run runs fn on a new OS thread with c. The caller needs CAP_SETUID,
// CAP_SETGID and every capability in c.Caps.
func Run(c Creds, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread carries c until it exits with this
		// goroutine, and no other goroutine ever runs on it.
		runtime.LockOSThread()
		if err := become(c); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

// become changes the calling thread's credentials to c: groups first and
// uid last, while the thread still has CAP_SETGID and CAP_SETUID; keep-caps
// so that the uid change leaves the permitted set for capset to cut down.
func become(c Creds) error {
	var groups unsafe.Pointer
	if len(c.Groups) > 0 {
		groups = unsafe.Pointer(&c.Groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(c.Groups)), uintptr(groups), 0); e != 0 {
		return fmt.Errorf("setgroups %v: %w", c.Groups, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(c.GID), uintptr(c.GID), uintptr(c.GID)); e != 0 {
		return fmt.Errorf("setresgid %d: %w", c.GID, e)
	}
	if _, _, e := unix.RawSyscall6(unix.SYS_PRCTL, unix.PR_SET_KEEPCAPS, 1, 0, 0, 0, 0); e != 0 {
		return fmt.Errorf("PR_SET_KEEPCAPS: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(c.UID), uintptr(c.UID), uintptr(c.UID)); e != 0 {
		return fmt.Errorf("setresuid %d: %w", c.UID, e)
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(c.Caps), Permitted: uint32(c.Caps)},
		{Effective: uint32(c.Caps >> 32), Permitted: uint32(c.Caps >> 32)},
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset 0x%x: %w", c.Caps, e)
	}
	return nil
}
