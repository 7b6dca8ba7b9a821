// Package tunperm decides who may attach a queue to a tap, by the rule the
// kernel applies at TUNSETIFF (tun_not_capable in drivers/net/tun.c), so
// that napitapd, which acts with its own privileges on a caller's behalf,
// grants exactly what the kernel would grant the caller itself.
package tunperm

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Creds are what the kernel looks at.
type Creds struct {
	EUID   uint32
	EGID   uint32
	Groups []uint32 // supplementary
	// NetAdmin: CAP_NET_ADMIN over the tap's netns, which overrides the
	// owner and group.
	NetAdmin bool
}

// MayAttach is the kernel's rule: with an owner set, the euid must be it;
// with a group set, it must be the egid or a supplementary group; with
// neither, anyone who can open /dev/net/tun in the netns may attach.
func MayAttach(c Creds, owner, group *uint32) bool {
	if c.NetAdmin {
		return true
	}
	if owner != nil && c.EUID != *owner {
		return false
	}
	if group != nil && c.EGID != *group && !slices.Contains(c.Groups, *group) {
		return false
	}
	return true
}

// initUserNSInode is the kernel's fixed inode of the initial user namespace
// (PROC_USER_INIT_INO).
const initUserNSInode = 0xEFFFFFFD

// Of reads pid's credentials as they are now. netnsFD is the netns of the
// tap, for the CAP_NET_ADMIN override. Callers that must know pid is still
// the process they mean check that afterwards (a pidfd).
func Of(pid int, netnsFD int) (Creds, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Creds{}, err
	}
	c, capEff, err := parseStatus(status)
	if err != nil {
		return Creds{}, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	if capEff&(1<<unix.CAP_NET_ADMIN) != 0 {
		c.NetAdmin, err = ownsNetns(pid, netnsFD)
		if err != nil {
			return Creds{}, err
		}
	}
	return c, nil
}

// ownsNetns: the caller's capabilities count in its own user namespace and
// below it. Two cases are decided exactly and cover what runs on a node:
// the initial user namespace (above all) and the very user namespace that
// owns the netns. A caller in some other user namespace is refused the
// override, which errs on the side of the owner/group rule.
func ownsNetns(pid int, netnsFD int) (bool, error) {
	var callerNS unix.Stat_t
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/user", pid), &callerNS); err != nil {
		return false, err
	}
	if callerNS.Ino == initUserNSInode {
		return true, nil
	}
	owner, err := unix.IoctlRetInt(netnsFD, unix.NS_GET_USERNS)
	if err != nil {
		return false, fmt.Errorf("NS_GET_USERNS: %w", err)
	}
	defer unix.Close(owner)
	var ownerNS unix.Stat_t
	if err := unix.Fstat(owner, &ownerNS); err != nil {
		return false, err
	}
	return ownerNS.Ino == callerNS.Ino && ownerNS.Dev == callerNS.Dev, nil
}

func parseStatus(b []byte) (Creds, uint64, error) {
	var c Creds
	var capEff uint64
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
				return c, 0, fmt.Errorf("%s: %q", key, val)
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
				return c, 0, fmt.Errorf("CapEff: %q", val)
			}
			capEff, err = strconv.ParseUint(fields[0], 16, 64)
			seen++
		}
		if err != nil {
			return c, 0, fmt.Errorf("%s: %w", key, err)
		}
	}
	if seen != 3 {
		return c, 0, fmt.Errorf("no Uid, Gid or CapEff line")
	}
	return c, capEff, nil
}
