package peer

import (
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// TestEachFallbackRunsWhereTheKernelLacksItsInterface asks the kernel for
// each interface pkg/peer prefers, and checks that the branch this kernel
// takes (logged: make test-kernel shows it on 6.1) gives what the
// preferred one would: the peer pinned by a pidfd of its own process
// (SO_PEERPIDFD, 6.5; else pidfd_open of SO_PEERCRED's pid), its
// credentials (PIDFD_GET_INFO, 6.13; else /proc/TID/status, groups
// included), its netns (PIDFD_GET_NET_NAMESPACE, 6.11; else
// /proc/PID/ns/net).
func TestEachFallbackRunsWhereTheKernelLacksItsInterface(t *testing.T) {
	nstest.RequireRoot(t)
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "peer")
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer fc.Close()
	p, err := Connected(fc.(*net.UnixConn))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	// SO_PEERPIDFD.
	if pidfd, err := unix.GetsockoptInt(fds[1], unix.SOL_SOCKET, unix.SO_PEERPIDFD); err == nil {
		unix.Close(pidfd)
		t.Log("SO_PEERPIDFD: the kernel's pidfd of the peer")
	} else if errors.Is(err, unix.ENOPROTOOPT) {
		t.Logf("no SO_PEERPIDFD (%v, Linux < 6.5): fallback pidfd_open of SO_PEERCRED's pid", err)
	} else {
		t.Fatalf("SO_PEERPIDFD: %v", err)
	}
	if p.pidfd < 0 || p.pidfdErr != nil {
		t.Fatalf("the peer is not pinned: pidfd %d, %v", p.pidfd, p.pidfdErr)
	}
	if pid, err := pidfdPid(p.pidfd); err != nil || pid != os.Getpid() {
		t.Errorf("the peer's pidfd names pid %d (%v), want %d", pid, err, os.Getpid())
	}

	// PIDFD_GET_INFO: Thread leaves the groups to ThreadGroups; the
	// fallback's /proc/TID/status has read them.
	info := pidfdInfo{Mask: pidfdInfoCreds}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(p.pidfd), pidfdGetInfo, uintptr(unsafe.Pointer(&info)))
	hasInfo := errno == 0
	c, err := Thread(os.Getpid(), p.pidfd, nil)
	if err != nil {
		t.Fatalf("Thread: %v", err)
	}
	if hasInfo {
		t.Log("PIDFD_GET_INFO: credentials from the pidfd")
	} else {
		t.Logf("no PIDFD_GET_INFO (%v, Linux < 6.13): fallback /proc/TID/status", errno)
	}
	if c.GroupsRead == hasInfo {
		t.Errorf("Thread read the groups: %v; with PIDFD_GET_INFO %v it should be %v", c.GroupsRead, hasInfo, !hasInfo)
	}
	if c.EUID != uint32(os.Geteuid()) || c.EGID != uint32(os.Getegid()) || !c.InitNetAdmin || c.PID != os.Getpid() {
		t.Errorf("Thread of this root test: %+v", c)
	}

	// PIDFD_GET_NET_NAMESPACE.
	if fd, err := unix.IoctlRetInt(p.pidfd, pidfdGetNetNamespace); err == nil {
		unix.Close(fd)
		t.Log("PIDFD_GET_NET_NAMESPACE: the netns from the pidfd")
	} else if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
		t.Logf("no PIDFD_GET_NET_NAMESPACE (%v, Linux < 6.11): fallback /proc/PID/ns/net", err)
	} else {
		t.Fatalf("PIDFD_GET_NET_NAMESPACE: %v", err)
	}
	nsfd, err := p.OpenNetns()
	if err != nil {
		t.Fatalf("OpenNetns: %v", err)
	}
	defer unix.Close(nsfd)
	var got, want unix.Stat_t
	if err := unix.Fstat(nsfd, &got); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/self/ns/net", &want); err != nil {
		t.Fatal(err)
	}
	if got.Ino != want.Ino || got.Dev != want.Dev {
		t.Errorf("OpenNetns gave netns inode %d, want %d", got.Ino, want.Ino)
	}
}

// pidfdPid is the pid a pidfd names, from its fdinfo.
func pidfdPid(pidfd int) (int, error) {
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(pidfd))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Pid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Pid in the pidfd's fdinfo")
}
