package seccompagent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/peer"
)

// fileNetns opens the network namespace of an open /dev/net/tun file: the
// one TUNSETIFF looks the name up in, whatever netns its holder is in now.
func fileNetns(tunfd int) (int, error) {
	nsfd, err := unix.IoctlRetInt(tunfd, unix.SIOCGSKNS)
	if err != nil {
		return -1, fmt.Errorf("SIOCGSKNS: %w", err)
	}
	return nsfd, nil
}

// netnsSocket is a rtnetlink socket in one netns, kept by a listener's
// goroutine for the next queue of the same runtime: making one costs two
// setns. It pins that netns, at most until the listener's processes are
// gone.
type netnsSocket struct {
	netnsID uint64
	fd      int // -1: none
	seq     uint32
	// The alias last read, for the link of that index: a VM's queues are
	// one TUNSETIFF each, and only the first needs to read it.
	aliasIndex int32
	alias      string
	// owners are the user namespaces of the netns ownersID, for the
	// caller's CAP_NET_ADMIN over it (peer.NetnsOf), read once per netns:
	// they never change, and the kernel never gives the id to another
	// netns (tapsetup.NetnsIDOf).
	ownersID uint64
	owners   *peer.Netns
}

// netnsOwners is peer.NetnsOf of the netns nsfd, whose id is netnsID.
func (c *netnsSocket) netnsOwners(nsfd int, netnsID uint64) (*peer.Netns, error) {
	if c.owners == nil || c.ownersID != netnsID {
		owners, err := peer.NetnsOf(nsfd)
		if err != nil {
			return nil, err
		}
		c.ownersID, c.owners = netnsID, owners
	}
	return c.owners, nil
}

func newNetnsSocket() *netnsSocket { return &netnsSocket{fd: -1} }

func (c *netnsSocket) close() {
	if c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// tapMark reports whether a link named name exists in the netns nsfd
// (netnsID), and its ifalias: napitap marks its taps with their
// attachment. TUNSETIFF by napitapd on a name that is gone would create a
// tap with napitapd's rights, which the caller could not have done.
func tapMark(nsfd int, netnsID uint64, name string, c *netnsSocket) (exists bool, alias string, err error) {
	if c.fd < 0 || c.netnsID != netnsID {
		c.close()
		fd, err := rtnetlinkIn(nsfd)
		if err != nil {
			return false, "", err
		}
		c.netnsID, c.fd, c.aliasIndex = netnsID, fd, 0
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return false, "", err
	}
	// Any socket answers SIOCGIFINDEX for the netns it was made in.
	err = unix.IoctlIfreq(c.fd, unix.SIOCGIFINDEX, ifr)
	if errors.Is(err, unix.ENODEV) {
		return false, "", nil
	}
	if err != nil {
		return false, "", fmt.Errorf("SIOCGIFINDEX %q: %w", name, err)
	}
	// An index names one link for as long as it exists; a tap deleted
	// and made again gets a new one.
	index := int32(ifr.Uint32())
	if index == c.aliasIndex {
		return true, c.alias, nil
	}
	exists, alias, err = c.getLink(name)
	if err != nil {
		c.close() // a reply left unread would confuse the next request
		return false, "", err
	}
	c.aliasIndex, c.alias = index, alias
	return exists, alias, nil
}

// getLink asks RTM_GETLINK for one name and reads IFLA_IFALIAS from the
// answer. A hand-made request, not a netlink library's: this runs on
// every intercepted TUNSETIFF, and decoding the whole link costs more
// than the rest of the agent's work.
func (c *netnsSocket) getLink(name string) (bool, string, error) {
	c.seq++
	attrLen := unix.SizeofRtAttr + len(name) + 1
	req := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg+rtaAlign(attrLen))
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.RTM_GETLINK)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST)
	binary.NativeEndian.PutUint32(req[8:], c.seq)
	a := req[unix.SizeofNlMsghdr+unix.SizeofIfInfomsg:]
	binary.NativeEndian.PutUint16(a[0:], uint16(attrLen))
	binary.NativeEndian.PutUint16(a[2:], unix.IFLA_IFNAME)
	copy(a[unix.SizeofRtAttr:], name)
	if err := unix.Sendto(c.fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return false, "", fmt.Errorf("RTM_GETLINK %q: %w", name, err)
	}
	// Shared, not one per listener: a node may have a thousand listeners,
	// all idle.
	bufp := linkBufs.Get().(*[]byte)
	defer linkBufs.Put(bufp)
	buf := *bufp
	for {
		n, _, err := unix.Recvfrom(c.fd, buf, unix.MSG_TRUNC) // n: the whole length
		if err != nil {
			return false, "", fmt.Errorf("RTM_GETLINK %q: %w", name, err)
		}
		if n > len(buf) {
			return false, "", fmt.Errorf("RTM_GETLINK %q: answer of %d bytes", name, n)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return false, "", fmt.Errorf("RTM_GETLINK %q: %w", name, err)
		}
		for _, m := range msgs {
			if m.Header.Seq != c.seq {
				continue // an answer to an earlier, abandoned request
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return false, "", fmt.Errorf("RTM_GETLINK %q: short error", name)
				}
				errno := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data)))
				if errno == unix.ENODEV {
					return false, "", nil
				}
				return false, "", fmt.Errorf("RTM_GETLINK %q: %w", name, errno)
			case unix.RTM_NEWLINK:
				attrs, err := syscall.ParseNetlinkRouteAttr(&m)
				if err != nil {
					return false, "", fmt.Errorf("RTM_GETLINK %q: %w", name, err)
				}
				for _, at := range attrs {
					if at.Attr.Type == unix.IFLA_IFALIAS {
						return true, strings.TrimRight(string(at.Value), "\x00"), nil
					}
				}
				return true, "", nil
			}
		}
	}
}

// linkBufs hold one RTM_NEWLINK answer each (a tap's is about 2 KiB).
var linkBufs = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

func rtaAlign(n int) int { return (n + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1) }

// rtnetlinkIn makes a rtnetlink socket in the netns nsfd, from a thread
// that goes back to its own netns at once.
func rtnetlinkIn(nsfd int) (int, error) {
	runtime.LockOSThread()
	home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("own netns: %w", err)
	}
	defer unix.Close(home)
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("setns: %w", err)
	}
	sock, serr := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err := unix.Setns(home, unix.CLONE_NEWNET); err != nil {
		// This thread stays locked, and Go ends it with its goroutine,
		// rather than run anything else in a pod's netns.
		if serr == nil {
			unix.Close(sock)
		}
		return -1, fmt.Errorf("setns back to napitapd's netns: %w", err)
	}
	runtime.UnlockOSThread()
	if serr != nil {
		return -1, fmt.Errorf("rtnetlink socket: %w", serr)
	}
	// A kernel that never answers must not hold the caller for long.
	tv := unix.NsecToTimeval(int64(time.Second))
	if err := unix.SetsockoptTimeval(sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(sock)
		return -1, err
	}
	if err := unix.Bind(sock, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(sock)
		return -1, fmt.Errorf("bind rtnetlink socket: %w", err)
	}
	return sock, nil
}
