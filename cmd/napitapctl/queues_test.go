package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapqueues"
)

// TestQueuesListsEveryOpenQueueOfTheTapFromTheKernel: napitapctl queues
// finds the processes holding a tap's queues, and their flags, from the
// fds themselves; a tap of the same name in another netns is not it.
func TestQueuesListsEveryOpenQueueOfTheTapFromTheKernel(t *testing.T) {
	nstest.RequireRoot(t)
	pod, other := nstest.New(t, "ctlqueues"), nstest.New(t, "ctlqueues")
	const tap = "napiq0"
	open := func(ns *nstest.NetNS, flags uint16, n int) []int {
		var fds []int
		ns.Run(t, func() error {
			for range n {
				fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
				if err != nil {
					return err
				}
				ifr, err := unix.NewIfreq(tap)
				if err != nil {
					return err
				}
				ifr.SetUint16(flags)
				if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
					return err
				}
				fds = append(fds, fd)
			}
			return nil
		})
		t.Cleanup(func() {
			for _, fd := range fds {
				unix.Close(fd)
			}
		})
		return fds
	}
	napi := open(pod, unix.IFF_TAP|unix.IFF_NO_PI|unix.IFF_VNET_HDR|unix.IFF_MULTI_QUEUE|unix.IFF_NAPI, 2)
	open(other, unix.IFF_TAP|unix.IFF_NO_PI, 1)

	tests := []struct {
		name     string
		netns    string
		wantFDs  []int
		wantNAPI bool
	}{
		{"the 2 NAPI queues this process holds of the pod's tap", pod.Path(), napi, true},
		{"the same name in another netns is another tap, with a plain queue", other.Path(), nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := mainexec.Command("napitapctl", "queues", "--netns", tc.netns, "--tap", tap, "-o", "json")
			var out, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("napitapctl queues: %v\n%s", err, stderr.String())
			}
			var got []tapqueues.Queue
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("%v: %s", err, out.String())
			}
			var fds []int
			for _, q := range got {
				if q.PID != os.Getpid() || q.Tap.NAPI != tc.wantNAPI {
					t.Errorf("queue %+v: want pid %d, napi %v", q, os.Getpid(), tc.wantNAPI)
				}
				fds = append(fds, q.FD)
			}
			if tc.wantFDs != nil && !slices.Equal(fds, tc.wantFDs) {
				t.Errorf("fds %v, want %v", fds, tc.wantFDs)
			}
			if tc.wantFDs == nil && len(got) != 1 {
				t.Errorf("%d queues, want the other netns' one", len(got))
			}
		})
	}
}

// TestQueuesSeesANonRootVMMsQueuesWithoutTheDACCapabilities: napitapctl
// queues run where napitapd runs (root with NET_ADMIN, SETGID, SETUID,
// SYS_ADMIN and SYS_PTRACE, no CAP_DAC_OVERRIDE or CAP_DAC_READ_SEARCH:
// deploy/base/daemonset.yaml) lists the queues a process of uid 107 holds,
// as QEMU under KubeVirt does, though that process's /proc/PID/fd is its
// owner's alone. Before, it listed nothing and said nothing.
func TestQueuesSeesANonRootVMMsQueuesWithoutTheDACCapabilities(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Fatal("setpriv (util-linux) is needed:", err)
	}
	pod := nstest.New(t, "ctlqnonroot")
	const tap = "napiq107"
	var queue *os.File
	pod.Run(t, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		queue = os.NewFile(uintptr(fd), "queue")
		ifr, err := unix.NewIfreq(tap)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_NAPI)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	// The VMM: uid 107 holding the queue as its fd 3.
	vmm := exec.Command("sleep", "60")
	vmm.ExtraFiles = []*os.File{queue}
	vmm.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 107, Gid: 107}}
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vmm.Process.Kill(); _ = vmm.Wait() })
	queue.Close()

	ctl := mainexec.Command("napitapctl", "queues", "--netns", pod.Path(), "--tap", tap, "-o", "json")
	// napitapd's container's capabilities: an exec as root keeps the
	// bounding set.
	ctl.Args = append([]string{"setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"}, ctl.Args...)
	ctl.Path, _ = exec.LookPath("setpriv")
	var out, stderr bytes.Buffer
	ctl.Stdout, ctl.Stderr = &out, &stderr
	if err := ctl.Run(); err != nil {
		t.Fatalf("napitapctl queues: %v\n%s", err, stderr.String())
	}
	var got []tapqueues.Queue
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	if len(got) != 1 || got[0].PID != vmm.Process.Pid || got[0].FD != 3 || !got[0].Tap.NAPI {
		t.Errorf("queues %+v, want the uid-107 process's fd 3 (pid %d), NAPI", got, vmm.Process.Pid)
	}
}
