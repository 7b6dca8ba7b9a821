package seccompagent

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// arch is what the filter compares for one GOARCH: the AUDIT_ARCH_* of
// its native syscalls and the number of ioctl there (the number alone
// means another syscall on another arch). Only little-endian 64-bit
// arches: the filter reads the low word of args[1].
type arch struct {
	audit uint32
	ioctl uint32
}

// arches: include/uapi/linux/audit.h; ioctl is 16 in
// arch/x86/entry/syscalls/syscall_64.tbl and 29 in the generic table
// arm64 uses (include/uapi/asm-generic/unistd.h).
var arches = map[string]arch{
	"amd64": {audit: unix.AUDIT_ARCH_X86_64, ioctl: 16},
	"arm64": {audit: unix.AUDIT_ARCH_AARCH64, ioctl: 29},
}

// auditArch is the AUDIT_ARCH_* of the syscalls this build makes.
func auditArch() (uint32, error) {
	a, ok := arches[runtime.GOARCH]
	if !ok {
		return 0, fmt.Errorf("seccomp filter: unsupported arch %s", runtime.GOARCH)
	}
	return a.audit, nil
}

// Offsets into struct seccomp_data.
const (
	offNr       = 0
	offArch     = 4
	offArg1Low  = 16 + 8 // args[1], low 32 bits on little-endian
	bpfLdWAbs   = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK     = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfRetK     = unix.BPF_RET | unix.BPF_K
	tunSetIffLo = uint32(unix.TUNSETIFF) & 0xffffffff
)

// Filter is the BPF program for this build's arch: ioctl(fd, TUNSETIFF,
// ...) of the native arch goes to the listener, everything else runs (a
// compat 32-bit call too: its arch differs). The kernel truncates an
// ioctl command to 32 bits, so only the low word is compared: a caller
// cannot slip past with high bits set.
func Filter() ([]unix.SockFilter, error) { return filterFor(runtime.GOARCH) }

func filterFor(goarch string) ([]unix.SockFilter, error) {
	a, ok := arches[goarch]
	if !ok {
		return nil, fmt.Errorf("seccomp filter: unsupported arch %s", goarch)
	}
	return []unix.SockFilter{
		{Code: bpfLdWAbs, K: offArch},
		{Code: bpfJeqK, Jt: 0, Jf: 5, K: a.audit},
		{Code: bpfLdWAbs, K: offNr},
		{Code: bpfJeqK, Jt: 0, Jf: 3, K: a.ioctl},
		{Code: bpfLdWAbs, K: offArg1Low},
		{Code: bpfJeqK, Jt: 0, Jf: 1, K: tunSetIffLo},
		{Code: bpfRetK, K: unix.SECCOMP_RET_USER_NOTIF},
		{Code: bpfRetK, K: unix.SECCOMP_RET_ALLOW},
	}, nil
}

// filterFlags: WAIT_KILLABLE_RECV (Linux 6.0+) keeps a signal from
// restarting a TUNSETIFF that napitapd has already performed, which would
// give the caller EEXIST (DESIGN.md fact 12).
const filterFlags = unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV

// InstallFilter puts Filter on the calling OS thread and returns the
// listener fd (close-on-exec). The caller must hold runtime.LockOSThread
// and never unlock: the filter is on this thread only (and on threads it
// starts), so exec from it. Without CAP_SYS_ADMIN it sets NO_NEW_PRIVS
// first, as the kernel requires.
func InstallFilter() (int, error) {
	return installFilter(filterFlags)
}

func installFilter(flags uintptr) (int, error) {
	prog, err := Filter()
	if err != nil {
		return -1, err
	}
	admin, err := hasCapSysAdmin()
	if err != nil {
		return -1, err
	}
	if !admin {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return -1, fmt.Errorf("seccomp filter: PR_SET_NO_NEW_PRIVS: %w", err)
		}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, flags, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(prog)
	if errno != 0 {
		if errno == unix.EBUSY {
			// One listener per filter chain: this process already runs
			// under a notifying filter (runc's, or a launch before).
			return -1, fmt.Errorf("seccomp filter: a filter with a listener is already installed: %w", errno)
		}
		return -1, fmt.Errorf("seccomp filter: SECCOMP_SET_MODE_FILTER flags 0x%x: %w", flags, errno)
	}
	return int(fd), nil
}

// hasCapSysAdmin reports whether this thread's effective set holds
// CAP_SYS_ADMIN.
func hasCapSysAdmin() (bool, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false, fmt.Errorf("capget: %w", err)
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0, nil
}
