// Package tunperm decides who may attach a queue to a tap, by the rule the
// kernel applies at TUNSETIFF (tun_not_capable in drivers/net/tun.c), so
// that napitapd, which acts with its own privileges on a caller's behalf
// (a fetch, or its seccomp agent's TUNSETIFF), grants exactly what the
// kernel would grant the caller itself. Who the caller is, pkg/peer says.
package tunperm

import (
	"slices"

	"github.com/napitap/napitap/pkg/peer"
)

// ownerGroupAllow is the first half of the kernel's rule: with an owner
// set, the euid must be it; with a group set, it must be the egid or a
// supplementary group; with neither, anyone who can open /dev/net/tun in
// the netns may attach.
func ownerGroupAllow(c peer.Creds, owner, group *uint32) bool {
	if owner != nil && c.EUID != *owner {
		return false
	}
	return group == nil || c.EGID == *group || slices.Contains(c.Groups, *group)
}

// MayAttach is the whole rule, for creds read with the tap's netns: the
// second half is CAP_NET_ADMIN over that netns (peer.Creds.NetAdmin).
func MayAttach(c peer.Creds, owner, group *uint32) bool {
	return c.NetAdmin || ownerGroupAllow(c, owner, group)
}
