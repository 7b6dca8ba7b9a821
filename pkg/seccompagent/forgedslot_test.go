package seccompagent

import (
	"os"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
)

// TestARewrittenSlotMakesTheNextAgentActOnNobodyElsesFd: whoever can
// write a slot (a process that reached the fd holder's memfds) rewrites
// the pending notification to name another process's unattached tun fd
// and ifreq. The notification ID is still the real caller's, so the
// kernel calls it valid; acting on the record would attach the other
// process's fd with NAPI and answer the real caller 0 with its own fd
// unattached. The agent checks the record against the kernel
// (/proc/TID/syscall) and leaves the call to the kernel instead.
func TestARewrittenSlotMakesTheNextAgentActOnNobodyElsesFd(t *testing.T) {
	pod, tap, reg := slotTestPod(t, "seccompforged")
	listener, res := callerUnderFilter(t, pod, tap)
	dead := receiveInSlot(t, listener)
	expectBlocked(t, res)

	// The victim: this test process, with a tun fd of the pod's netns and
	// an ifreq naming the tap, neither of them in any TUNSETIFF.
	opened := make(chan int, 1)
	nstest.OnThreadThatEnds(func() {
		fd := -1
		if nsfd, err := unix.Open(pod, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
			if unix.Setns(nsfd, unix.CLONE_NEWNET) == nil {
				fd, _ = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			}
			unix.Close(nsfd)
		}
		opened <- fd
	})
	victim := <-opened
	if victim < 0 {
		t.Fatal("no tun fd in the pod's netns")
	}
	defer unix.Close(victim)
	ifr, err := unix.NewIfreq(tap)
	if err != nil {
		t.Fatal(err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	n := dead.notif()
	n.Pid = uint32(os.Getpid())
	n.Data.Args[0] = uint64(victim)
	n.Data.Args[2] = uint64(uintptr(unsafe.Pointer(ifr)))

	logs := &syncbuf.Buffer{}
	agent := newSlotTestAgent(t, reg, logs, nil)
	if err := agent.Adopt(Listener{File: listener, Slot: dead.release(), Origin: "a rewritten slot", ID: "forged"}); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	r := awaitCaller(t, res)
	runtime.KeepAlive(ifr)
	if r.err != nil || r.errno != 0 || r.flags&unix.IFF_NAPI != 0 {
		t.Errorf("the real caller's TUNSETIFF: errno %v, flags 0x%x, %v; want its own, by the kernel: 0, no IFF_NAPI\n%s", r.errno, r.flags, r.err, logs.String())
	}
	got, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(victim, unix.TUNGETIFF, got); err == nil {
		t.Errorf("the victim's fd was attached to %s (flags 0x%x) on the strength of a rewritten slot", got.Name(), got.Uint16())
	}
	if !strings.Contains(logs.String(), "does not match its caller") {
		t.Errorf("the agent did not say the record was refused:\n%s", logs.String())
	}
}
