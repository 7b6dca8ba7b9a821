package peer

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Creds are what the kernel looks at when a process acts (credentials are
// per thread: they are read by a thread's id where one is given).
type Creds struct {
	EUID   uint32
	EGID   uint32
	Groups []uint32 // supplementary; see GroupsRead
	// GroupsRead: Groups were read. Thread leaves them out (ThreadGroups
	// reads them): the kernel asks for them only of a caller that is not
	// in a tap's group by its egid, and reading them is most of the cost.
	GroupsRead bool
	// CapEff is the effective set as /proc shows it: it holds in the
	// process's own user namespace, which may be one it made itself.
	CapEff uint64
	// NetAdmin: CAP_NET_ADMIN over the netns asked about
	// (ns_capable(net->user_ns)), which overrides a tap's owner and group.
	NetAdmin bool
	// InitNetAdmin: CAP_NET_ADMIN in napitapd's user namespace, the
	// initial one (capable()), which IFF_NAPI_FRAGS needs.
	InitNetAdmin bool
	// PID is the thread's process (its thread group), which
	// PIDFD_GET_INFO and /proc/TID/status give with the credentials; 0
	// where unread.
	PID int

	napitapdCaps uint64 // the capabilities of CapEff that hold in napitapd's user namespace
	userNS       nsID
}

// Thread reads the credentials of the thread tid as they are now, NetAdmin
// over the netns netns (nil: none asked), without its supplementary
// groups (GroupsRead false): its euid and egid from pidfd, a pidfd of
// that thread (PIDFD_GET_INFO, Linux 6.13), its capabilities from
// capget(2). A kernel without PIDFD_GET_INFO gets /proc/TID/status read,
// groups included. The caller confirms afterwards that tid is still the
// thread it means (the seccomp agent's SECCOMP_IOCTL_NOTIF_ID_VALID).
//
// A thread with no effective capability is not looked up in its user
// namespace unless the netns's owners make it matter: without one, it has
// a capability over the netns only as the owner of one of its user
// namespaces, and in napitapd's none.
func Thread(tid, pidfd int, netns *Netns) (Creds, error) {
	info := pidfdInfo{Mask: pidfdInfoCreds}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(pidfd), pidfdGetInfo, uintptr(unsafe.Pointer(&info))); errno != 0 {
		if errno != unix.ENOTTY && errno != unix.EINVAL {
			return Creds{}, goneOr(fmt.Errorf("PIDFD_GET_INFO: %w", errno))
		}
		c, err := readCreds(tid, netns)
		return c, goneOr(err)
	}
	c, err := capget(tid)
	if err != nil {
		return c, goneOr(err)
	}
	c.EUID, c.EGID, c.PID = info.Euid, info.Egid, int(info.Tgid)
	if c.CapEff == 0 && !netns.ownedBy(c.EUID) {
		return c, nil
	}
	if err := c.judge(tid); err != nil {
		return c, goneOr(err)
	}
	c.netAdmin(netns)
	return c, nil
}

// ThreadGroups reads the supplementary groups of the thread tid.
func ThreadGroups(tid int) ([]uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return nil, goneOr(err)
	}
	c, err := parseStatus(b)
	return c.Groups, err
}

// Own is this process's credentials.
func Own() (Creds, error) { return readCreds(os.Getpid(), nil) }

// readCreds reads pid's status and user namespace, and judges its
// capabilities.
func readCreds(pid int, netns *Netns) (Creds, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Creds{}, err
	}
	c, err := parseStatus(b)
	if err != nil {
		return c, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	c.GroupsRead = true
	if err := c.judge(pid); err != nil {
		return c, err
	}
	c.netAdmin(netns)
	return c, nil
}

// struct pidfd_info of include/uapi/linux/pidfd.h (Linux 6.13), as far as
// its credentials, and PIDFD_GET_INFO: _IOWR(0xFF, 11, struct pidfd_info).
type pidfdInfo struct {
	Mask                                             uint64
	CgroupID                                         uint64
	Pid, Tgid, Ppid                                  uint32
	Ruid, Rgid, Euid, Egid, Suid, Sgid, Fsuid, Fsgid uint32
	ExitCode                                         int32
	CoredumpMask                                     uint32
	_                                                uint32
}

