package seccompagent

// napitapctl launch runs a tree of processes (a Kata shim and its VMM)
// that may make its own taps rather than open napitap's: Kata's Go runtime
// creates tapN_kata in the pod netns and opens its queues itself
// (docs/DESIGN.md fact 23). On a listener napitapctl launch sent, a
// TUNSETIFF that creates a tap gets IFF_NAPI, and so do the later ones
// through that listener on a tap created so; a tap that exists and that
// neither napitap nor the tree made stays the kernel's. The agent acts in
// the caller's credentials, as for napitap's taps: creating a tap needs
// the caller's own CAP_NET_ADMIN over the netns (tun_set_iff), IFF_NAPI
// needs none, and IFF_NAPI_FRAGS is never added (docs/threat-model.md).

// ownTaps are the taps the tree created through one listener; nil on a
// listener that is not napitapctl launch's. The listener's goroutine owns
// it. It starts empty after a takeover or a restart: a tap created before
// keeps the queues it has, and a later queue of it gets none.
type ownTaps map[ownTap]struct{}

type ownTap struct {
	netnsID uint64
	name    string
}

// maxOwnTaps bounds what a listener remembers: a sandbox has a tap per
// network, and a tap deleted never tells.
const maxOwnTaps = 256

func (o ownTaps) has(netnsID uint64, name string) bool {
	_, ok := o[ownTap{netnsID, name}]
	return ok
}

func (o ownTaps) add(netnsID uint64, name string) {
	if len(o) >= maxOwnTaps {
		for old := range o {
			delete(o, old)
			break
		}
	}
	o[ownTap{netnsID, name}] = struct{}{}
}
