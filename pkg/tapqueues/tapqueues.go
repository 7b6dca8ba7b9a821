// Package tapqueues lists the open queues of a tap on the node, read from
// the kernel: which processes hold them (a VMM, napitapd, napitap-fdstore),
// and the tap's flags, which TUNGETIFF gives on each. It is napitapctl
// queues, the check that a running VM's queues got NAPI without asking its
// runtime.
//
// The kernel decides NAPI per attaching fd (tun_attach) but shows it for
// none: TUNGETIFF gives the tap's flags, written by the attach that took
// it from no queue to one; fdinfo gives the tap's name alone; netdev's
// generic netlink lists no tun NAPI instance (they have no NAPI id); and
// threaded NAPI's kernel threads, one per NAPI queue, are named after the
// tap but not its netns (docs/DESIGN.md fact 2). So a queue's Tap flags
// are its own only where every queue was opened alike, as VMMs do.
package tapqueues

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/tapsetup"
)

// Queue is one open /dev/net/tun file attached to the tap.
type Queue struct {
	PID     int      `json:"pid"`
	Command string   `json:"command"`
	FD      int      `json:"fd"`
	Tap     TapFlags `json:"tap"` // the tap's, not this queue's own (package doc)
}

// TapFlags are TUNGETIFF's flags: the tap's, which the attach that took it
// from no queue to one wrote.
type TapFlags struct {
	Flags      uint16 `json:"flags"`
	NAPI       bool   `json:"napi"`
	Frags      bool   `json:"frags"`
	MultiQueue bool   `json:"multiQueue"`
	VnetHdr    bool   `json:"vnetHdr"`
}

// ErrNotPermitted: some queues were found but could not be read (pidfd_getfd
// needs CAP_SYS_PTRACE over their process).
var ErrNotPermitted = errors.New("queues of other processes need CAP_SYS_PTRACE to read")

// Find lists the queues of tap in the netns netnsID (tapsetup.NetnsID),
// by process ID, then fd. Processes that exit meanwhile are left out.
func Find(netnsID uint64, tap string) ([]Queue, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var found []Queue
	denied := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		qs, d := inProcess(pid, netnsID, tap)
		found, denied = append(found, qs...), denied+d
	}
	slices.SortFunc(found, func(a, b Queue) int { return cmp.Or(cmp.Compare(a.PID, b.PID), cmp.Compare(a.FD, b.FD)) })
	if denied > 0 {
		return found, fmt.Errorf("%d queue(s) of tap %q: %w", denied, tap, ErrNotPermitted)
	}
	return found, nil
}

// inProcess is pid's queues of tap, and how many it could not read (1
// for a process whose fds it could not list).
func inProcess(pid int, netnsID uint64, tap string) ([]Queue, int) {
	files, ok := tunFilesOf(pid)
	if !ok {
		return nil, 1
	}
	var qs []Queue
	denied := 0
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	for _, f := range files {
		if f.tap != tap {
			continue
		}
		if pidfd < 0 {
			var err error
			if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
				return qs, denied
			}
		}
		q, err := read(pidfd, f.fd, netnsID)
		switch {
		case errors.Is(err, unix.EPERM):
			denied++
		case err == nil && q != nil:
			q.PID, q.Command = pid, command(pid)
			qs = append(qs, *q)
		}
	}
	return qs, denied
}

// read takes a copy of the process's fd and reads its flags, nil if the
// tap of that name is in another netns.
func read(pidfd, fd int, netnsID uint64) (*Queue, error) {
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dup)
	nsfd, err := unix.IoctlRetInt(dup, unix.TUNGETDEVNETNS)
	if err != nil {
		return nil, err
	}
	id, err := tapsetup.NetnsIDOf(nsfd)
	unix.Close(nsfd)
	if err != nil || id != netnsID {
		return nil, err
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlIfreq(dup, unix.TUNGETIFF, ifr); err != nil {
		return nil, err
	}
	flags := ifr.Uint16()
	return &Queue{FD: fd, Tap: TapFlags{Flags: flags, NAPI: flags&unix.IFF_NAPI != 0, Frags: flags&unix.IFF_NAPI_FRAGS != 0,
		MultiQueue: flags&unix.IFF_MULTI_QUEUE != 0, VnetHdr: flags&unix.IFF_VNET_HDR != 0}}, nil
}

func command(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
