package tapqueues

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/tapsetup"
)

// TapID names a tap on the node: its netns (tapsetup.NetnsID) and name.
type TapID struct {
	NetnsID uint64
	Name    string
}

// Found is one queue FindAll found, with the tap it belongs to.
type Found struct {
	TapID
	Queue
}

// FindAll lists the queues of every tap in taps, in one walk of /proc:
// napitapd's scan of a node's taps, which Find, one walk per tap, would
// make 110 walks on a full node. Sorted by netns, tap, process ID, fd; an
// error says how many queues could not be read, as Find's does.
func FindAll(taps map[TapID]bool) ([]Found, error) {
	if len(taps) == 0 {
		return nil, nil
	}
	names := map[string]bool{}
	for t := range taps {
		names[t.Name] = true
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var found []Found
	denied := 0
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		qs, d := allInProcess(pid, names, taps)
		found, denied = append(found, qs...), denied+d
	}
	slices.SortFunc(found, func(a, b Found) int {
		return cmp.Or(cmp.Compare(a.NetnsID, b.NetnsID), cmp.Compare(a.Name, b.Name), cmp.Compare(a.PID, b.PID), cmp.Compare(a.FD, b.FD))
	})
	if denied > 0 {
		return found, fmt.Errorf("%d queue(s): %w", denied, ErrNotPermitted)
	}
	return found, nil
}

// allInProcess is pid's queues of the taps, and how many it could not read.
// names are the taps' names, which fdinfo gives without a copy of the fd.
func allInProcess(pid int, names map[string]bool, taps map[TapID]bool) ([]Found, int) {
	files, ok := tunFilesOf(pid)
	if !ok {
		return nil, 1
	}
	var qs []Found
	denied := 0
	pidfd := -1
	defer func() {
		if pidfd >= 0 {
			unix.Close(pidfd)
		}
	}()
	for _, f := range files {
		if !names[f.tap] {
			continue
		}
		if pidfd < 0 {
			var err error
			if pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
				return qs, denied
			}
		}
		id, q, err := readAny(pidfd, f.fd)
		switch {
		case errors.Is(err, unix.EPERM):
			denied++
		case err == nil && taps[TapID{id, f.tap}]:
			q.PID, q.Command = pid, command(pid)
			qs = append(qs, Found{TapID{id, f.tap}, *q})
		}
	}
	return qs, denied
}

// readAny is read for a tap in any netns: the netns's id, and the flags.
func readAny(pidfd, fd int) (uint64, *Queue, error) {
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return 0, nil, err
	}
	defer unix.Close(dup)
	nsfd, err := unix.IoctlRetInt(dup, unix.TUNGETDEVNETNS)
	if err != nil {
		return 0, nil, err
	}
	id, err := tapsetup.NetnsIDOf(nsfd)
	unix.Close(nsfd)
	if err != nil {
		return 0, nil, err
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return 0, nil, err
	}
	if err := unix.IoctlIfreq(dup, unix.TUNGETIFF, ifr); err != nil {
		return 0, nil, err
	}
	return id, &Queue{FD: fd, Tap: flagsOf(ifr.Uint16())}, nil
}

func flagsOf(flags uint16) TapFlags {
	return TapFlags{Flags: flags, NAPI: flags&unix.IFF_NAPI != 0, Frags: flags&unix.IFF_NAPI_FRAGS != 0,
		MultiQueue: flags&unix.IFF_MULTI_QUEUE != 0, VnetHdr: flags&unix.IFF_VNET_HDR != 0}
}