const (
	pidfdInfoCreds = 1 << 1
	pidfdGetInfo   = 3<<30 | uintptr(unsafe.Sizeof(pidfdInfo{}))<<16 | 0xff<<8 | 11
)

// Netns is what a capability over a network namespace is judged by: the
// user namespace that owns it and that one's ancestors, as far up as
// napitapd sees, each with the uid that made it. None of that changes
// while the netns lives, so one Netns serves every question about that
// netns (the seccomp agent keeps it by the netns's id, which the kernel
// never gives another).
type Netns struct{ owners userNSChain }

// NetnsOf reads the owners of the netns nsfd.
func NetnsOf(nsfd int) (*Netns, error) {
	owner, err := unix.IoctlRetInt(nsfd, unix.NS_GET_USERNS)
	if err != nil {
		return nil, fmt.Errorf("NS_GET_USERNS: %w", err)
	}
	chain, err := chainOf(owner)
	unix.Close(owner)
	if err != nil {
		return nil, fmt.Errorf("owners of the netns: %w", err)
	}
	return &Netns{chain}, nil
}

// ownedBy: the netns has an owner below the top napitapd sees that uid
// made, so that a process of that uid in the owner's parent has every
// capability over the netns.
func (n *Netns) ownedBy(uid uint32) bool {
	if n == nil {
		return false
	}
	for _, ns := range n.owners[:max(len(n.owners)-1, 0)] {
		if ns.owner == uid {
			return true
		}
	}
	return false
}

// netAdmin sets InitNetAdmin, and NetAdmin over netns (nil: none asked),
// from the capabilities judge found.
func (c *Creds) netAdmin(netns *Netns) {
	c.InitNetAdmin = c.napitapdCaps&(1<<unix.CAP_NET_ADMIN) != 0
	if netns != nil {
		c.NetAdmin = c.capsOver(netns.owners)&(1<<unix.CAP_NET_ADMIN) != 0
	}
}

// capsOf is pid's uid-free credentials without opening a file: its
// effective capabilities (capget(2)) judged in its user namespace.
func capsOf(pid int) (Creds, error) {
	c, err := capget(pid)
	if err != nil {
		return c, err
	}
	return c, c.judge(pid)
}

// capget is pid's effective capabilities, as they hold in its own user
// namespace.
func capget(pid int) (Creds, error) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3, Pid: int32(pid)}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return Creds{}, fmt.Errorf("capget: %w", err)
	}
	return Creds{CapEff: uint64(data[1].Effective)<<32 | uint64(data[0].Effective)}, nil
}

// judge finds pid's user namespace and the capabilities of c that hold in
// napitapd's.
func (c *Creds) judge(pid int) error {
	own, err := ownUserNS()
	if err != nil {
		return fmt.Errorf("napitapd's user namespace: %w", err)
	}
	var st unix.Stat_t
	err = unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &st)
	switch {
	case err == nil:
		c.userNS = nsID{st.Dev, st.Ino}
	case errors.Is(err, unix.EACCES):
		// No ptrace access to pid (the fd holder has no capability, and
		// napitapd is not dumpable). Its uid_map, which anyone may read,
		// tells napitapd's namespace from one a capability-less root
		// made: that one maps no uid 0, as mapping it needs CAP_SETFCAP
		// over the parent namespace (Linux 5.12, DESIGN.md fact 25).
		same, err := sameUIDMap(pid)
		if err != nil {
			return fmt.Errorf("user namespace of pid %d: %w", pid, err)
		}
		if same {
			c.userNS = own[0].id
		}
	default:
		return fmt.Errorf("user namespace of pid %d: %w", pid, err)
	}
	c.napitapdCaps = c.capsOver(own)
	return nil
}

// sameUIDMap: pid's /proc uid_map reads as this process's own.
func sameUIDMap(pid int) (bool, error) {
	own, err := ownUIDMap()
	if err != nil {
		return false, err
	}
	theirs, err := os.ReadFile(fmt.Sprintf("/proc/%d/uid_map", pid))
	return err == nil && bytes.Equal(theirs, own), err
}

