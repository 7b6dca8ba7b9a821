package tapsetup

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// ownNetnsIDEnv makes the re-executed test binary print NetnsID of its own
// netns and exit.
const ownNetnsIDEnv = "NAPITAP_TAPSETUP_OWN_NETNS_ID"

func init() {
	if os.Getenv(ownNetnsIDEnv) != "1" {
		return
	}
	id, err := NetnsID("/proc/self/ns/net")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(id)
	os.Exit(0)
}

// nsGetID reports whether the kernel answers NS_GET_ID (Linux 6.18), and
// the errno of one that does not.
func nsGetID(t *testing.T, fd int) (bool, unix.Errno) {
	t.Helper()
	var id uint64
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.NS_GET_ID, uintptr(unsafe.Pointer(&id)))
	return errno == 0, errno
}

// TestNetnsIDIsTheNetnsCookie: NS_GET_ID where the kernel has it, else the
// fallback, the netns cookie of a socket made inside; the same number
// either way, and another for another netns. Which one ran is logged.
func TestNetnsIDIsTheNetnsCookie(t *testing.T) {
	nstest.RequireRoot(t)
	other := nstest.New(t, "id")
	ids := map[uint64]string{}
	for _, path := range []string{"/proc/self/ns/net", other.Path()} {
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		id, err := NetnsIDOf(fd)
		if err != nil {
			t.Fatalf("NetnsIDOf %s: %v", path, err)
		}
		cookie, err := netnsCookie(fd)
		if err != nil {
			t.Fatalf("netns cookie of %s: %v", path, err)
		}
		if has, errno := nsGetID(t, fd); has {
			t.Logf("%s: NS_GET_ID %d, SO_NETNS_COOKIE %d", path, id, cookie)
		} else {
			t.Logf("%s: no NS_GET_ID (%v, Linux < 6.18): the fallback SO_NETNS_COOKIE gave %d", path, errno, id)
		}
		if id != cookie || id == 0 {
			t.Errorf("%s: NetnsIDOf %d, cookie %d: want the same, non-zero", path, id, cookie)
		}
		if prev, dup := ids[id]; dup {
			t.Errorf("%s and %s share id %d", prev, path, id)
		}
		ids[id] = path
	}
	if _, err := NetnsID("/proc/self/ns/user"); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("NetnsID of a user namespace: %v, want not a network namespace", err)
	}
}

// TestNetnsIDOfItsOwnNetnsNeedsNoCapability: a process without
// CAP_SYS_ADMIN (which setns wants) learns its own netns's id, as it does
// from NS_GET_ID on Linux 6.18: napitapctl queues run in a pod, the peers
// of the handoff tests. Before 6.18 the fallback entered the netns, and
// such a process got EPERM.
func TestNetnsIDOfItsOwnNetnsNeedsNoCapability(t *testing.T) {
	nstest.RequireRoot(t)
	want, err := NetnsID("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	cmd := nstest.AsCaplessRoot(t, exec.Command(os.Args[0], "-test.run=^$"))
	cmd.Env = append(os.Environ(), ownNetnsIDEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("NetnsID of its own netns without capabilities: %v: %s", err, out)
	}
	got, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	if err != nil || got != want {
		t.Errorf("without capabilities NetnsID of its own netns is %q, want %d", out, want)
	}
	// And another's stays closed to it before 6.18 (setns: EPERM), or is
	// NS_GET_ID's, which any holder of the fd may ask.
	fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if has, errno := nsGetID(t, fd); !has && !errors.Is(errno, unix.ENOTTY) && !errors.Is(errno, unix.EINVAL) {
		t.Errorf("NS_GET_ID: %v, want ENOTTY or EINVAL on a kernel without it", errno)
	}
}
