// Package threadcred runs a function on an OS thread that has taken on
// another process's credentials for the call. Linux keeps credentials per
// thread (the raw setresuid, setresgid, setgroups and capset calls change
// only the calling thread; glibc and Go's syscall package broadcast them to
// every thread), so napitapd can make a system call on a caller's behalf
// with the caller's rights: the kernel then judges the caller, not napitapd.
//
// Only the effective (and so filesystem) uid and gid, the supplementary
// groups and the effective capabilities change, which is all the kernel
// judges a call by. The real and saved uid stay napitapd's: a process of the
// caller's uid may signal or ptrace a thread whose real or saved uid is its
// own (kill_ok_by_cred, __ptrace_may_access), and one SIGKILL to a thread
// ends napitapd. Keeping them also lets the thread go back to napitapd's
// credentials after the call, so the calling goroutine's own thread serves:
// a thread made and torn down for each call costs about 170 µs on a
// virtual machine, this about 12 µs (BenchmarkRun).
//
// While the thread carries the caller's credentials it is locked to the
// calling goroutine and runs no other; Go does not clone a new thread from
// a locked one either (its template thread makes them: newm in
// runtime/proc.go). A thread that could not go back stays locked to that
// goroutine, and exits with it.
package threadcred

import (
	"fmt"
	"runtime"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Creds are what the thread takes on for a call.
type Creds struct {
	UID    uint32   // effective and filesystem uid
	GID    uint32   // effective and filesystem gid
	Groups []uint32 // supplementary groups
	// Caps are the capabilities (CAP_* bits) left in the effective set;
	// all others are dropped from it.
	Caps uint64
}

// Error is Run's when the thread could not take the credentials on, and
// fn did not run, or could not go back to its own.
type Error struct{ Err error }

func (e *Error) Error() string { return "taking on credentials: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Run runs fn on the calling goroutine's thread with c and returns what fn
// returns. The process must run as uid 0 with CAP_SETUID, CAP_SETGID and
// every capability in c.Caps, or Run returns an *Error and fn does not
// run. A panic in fn goes on to Run's caller once the thread is back to
// its own credentials.
func Run(c Creds, fn func() error) (err error) {
	runtime.LockOSThread()
	own, err := current()
	if err != nil {
		runtime.UnlockOSThread()
		return &Error{err}
	}
	if own.uid != 0 {
		runtime.UnlockOSThread()
		return &Error{fmt.Errorf("euid %d: a thread that is not root cannot take another's credentials and come back", own.uid)}
	}
	// Deferred, so that a panic in fn, recovered further up, does not
	// leave the caller's credentials on a thread that then runs anything.
	now := own
	defer func() {
		if rerr := restore(&now, own); rerr != nil {
			// Never unlocked: no other goroutine may run with what is
			// left, and Go ends the thread when this goroutine exits. A
			// panic goes on as it was, the thread locked all the same.
			err = &Error{fmt.Errorf("going back to the thread's own credentials: %w", rerr)}
			return
		}
		runtime.UnlockOSThread()
	}()
	if err := become(&now, c); err != nil {
		return &Error{err}
	}
	return fn()
}

// creds are a thread's credentials as far as Run changes them. Each call
// changes only what differs: every set*id, setgroups and capset is a
// system call that makes the kernel copy and commit a struct cred, and a
// root caller, or uid 107 without groups (KubeVirt's QEMU), needs half of
// them or fewer.
type creds struct {
	uid, gid  uint32
	groups    []uint32
	effective uint64
	permitted uint64
}

// current reads the thread's credentials.
func current() (creds, error) {
	var c creds
	var err error
	if c.effective, c.permitted, err = capget(); err != nil {
		return c, err
	}
	c.uid, c.gid = uint32(unix.Geteuid()), uint32(unix.Getegid())
	groups, err := unix.Getgroups()
	if err != nil {
		return c, fmt.Errorf("getgroups: %w", err)
	}
	for _, g := range groups {
		c.groups = append(c.groups, uint32(g))
	}
	return c, nil
}

// become: groups and gid first, while the thread still has CAP_SETGID; the
// uid change then clears the effective capabilities (0 to non-zero) or
// keeps them (root), and capset leaves only c.Caps of them. The permitted
// set stays, since the real and saved uid are still 0. now is kept up to
// date for restore, whatever fails.
func become(now *creds, c Creds) error {
	if err := setgroups(now, c.Groups); err != nil {
		return err
	}
	if err := setegid(now, c.GID); err != nil {
		return err
	}
	if err := seteuid(now, c.UID); err != nil {
		return err
	}
	if c.Caps&^now.permitted != 0 {
		return fmt.Errorf("capabilities 0x%x: napitapd has only 0x%x", c.Caps, now.permitted)
	}
	return capset(now, c.Caps)
}

// restore goes back to the thread's own credentials: euid 0 (a real uid
// of 0 lets the thread, and the kernel makes the permitted set effective
// again), gid and groups with CAP_SETGID, then the effective set as it
// was.
func restore(now *creds, own creds) error {
	if err := seteuid(now, own.uid); err != nil {
		return err
	}
	if now.gid != own.gid || !slices.Equal(now.groups, own.groups) {
		if err := capset(now, now.permitted); err != nil {
			return err
		}
		if err := setegid(now, own.gid); err != nil {
			return err
		}
		if err := setgroups(now, own.groups); err != nil {
			return err
		}
	}
	return capset(now, own.effective)
}

func setgroups(now *creds, groups []uint32) error {
	if slices.Equal(now.groups, groups) {
		return nil
	}
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("setgroups %v: %w", groups, e)
	}
	now.groups = groups
	return nil
}

// setegid sets the effective gid, and with it the filesystem gid.
func setegid(now *creds, gid uint32) error {
	if now.gid == gid {
		return nil
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(gid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresgid -1 %d -1: %w", gid, e)
	}
	now.gid = gid
	return nil
}

// seteuid sets the effective uid, and with it the filesystem uid; the
// kernel changes the effective capabilities with them, which are read
// back rather than foreseen (SECBIT_NO_SETUID_FIXUP would keep them).
func seteuid(now *creds, uid uint32) error {
	if now.uid == uid {
		return nil
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(uid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresuid -1 %d -1: %w", uid, e)
	}
	now.uid = uid
	var err error
	now.effective, now.permitted, err = capget()
	return err
}

func capget() (effective, permitted uint64, err error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return 0, 0, fmt.Errorf("capget: %w", err)
	}
	return uint64(data[0].Effective) | uint64(data[1].Effective)<<32,
		uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32, nil
}

func capset(now *creds, effective uint64) error {
	if now.effective == effective {
		return nil
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(effective), Permitted: uint32(now.permitted)},
		{Effective: uint32(effective >> 32), Permitted: uint32(now.permitted >> 32)},
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset effective 0x%x: %w", effective, e)
	}
	now.effective = effective
	return nil
}