var ownUIDMap = sync.OnceValues(func() ([]byte, error) { return os.ReadFile("/proc/self/uid_map") })

// capsOver is the kernel's cap_capable for every capability at once: those
// of c's that hold over objects owned by the first user namespace of
// chain. From there up: in c's own namespace its effective set counts; in
// a child of c's namespace that c's euid owns, c has every capability; a
// namespace that is not c's own or below it gives c nothing.
func (c *Creds) capsOver(chain userNSChain) uint64 {
	for i, ns := range chain {
		if ns.id == c.userNS {
			return c.CapEff
		}
		if i+1 < len(chain) && chain[i+1].id == c.userNS && ns.owner == c.EUID {
			return ^uint64(0)
		}
	}
	return 0
}

// userNSChain is a user namespace and its ancestors, as far up as
// napitapd sees (NS_GET_PARENT refuses a namespace above its own).
type userNSChain []userNS

type userNS struct {
	id    nsID
	owner uint32 // the euid of the process that made it
}

// chainOf reads the user namespace fd and its ancestors; fd is not closed.
func chainOf(fd int) (userNSChain, error) {
	var chain userNSChain
	cur := fd
	defer func() {
		if cur != fd {
			unix.Close(cur)
		}
	}()
	for {
		id, err := idOf(cur)
		if err != nil {
			return nil, err
		}
		var owner uint32
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(cur), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&owner))); errno != 0 {
			return nil, fmt.Errorf("user namespace owner: %w", errno)
		}
		chain = append(chain, userNS{id, owner})
		parent, err := unix.IoctlRetInt(cur, unix.NS_GET_PARENT)
		if errors.Is(err, unix.EPERM) {
			// The initial namespace, or napitapd's.
			return chain, nil
		}
		if err != nil {
			// Not the top: a chain cut short here would be cached for the
			// netns, and deny for good what the kernel allows.
			return nil, fmt.Errorf("user namespace parent: %w", err)
		}
		if cur != fd {
			unix.Close(cur)
		}
		cur = parent
	}
}

// ownUserNS is napitapd's user namespace, which it never leaves, and its
// ancestors.
var ownUserNS = sync.OnceValues(func() (userNSChain, error) {
	fd, err := unix.Open("/proc/self/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return chainOf(fd)
})

// nsID names a namespace: nsfs's device and inode.
type nsID struct{ dev, ino uint64 }

func (n nsID) String() string {
	if n.ino == 0 {
		return "one whose uid_map is not napitapd's"
	}
	return fmt.Sprintf("user:[%d]", n.ino)
}

func idOf(fd int) (nsID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nsID{}, err
	}
	return nsID{st.Dev, st.Ino}, nil
}

func parseStatus(b []byte) (Creds, error) {
	var c Creds
	seen := 0
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		fields := strings.Fields(val)
		var err error
		switch key {
		case "Tgid":
			if len(fields) == 1 {
				c.PID, err = strconv.Atoi(fields[0])
			}
		case "Uid", "Gid":
			// real, effective, saved, fs
			if len(fields) < 2 {
				return c, fmt.Errorf("%s: %q", key, val)
			}
			var id uint64
			id, err = strconv.ParseUint(fields[1], 10, 32)
			if key == "Uid" {
				c.EUID = uint32(id)
			} else {
				c.EGID = uint32(id)
			}
			seen++
		case "Groups":
			for _, f := range fields {
				var g uint64
				if g, err = strconv.ParseUint(f, 10, 32); err != nil {
					break
				}
				c.Groups = append(c.Groups, uint32(g))
			}
		case "CapEff":
			if len(fields) != 1 {
				return c, fmt.Errorf("CapEff: %q", val)
			}
			c.CapEff, err = strconv.ParseUint(fields[0], 16, 64)
			seen++
		}
		if err != nil {
			return c, fmt.Errorf("%s: %w", key, err)
		}
	}
	if seen != 3 {
		return c, errors.New("no Uid, Gid or CapEff line")
	}
	return c, nil
}
