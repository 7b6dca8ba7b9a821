// Package tapsetup creates, opens, inspects, verifies, wires and deletes the
// taps napitap gives to VM pods. Functions that take no netns argument act on
// the network namespace of the calling thread; callers use ns.Do.
package tapsetup

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const tunDevice = "/dev/net/tun"

// QueueFlags are the TUNSETIFF flags a queue is opened with. NAPI is chosen
// per queue by whoever opens it (DESIGN.md fact 1), so these travel with
// every open, not just the first.
type QueueFlags struct {
	MultiQueue bool
	VnetHdr    bool
	NAPI       bool
	NAPIFrags  bool
}

func (f QueueFlags) ifrFlags() uint16 {
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if f.MultiQueue {
		flags |= unix.IFF_MULTI_QUEUE
	}
	if f.VnetHdr {
		flags |= unix.IFF_VNET_HDR
	}
	if f.NAPI {
		flags |= unix.IFF_NAPI
	}
	if f.NAPIFrags {
		flags |= unix.IFF_NAPI_FRAGS
	}
	return flags
}

// Spec is the tap ADD creates.
type Spec struct {
	Name        string
	Queues      int
	Flags       QueueFlags
	VnetHdrSize int // applied when Flags.VnetHdr
	Owner       *uint32
	Group       *uint32
	MTU         int              // 0 keeps the kernel default
	MAC         net.HardwareAddr // nil keeps the kernel's random MAC
	TxQueueLen  *int
	// RootQdisc is set before the tap first goes up (QdiscNoqueue); empty
	// leaves the kernel's default to be attached then.
	RootQdisc string
	// Alias marks the tap as one attachment's (OwnerAlias), so that DEL
	// and GC never take another attachment's tap for theirs.
	Alias string
}

// Features returns the TUNGETFEATURES mask of this kernel.
func Features() (uint32, error) {
	fd, err := unix.Open(tunDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", tunDevice, err)
	}
	defer unix.Close(fd)
	features, err := unix.IoctlGetUint32(fd, unix.TUNGETFEATURES)
	if err != nil {
		return 0, fmt.Errorf("TUNGETFEATURES on %s: %w", tunDevice, err)
	}
	return features, nil
}

// CheckFeatures fails when the kernel cannot honour flags. TUNSETIFF drops
// flags it does not know without a word (fact 11), so ask first.
func CheckFeatures(flags QueueFlags) error {
	have, err := Features()
	if err != nil {
		return err
	}
	var needs []KernelNeed
	for _, w := range []struct {
		on   bool
		need KernelNeed
	}{
		{flags.MultiQueue, KernelNeed{Field: "multiQueue", Feature: unix.IFF_MULTI_QUEUE, What: "IFF_MULTI_QUEUE"}},
		{flags.VnetHdr, KernelNeed{Field: "vnetHdr", Feature: unix.IFF_VNET_HDR, What: "IFF_VNET_HDR"}},
		{flags.NAPI, KernelNeed{Field: "napi", Feature: unix.IFF_NAPI, What: "IFF_NAPI (Linux 4.15+)"}},
		{flags.NAPIFrags, KernelNeed{Field: "napiFrags", Feature: unix.IFF_NAPI_FRAGS, What: "IFF_NAPI_FRAGS"}},
	} {
		if w.on {
			needs = append(needs, w.need)
		}
	}
	return RequireKernel(needs, have, "")
}

// MaxQueues is MAX_TAP_QUEUES in drivers/net/tun.c: a tap has at most
// this many queues.
const MaxQueues = 256

// Create makes the persistent tap of spec in the current netns and returns
// it with its queues open, so that NAPI knobs can be applied while every
// queue is attached (fact 9). It fails with ErrExists if a link of that
// name exists: the tap must be ours. On error nothing is left behind.
//
// The tap is made under a random temporary name, marked with spec.Alias,
// only then made persistent, and takes its name last (see IsTempName): a
// link of spec.Name is napitap's exactly when it carries the mark, and a
// tap of an ADD killed half-way either goes with its last queue or carries
// the mark DeleteLeftovers goes by. Queues stay attached across the rename.
func Create(spec Spec) (tap *netlink.Tuntap, queues []*os.File, err error) {
	return perRequest.Create(spec)
}

