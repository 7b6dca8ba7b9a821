// Package tunperm decides who may attach a queue to a tap, by the rule the
// kernel applies at TUNSETIFF (tun_not_capable in drivers/net/tun.c), so
// that napitapd, which acts with its own privileges on a caller's behalf
// (a fetch, or its seccomp agent's TUNSETIFF), grants exactly what the
// kernel would grant the caller itself.
package tunperm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Creds are what the kernel looks at, read from /proc/PID/status
// (credentials are per thread: PID may be a thread's id).
type Creds struct {
	EUID   uint32
	EGID   uint32
	Groups []uint32 // supplementary
	CapEff uint64
	// NetAdmin: CAP_NET_ADMIN over the tap's netns, which overrides the
	// owner and group. Set by Of; Read leaves it false.
	NetAdmin bool
	// InitNetAdmin: CAP_NET_ADMIN in the initial user namespace, which
	// IFF_NAPI_FRAGS needs. Set by Of; Read leaves it false.
	InitNetAdmin bool
}

// OwnerGroupAllow is the first half of the kernel's rule: with an owner
// set, the euid must be it; with a group set, it must be the egid or a
// supplementary group; with neither, anyone who can open /dev/net/tun in
// the netns may attach.
func OwnerGroupAllow(c Creds, owner, group *uint32) bool {
	if owner != nil && c.EUID != *owner {
		return false
	}
	return group == nil || c.EGID == *group || slices.Contains(c.Groups, *group)
}

// MayAttach is the whole rule, for creds made by Of.
func MayAttach(c Creds, owner, group *uint32) bool {
	return c.NetAdmin || OwnerGroupAllow(c, owner, group)
}

// Of reads pid's credentials as they are now, NetAdmin included for the
// netns netnsFD. Callers that must know pid is still the process they mean
// check that afterwards (a pidfd, or SECCOMP_IOCTL_NOTIF_ID_VALID).
func Of(pid int, netnsFD int) (Creds, error) {
	c, err := Read(pid)
	if err != nil {
		return c, err
	}
	if c.NetAdmin, err = NetAdmin(pid, c, netnsFD); err != nil {
		return c, err
	}
	c.InitNetAdmin, err = initNetAdmin(pid, c)
	return c, err
}

// Read reads pid's credentials without the NetAdmin override.
func Read(pid int) (Creds, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Creds{}, err
	}
	c, err := parseStatus(b)
	if err != nil {
		return Creds{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return c, nil
}

// NetAdmin is the second half: ns_capable(net->user_ns, CAP_NET_ADMIN)
// for pid, the netns given by netnsFD. It follows the kernel's
// cap_capable: the caller's effective set counts in its own user
// namespace; in a descendant one, being the owner of the child of the
// caller's namespace on the way down grants everything.
func NetAdmin(pid int, c Creds, netnsFD int) (bool, error) {
	var callerNS unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &callerNS); err != nil {
		return false, err
	}
	cur, err := unix.IoctlRetInt(netnsFD, unix.NS_GET_USERNS)
	if err != nil {
		return false, fmt.Errorf("NS_GET_USERNS: %w", err)
	}
	defer func() { unix.Close(cur) }()
	same := func(fd int) (bool, error) {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return false, err
		}
		return st.Dev == callerNS.Dev && st.Ino == callerNS.Ino, nil
	}
	hasCap := c.CapEff&(1<<unix.CAP_NET_ADMIN) != 0
	for {
		if ok, err := same(cur); err != nil || ok {
			return ok && hasCap, err
		}
		parent, err := unix.IoctlRetInt(cur, unix.NS_GET_PARENT)
		if err != nil {
			// The initial namespace (or one above napitapd's) is reached
			// without meeting the caller's: it is not an ancestor.
			return false, nil
		}
		if ok, err := same(parent); err != nil || ok {
			var owner uint32
			_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(cur), unix.NS_GET_OWNER_UID, uintptr(unsafe.Pointer(&owner)))
			unix.Close(parent)
			if err != nil || errno != 0 {
				return false, fmt.Errorf("user namespace owner: %w", errors.Join(err, errnoErr(errno)))
			}
			return owner == c.EUID || hasCap, nil
		}
		unix.Close(cur)
		cur = parent
	}
}

// initNetAdmin is the kernel's capable(CAP_NET_ADMIN) for pid: the
// capability in its effective set, and its user namespace the one napitapd
// runs in, which must be the initial one for napitapd's own capable()
// checks to pass.
func initNetAdmin(pid int, c Creds) (bool, error) {
	if c.CapEff&(1<<unix.CAP_NET_ADMIN) == 0 {
		return false, nil
	}
	var caller, self unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &caller); err != nil {
		return false, err
	}
	if err := unix.Stat("/proc/self/ns/user", &self); err != nil {
		return false, err
	}
	return caller.Dev == self.Dev && caller.Ino == self.Ino, nil
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
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
		return c, fmt.Errorf("no Uid, Gid or CapEff line")
	}
	return c, nil
}
