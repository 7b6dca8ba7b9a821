package seccompagent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/threadcred"
)

// The kernel's struct seccomp_data, seccomp_notif and seccomp_notif_resp
// (include/uapi/linux/seccomp.h); golang.org/x/sys has the ioctl numbers
// but not the types. The layout is the same on every 64-bit arch.
type seccompData struct {
	Nr                 int32
	Arch               uint32
	InstructionPointer uint64
	Args               [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32 // the calling thread, as napitapd's pid namespace sees it
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32 // negative errno, or 0
	Flags uint32
}

// The kernel refuses a size it does not expect; the ioctl numbers encode it.
var (
	_ [unsafe.Sizeof(seccompNotif{}) - 0x50]byte
	_ [0x50 - unsafe.Sizeof(seccompNotif{})]byte
	_ [unsafe.Sizeof(seccompNotifResp{}) - 0x18]byte
	_ [0x18 - unsafe.Sizeof(seccompNotifResp{})]byte
)

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// notifRecv takes the next pending notification. The kernel wants the
// buffer zeroed.
func notifRecv(listener int, n *seccompNotif) error {
	*n = seccompNotif{}
	return ioctlPtr(listener, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(n))
}

// notifSyncWakeUp asks the kernel to wake the agent and then the caller
// on the CPU of the one that woke it, as a call and its answer
// (SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP): the caller sleeps for as long as
// the agent works, so nothing is gained by waking it elsewhere, and the
// wake-up costs less. The flag is the filter's, kept across napitapds. A
// kernel before 6.6 knows neither the ioctl (ENOTTY) nor, should it
// know another flag, this one (EINVAL): it wakes them as it always did.
func notifSyncWakeUp(listener int) error {
	var errno unix.Errno
	for {
		// The kernel takes the listener's lock interruptibly.
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, uintptr(listener), unix.SECCOMP_IOCTL_NOTIF_SET_FLAGS, unix.SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP)
		if errno != unix.EINTR {
			break
		}
	}
	switch errno {
	case 0, unix.ENOTTY, unix.EINVAL:
		return nil
	}
	return fmt.Errorf("SECCOMP_IOCTL_NOTIF_SET_FLAGS: %w", errno)
}

// schedYield gives the CPU to any task waiting for it, the thread staying
// runnable; Go has no call for it (runtime.Gosched yields the goroutine).
func schedYield() { unix.RawSyscallNoError(unix.SYS_SCHED_YIELD, 0, 0, 0) }

// notifIDValid reports whether the caller of notification id is still
// blocked in it: what was read about the caller since RECV (its memory,
// its /proc entries, its pidfd) was then really the caller's.
func notifIDValid(listener int, id uint64) bool {
	return ioctlPtr(listener, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) == nil
}

// notifSend answers a notification. errno 0 with cont false makes the
// syscall return 0; cont lets the kernel run it as if nobody had asked.
func notifSend(listener int, id uint64, errno unix.Errno, cont bool) error {
	resp := seccompNotifResp{ID: id, Error: -int32(errno)}
	if cont {
		resp.Error, resp.Flags = 0, unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
	}
	return ioctlPtr(listener, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
}

// errRunning: the thread is not asleep in a syscall, so /proc cannot say
// which it makes.
var errRunning = errors.New("the thread is running")

// confirmReceived is confirmPending for a notification RECV has just
// given: the kernel queues it before its caller sleeps, so a running
// caller is waited for, briefly (yielding first: it is about to sleep).
// gone: the notification is no longer pending (a signal took its caller
// out of the call), and there is nothing to answer.
func confirmReceived(listener int, n *seccompNotif, sf *syscallFile) (gone bool, err error) {
	var buf [256]byte
	for i := range 2000 {
		var k int
		if k, err = sf.read(n.Pid, buf[:]); err == nil {
			err = confirmPending(n, buf[:k])
		}
		if err == nil {
			return false, nil
		}
		if !notifIDValid(listener, n.ID) {
			return true, err
		}
		if !errors.Is(err, errRunning) {
			return false, err
		}
		if i < 100 {
			runtime.Gosched()
		} else {
			time.Sleep(25 * time.Microsecond)
		}
	}
	return false, err
}

// syscallFile is a listener's /proc/TID/syscall of the thread it last
// confirmed a notification of: a VMM opens its queues one after another
// from one thread, and opening the file (as its owner) costs more than
// reading it. The listener's goroutine alone uses it, and closes it.
type syscallFile struct {
	tid uint32
	f   *os.File
}

// read reads tid's file at offset 0, where /proc makes it anew. A kept
// file whose thread has exited (its tid perhaps another thread's now)
// fails, and the file is opened again.
func (s *syscallFile) read(tid uint32, buf []byte) (int, error) {
	for kept := s.f != nil && s.tid == tid; ; kept = false {
		if !kept {
			s.close()
			f, err := openSyscall(tid)
			if err != nil {
				return 0, err
			}
			s.tid, s.f = tid, f
		}
		k, err := s.f.ReadAt(buf, 0)
		if errors.Is(err, io.EOF) {
			err = nil
		}
		if err == nil || !kept {
			return k, err
		}
	}
}

func (s *syscallFile) close() {
	if s.f != nil {
		s.f.Close()
		s.f = nil
	}
}

// openSyscall opens /proc/TID/syscall. The file is mode 0400 and its
// thread's owner's, and napitapd has no CAP_DAC_OVERRIDE (the DaemonSet
// gives it none): it opens it as that owner, keeping CAP_SYS_PTRACE for
// the ptrace check /proc makes at each read too.
func openSyscall(tid uint32) (*os.File, error) {
	path := fmt.Sprintf("/proc/%d/syscall", tid)
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, err
	}
	if st.Uid == uint32(os.Geteuid()) {
		return os.Open(path)
	}
	var f *os.File
	err := threadcred.Run(threadcred.Creds{UID: st.Uid, GID: st.Gid, Caps: 1 << unix.CAP_SYS_PTRACE}, func() (err error) {
		f, err = os.Open(path)
		return err
	})
	return f, err
}

// readSyscall reads /proc/TID/syscall (openSyscall).
func readSyscall(tid uint32) ([]byte, error) {
	f, err := openSyscall(tid)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// confirmPending checks n, a notification read back from a slot, with the
// kernel: its thread must be blocked in that very syscall with those
// arguments (b, its /proc/TID/syscall: the number, then the arguments in
// hex).
// The caller has checked n.ID (notifIDValid); this makes sure Pid and
// Args, which the kernel cannot be asked for by ID, are the caller's.
func confirmPending(n *seccompNotif, b []byte) error {
	f := strings.Fields(string(b))
	if len(f) == 1 && f[0] == "running" {
		return errRunning
	}
	if len(f) < 4 || f[0] != strconv.Itoa(int(n.Data.Nr)) {
		return fmt.Errorf("thread %d is in syscall %q, not %d", n.Pid, strings.TrimSpace(string(b)), n.Data.Nr)
	}
	for i, arg := range f[1:4] {
		v, err := strconv.ParseUint(strings.TrimPrefix(arg, "0x"), 16, 64)
		if err != nil || v != n.Data.Args[i] {
			return fmt.Errorf("thread %d: argument %d is %s, the record says 0x%x", n.Pid, i, arg, n.Data.Args[i])
		}
	}
	return nil
}
