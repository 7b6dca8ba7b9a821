package seccompagent

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

// creds are the caller thread's credentials, as tun_not_capable reads
// them (credentials are per thread on Linux).
type creds struct {
	euid, egid uint32
	groups     []uint32
	capEff     uint64
}

func (c *creds) inGroup(g uint32) bool {
	return c.egid == g || slices.Contains(c.groups, g)
}

// readCreds parses /proc/TID/status. The caller must confirm with
// SECCOMP_IOCTL_NOTIF_ID_VALID afterwards that tid was still the caller.
func readCreds(tid int) (*creds, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return nil, err
	}
	var c creds
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(val)
		switch key {
		case "Uid", "Gid":
			// real, effective, saved, fs
			if len(f) < 2 {
				return nil, fmt.Errorf("/proc/%d/status: %s: %q", tid, key, val)
			}
			v, err := strconv.ParseUint(f[1], 10, 32)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status: %s: %w", tid, key, err)
			}
			if key == "Uid" {
				c.euid = uint32(v)
			} else {
				c.egid = uint32(v)
			}
			seen++
		case "Groups":
			for _, s := range f {
				v, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("/proc/%d/status: Groups: %w", tid, err)
				}
				c.groups = append(c.groups, uint32(v))
			}
			seen++
		case "CapEff":
			v, err := strconv.ParseUint(strings.TrimSpace(val), 16, 64)
			if err != nil {
				return nil, fmt.Errorf("/proc/%d/status: CapEff: %w", tid, err)
			}
			c.capEff = v
			seen++
		}
	}
	if seen != 4 {
		return nil, fmt.Errorf("/proc/%d/status: Uid, Gid, Groups or CapEff missing", tid)
	}
	return &c, nil
}

// ownerGroupDenies is the first half of the kernel's tun_not_capable: with
// both owner and group set, the euid must be the owner AND the group one
// of the caller's; with one set, that one; with neither, anyone.
func ownerGroupDenies(t *Target, c *creds) bool {
	return (t.Owner != nil && c.euid != *t.Owner) || (t.Group != nil && !c.inGroup(*t.Group))
}

// netAdmin is the second half: ns_capable(net->user_ns, CAP_NET_ADMIN)
// for the caller thread tid, netns given by nsfd. It follows the kernel's
// cap_capable: the caller's effective set counts in its own user
// namespace; in a descendant one, being the owner of the child of the
// caller's namespace on the way down grants everything.
func netAdmin(tid int, c *creds, nsfd int) (bool, error) {
	var callerNS unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", tid), &callerNS); err != nil {
		return false, err
	}
	cur, err := unix.IoctlRetInt(nsfd, unix.NS_GET_USERNS)
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
	for {
		if ok, err := same(cur); err != nil || ok {
			return ok && c.capEff&(1<<unix.CAP_NET_ADMIN) != 0, err
		}
		parent, err := unix.IoctlRetInt(cur, unix.NS_GET_PARENT)
		if err != nil {
			// The initial namespace (or one above napitapd's) is reached
			// without meeting the caller's: it is not an ancestor.
			return false, nil
		}
		if ok, err := same(parent); err != nil || ok {
			var owner uint32
			oerr := ioctlPtr(cur, unix.NS_GET_OWNER_UID, unsafe.Pointer(&owner))
			unix.Close(parent)
			if err != nil || oerr != nil {
				return false, fmt.Errorf("user namespace owner: %w", errors.Join(err, oerr))
			}
			if owner == c.euid {
				return true, nil
			}
			return c.capEff&(1<<unix.CAP_NET_ADMIN) != 0, nil
		}
		unix.Close(cur)
		cur = parent
	}
}
