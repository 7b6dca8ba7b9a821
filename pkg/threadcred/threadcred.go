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
// virtual machine, this about 20 µs.
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
	own, err := capget()
	if err != nil {
		runtime.UnlockOSThread()
		return &Error{err}
	}
	// Deferred, so that a panic in fn, recovered further up, does not
	// leave the caller's credentials on a thread that then runs anything.
	defer func() {
		if rerr := restore(own); rerr != nil {
			// Never unlocked: no other goroutine may run with what is
			// left, and Go ends the thread when this goroutine exits. A
			// panic goes on as it was, the thread locked all the same.
			err = &Error{fmt.Errorf("going back to the thread's own credentials: %w", rerr)}
			return
		}
		runtime.UnlockOSThread()
	}()
	if err := become(c, own.permitted); err != nil {
		return &Error{err}
	}
	return fn()
}

// ownCreds are the thread's credentials before any call.
type ownCreds struct {
	gid       uint32
	groups    []uint32
	permitted uint64
	effective uint64
}

func capget() (ownCreds, error) {
	var own ownCreds
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return own, fmt.Errorf("capget: %w", err)
	}
	own.permitted = uint64(data[0].Permitted) | uint64(data[1].Permitted)<<32
	own.effective = uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	own.gid = uint32(unix.Getegid())
	groups, err := unix.Getgroups()
	if err != nil {
		return own, fmt.Errorf("getgroups: %w", err)
	}
	for _, g := range groups {
		own.groups = append(own.groups, uint32(g))
	}
	if uid := unix.Geteuid(); uid != 0 {
		return own, fmt.Errorf("euid %d: a thread that is not root cannot take another's credentials and come back", uid)
	}
	return own, nil
}

// become: groups and gid first, while the thread still has CAP_SETGID; the
// uid change then clears the effective capabilities (0 to non-zero) or
// keeps them (root), and capset leaves only c.Caps of them. The permitted
// set stays, since the real and saved uid are still 0.
func become(c Creds, permitted uint64) error {
	if err := setgroups(c.Groups); err != nil {
		return err
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(c.GID), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresgid -1 %d -1: %w", c.GID, e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(c.UID), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresuid -1 %d -1: %w", c.UID, e)
	}
	if c.Caps&^permitted != 0 {
		return fmt.Errorf("capabilities 0x%x: napitapd has only 0x%x", c.Caps, permitted)
	}
	return capset(c.Caps, permitted)
}

// restore goes back to the thread's own credentials: the permitted set
// made effective again (CAP_SETGID for what follows), euid 0 (a real uid
// of 0 lets the thread), gid and groups, then the effective set as it was.
func restore(own ownCreds) error {
	if err := capset(own.permitted, own.permitted); err != nil {
		return err
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresuid -1 0 -1: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, ^uintptr(0), uintptr(own.gid), ^uintptr(0)); e != 0 {
		return fmt.Errorf("setresgid -1 %d -1: %w", own.gid, e)
	}
	if err := setgroups(own.groups); err != nil {
		return err
	}
	return capset(own.effective, own.permitted)
}

func setgroups(groups []uint32) error {
	var p unsafe.Pointer
	if len(groups) > 0 {
		p = unsafe.Pointer(&groups[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(p), 0); e != 0 {
		return fmt.Errorf("setgroups %v: %w", groups, e)
	}
	return nil
}

func capset(effective, permitted uint64) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := [2]unix.CapUserData{
		{Effective: uint32(effective), Permitted: uint32(permitted)},
		{Effective: uint32(effective >> 32), Permitted: uint32(permitted >> 32)},
	}
	if _, _, e := unix.RawSyscall(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); e != 0 {
		return fmt.Errorf("capset effective 0x%x: %w", effective, e)
	}
	return nil
}
