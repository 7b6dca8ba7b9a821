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
	"errors"
	"fmt"
	"os"
	"strings"
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
	all, err := FindAll(map[TapID]bool{{NetnsID: netnsID, Name: tap}: true})
	found := make([]Queue, len(all))
	for i, f := range all {
		found[i] = f.Queue
	}
	if err != nil {
		err = fmt.Errorf("tap %q: %w", tap, err)
	}
	return found, err
}

func command(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
