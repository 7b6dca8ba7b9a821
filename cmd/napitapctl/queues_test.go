package main

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
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
