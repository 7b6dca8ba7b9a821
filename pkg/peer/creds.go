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
	Groups []uint32 // supplementary
	// CapEff is the effective set as /proc shows it: it holds in the
	// process's own user namespace, which may be one it made itself.
	CapEff uint64
	// NetAdmin: CAP_NET_ADMIN over the netns asked about
	// (ns_capable(net->user_ns)), which overrides a tap's owner and group.
	NetAdmin bool
	// InitNetAdmin: CAP_NET_ADMIN in napitapd's user namespace, the
	// initial one (capable()), which IFF_NAPI_FRAGS needs.
	InitNetAdmin bool

	napitapdCaps uint64 // the capabilities of CapEff that hold in napitapd's user namespace
	userNS       nsID
}

// Thread reads the credentials of the thread tid as they are now, NetAdmin
// over the netns netnsFD (-1: none asked). Nothing pins tid: the caller
// confirms afterwards that it is still the thread it means (the seccomp
// agent's SECCOMP_IOCTL_NOTIF_ID_VALID).
func Thread(tid int, netnsFD int) (Creds, error) {
	userNS, err := unix.Open(fmt.Sprintf("/proc/%d/ns/user", tid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return Creds{}, goneOr(err)
	}
	defer unix.Close(userNS)
	c, err := readCreds(tid, userNS, netnsFD)
	return c, goneOr(err)
}

// Own is this process's credentials.
func Own() (Creds, error) { return Thread(os.Getpid(), -1) }

// readCreds reads pid's status, then judges its capabilities from userNS,
// an fd of its user namespace.
func readCreds(pid, userNS, netnsFD int) (Creds, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Creds{}, err
	}
	c, err := parseStatus(b)
	if err != nil {
		return c, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	if c.userNS, err = idOf(userNS); err != nil {
		return c, fmt.Errorf("user namespace of pid %d: %w", pid, err)
	}
	own, err := ownUserNS()
	if err != nil {
		return c, fmt.Errorf("napitapd's user namespace: %w", err)
	}
	if c.napitapdCaps, err = c.capsOver(own.fd); err != nil {
		return c, err
	}
	c.InitNetAdmin = c.napitapdCaps&(1<<unix.CAP_NET_ADMIN) != 0
	if netnsFD >= 0 {
		owner, err := unix.IoctlRetInt(netnsFD, unix.NS_GET_USERNS)
		if err != nil {
			return c, fmt.Errorf("NS_GET_USERNS: %w", err)
		}
		caps, err := c.capsOver(owner)
		unix.Close(owner)
		if err != nil {
			return c, err
		}
		c.NetAdmin = caps&(1<<unix.CAP_NET_ADMIN) != 0
	}
	return c, nil
}

// capsOver is the kernel's cap_capable for every capability at once: those
// of c's that hold over objects owned by the user namespace target. From
// target up: in c's own namespace its effective set counts; in a child of
// c's namespace that c's euid owns, c has every capability; a namespace
// that is not c's own or below it gives c nothing. target is not closed.
func (c *Creds) capsOver(target int) (uint64, error) {
	cur := target
	defer func() {
		if cur != target {
			unix.Close(cur)
		}
	}()
	for {
		id, err := idOf(cur)
		if err != nil {
			return 0, err
		}
		if id == c.userNS {
			return c.CapEff, nil
		}
		parent, err := unix.IoctlRetInt(cur, unix.NS_GET_PARENT)
		if err != nil {
			// The initial namespace (or one above napitapd's) is reached
			// without meeting c's: it is not an ancestor of target.
			return 0, nil
		}
		pid, err := idOf(parent)
		if err == nil && pid == c.userNS {
			var owner uint32
			_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(cur), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&owner)))
			unix.Close(parent)
			if errno != 0 {
				return 0, fmt.Errorf("user namespace owner: %w", errno)
			}
			if owner == c.EUID {
				return ^uint64(0), nil
			}
			return c.CapEff, nil
		}
		if cur != target {
			unix.Close(cur)
		}
		cur = parent
		if err != nil {
			return 0, err
		}
	}
}

// ownUserNS is napitapd's user namespace, which it never leaves: opened
// once, and kept open for the process's life.
var ownUserNS = sync.OnceValues(func() (namespace, error) {
	fd, err := unix.Open("/proc/self/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return namespace{fd: -1}, err
	}
	id, err := idOf(fd)
	return namespace{fd: fd, id: id}, err
})

type namespace struct {
	fd int
	id nsID
}

// nsID names a namespace: nsfs's device and inode.
type nsID struct{ dev, ino uint64 }

func (n nsID) String() string { return fmt.Sprintf("user:[%d]", n.ino) }

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
