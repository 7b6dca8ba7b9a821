package main

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapqueues"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestNodeShowsNapitapdsRecordBesideTheKernelsTapFlag: napitapctl node
// lists each open queue of a real tap, with napitapd's record where it has
// one and unknown where it has none, and the kernel's flag, the tap's,
// the same on every queue whatever napitapd says.
func TestNodeShowsNapitapdsRecordBesideTheKernelsTapFlag(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "ctlnode")
	const tap = "napind0"
	var fds []int
	pod.Run(t, func() error {
		// The first queue is NAPI, so the tap's flag says NAPI; the
		// second is plain, which the kernel cannot show.
		for _, flags := range []uint16{unix.IFF_NAPI, 0} {
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds = append(fds, fd)
			ifr, err := unix.NewIfreq(tap)
			if err != nil {
				return err
			}
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE | flags)
			if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
				return err
			}
		}
		return nil
	})
	t.Cleanup(func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	})
	id, err := tapsetup.NetnsID(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	att := handoff.Attachment{Key: handoff.Key{ContainerID: "ctlnode-pod", IfName: "net1"}, Netns: pod.Path(), TapName: tap, Intercept: true, NetnsID: id,
		QueueStates: []handoff.QueueState{{PID: os.Getpid(), FD: fds[1], NAPI: handoff.QueuePlain, Reason: "not_intercepted"}}}
	found, err := tapqueues.FindAll(map[tapqueues.TapID]bool{tapOf(att): true})
	if err != nil {
		t.Fatal(err)
	}
	rows := nodeRows([]handoff.Attachment{att}, found)
	tests := []struct {
		name   string
		fd     int
		napi   string
		reason string
	}{
		{"a queue napitapd has no record of is unknown", fds[0], handoff.QueueUnknown, ""},
		{"a queue napitapd knows plain is plain, with its reason", fds[1], handoff.QueuePlain, "not_intercepted"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, r := range rows {
				if r.Kernel.PID != os.Getpid() || r.Kernel.FD != tc.fd {
					continue
				}
				if r.Napitapd.NAPI != tc.napi || r.Napitapd.Reason != tc.reason || r.Mode != "intercept" || r.TapName != tap {
					t.Errorf("row %+v: want napi %q, reason %q, intercept, tap %s", r, tc.napi, tc.reason, tap)
				}
				if !r.Kernel.Tap.NAPI {
					t.Errorf("row %+v: the kernel's tap flag: want NAPI, the first queue's, on every queue", r)
				}
				return
			}
			t.Errorf("fd %d: no row in %+v", tc.fd, rows)
		})
	}
}