// Create is Create on n's socket.
func (n *Netlink) Create(spec Spec) (tap *netlink.Tuntap, queues []*os.File, err error) {
	if spec.Queues < 1 || spec.Queues > MaxQueues {
		return nil, nil, fmt.Errorf("tap %q: %d queues requested, want 1-%d", spec.Name, spec.Queues, MaxQueues)
	}
	// Fail before making anything; the rename is what settles a race.
	if err := n.RequireFree(spec.Name); err != nil {
		return nil, nil, fmt.Errorf("tap %q: %w", spec.Name, err)
	}
	// IFF_TUN_EXCL turns "attach to an existing link" into EBUSY, so the
	// tap is always a new one.
	var first *os.File
	temp, err := underTempName(tempTapPrefix, func(name string) (err error) {
		first, err = openQueue(name, spec.Flags.ifrFlags()|unix.IFF_TUN_EXCL)
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("tap %q: %w", spec.Name, err)
	}
	queues = []*os.File{first}
	name := temp // what the tap is called now
	defer func() {
		if err != nil {
			CloseQueues(queues)
			_ = n.deleteLink(name)
			tap, queues = nil, nil
		}
	}()

	link, err := n.safe().LinkByName(temp)
	if err != nil {
		return nil, nil, fmt.Errorf("tap %q: %w", spec.Name, err)
	}
	// Before TUNSETPERSIST: until then the tap goes with its last queue.
	if spec.Alias != "" {
		if err = n.h.LinkSetAlias(link, spec.Alias); err != nil {
			return nil, nil, fmt.Errorf("tap %q: set alias %q: %w", spec.Name, spec.Alias, err)
		}
	}
	if err = configureDevice(first, spec); err != nil {
		return nil, nil, err
	}
	rest, err := OpenQueues(temp, spec.Queues-1, spec.Flags)
	if err != nil {
		return nil, nil, fmt.Errorf("tap %q: %w", spec.Name, err)
	}
	queues = append(queues, rest...)

	if err = n.applyLinkAttrs(link, spec); err != nil {
		return nil, nil, err
	}
	// Last: the tap is down, so the kernel allows it, and a name taken
	// meanwhile gives EEXIST and leaves that link alone.
	if err = n.h.LinkSetName(link, spec.Name); err != nil {
		if errors.Is(err, unix.EEXIST) {
			if err = n.RequireFree(spec.Name); err == nil {
				err = ErrExists // gone again already
			}
		}
		return nil, nil, fmt.Errorf("tap %q: rename from %q: %w", spec.Name, temp, err)
	}
	name = spec.Name
	if link, err = n.safe().LinkByName(name); err != nil {
		return nil, nil, fmt.Errorf("tap %q: %w", name, err)
	}
	tap, ok := link.(*netlink.Tuntap)
	if !ok {
		return nil, nil, fmt.Errorf("tap %q: netlink reports a %s link", name, link.Type())
	}
	return tap, queues, nil
}

// configureDevice sets what is device-wide and survives the queues: persist,
// owner, group and the vnet header size.
func configureDevice(q *os.File, spec Spec) error {
	fd := int(q.Fd())
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("tap %q: TUNSETPERSIST: %w", spec.Name, err)
	}
	// netlink's Tuntap always sets owner and group, turning "unset" into
	// root; only set what the config names (fact 11).
	if spec.Owner != nil {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, int(*spec.Owner)); err != nil {
			return fmt.Errorf("tap %q: TUNSETOWNER %d: %w", spec.Name, *spec.Owner, err)
		}
	}
	if spec.Group != nil {
		if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, int(*spec.Group)); err != nil {
			return fmt.Errorf("tap %q: TUNSETGROUP %d: %w", spec.Name, *spec.Group, err)
		}
	}
	if spec.Flags.VnetHdr && spec.VnetHdrSize != 0 {
		if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, spec.VnetHdrSize); err != nil {
			return fmt.Errorf("tap %q: TUNSETVNETHDRSZ %d: %w", spec.Name, spec.VnetHdrSize, err)
		}
	}
	return nil
}

func (n *Netlink) applyLinkAttrs(link netlink.Link, spec Spec) error {
	if spec.MTU != 0 {
		if err := n.h.LinkSetMTU(link, spec.MTU); err != nil {
			return fmt.Errorf("tap %q: set mtu %d: %w", spec.Name, spec.MTU, err)
		}
	}
	if spec.MAC != nil {
		if err := n.h.LinkSetHardwareAddr(link, spec.MAC); err != nil {
			return fmt.Errorf("tap %q: set mac %s: %w", spec.Name, spec.MAC, err)
		}
	}
	if spec.TxQueueLen != nil {
		if err := n.h.LinkSetTxQLen(link, *spec.TxQueueLen); err != nil {
			return fmt.Errorf("tap %q: set txqueuelen %d: %w", spec.Name, *spec.TxQueueLen, err)
		}
	}
	if spec.RootQdisc != "" {
		if err := n.setRootQdisc(link, spec.RootQdisc); err != nil {
			return fmt.Errorf("tap %q: %w", spec.Name, err)
		}
	}
	return nil
}

// OpenQueues attaches n queues to the existing tap name in the current
// netns, each opened with flags. This is the one place queues are opened:
// ADD and the hand-off both come through here, so NAPI is never forgotten.
func OpenQueues(name string, n int, flags QueueFlags) ([]*os.File, error) {
	queues := make([]*os.File, 0, n)
	for i := 0; i < n; i++ {
		q, err := openQueue(name, flags.ifrFlags())
		if err != nil {
			CloseQueues(queues)
			return nil, fmt.Errorf("queue %d: %w", len(queues)+1, err)
		}
		queues = append(queues, q)
	}
	return queues, nil
}

func openQueue(name string, ifrFlags uint16) (*os.File, error) {
	fd, err := unix.Open(tunDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tap %q: open %s: %w", name, tunDevice, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap %q: %w", name, err)
	}
	ifr.SetUint16(ifrFlags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tap %q: TUNSETIFF flags 0x%x: %w", name, ifrFlags, err)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

// QueueFlagsOf reports the flags a queue fd was attached with (TUNGETIFF).
// For NAPI this is the device's view (fact 2); napiprobe is the real proof.
func QueueFlagsOf(q *os.File) (uint16, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(int(q.Fd()), unix.TUNGETIFF, ifr); err != nil {
		return 0, fmt.Errorf("TUNGETIFF on %s: %w", q.Name(), err)
	}
	return ifr.Uint16(), nil
}

// CloseQueues closes every queue; closing detaches it from the tap.
func CloseQueues(queues []*os.File) {
	for _, q := range queues {
		q.Close()
	}
}
