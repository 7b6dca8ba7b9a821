package tapsetup

import (
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RedirectPriority is the tc priority of napitap's filters, so that DEL and
// CHECK find exactly the filters napitap made and nobody else's.
const RedirectPriority = 0x4e41

// WireRedirect joins peer and tap with a match-all u32 filter and a mirred
// egress redirect on the ingress of each, the way tc-redirect-tap and Kata's
// tcfilter do: what arrives on one leaves through the other. u32, not
// matchall, because u32 is in every kernel config that has mirred. On error
// it undoes itself.
func WireRedirect(peerName, tapName string) (err error) {
	return perRequest.WireRedirect(peerName, tapName)
}

// WireRedirect is WireRedirect on n's socket.
func (n *Netlink) WireRedirect(peerName, tapName string) (err error) {
	peer, tap, err := n.linkPair(peerName, tapName)
	if err != nil {
		return err
	}
	return n.WireRedirectLinks(peer, tap)
}

// WireRedirectLinks is WireRedirect for links the caller has looked up
// already: only their names and indexes count.
func (n *Netlink) WireRedirectLinks(peer, tap netlink.Link) (err error) {
	defer func() {
		if err != nil {
			_ = n.UnwireRedirect(peer.Attrs().Name)
		}
	}()
	for _, pair := range [][2]netlink.Link{{peer, tap}, {tap, peer}} {
		from, to := pair[0], pair[1]
		if err := n.ensureClsact(from); err != nil {
			return err
		}
		// A nil selector is netlink's match-all u32.
		filter := &netlink.U32{
			FilterAttrs: netlink.FilterAttrs{
				LinkIndex: from.Attrs().Index,
				Parent:    netlink.HANDLE_MIN_INGRESS,
				Priority:  RedirectPriority,
				Protocol:  unix.ETH_P_ALL,
			},
			Actions: []netlink.Action{netlink.NewMirredAction(to.Attrs().Index)},
		}
		if err := n.h.FilterAdd(filter); err != nil {
			return fmt.Errorf("redirect filter %q -> %q: %w", from.Attrs().Name, to.Attrs().Name, err)
		}
	}
	return nil
}

// linkPair looks up the two ends a wiring joins.
func (n *Netlink) linkPair(peerName, tapName string) (peer, tap netlink.Link, err error) {
	if peer, err = n.safe().LinkByName(peerName); err != nil {
		return nil, nil, fmt.Errorf("interface %q: %w", peerName, err)
	}
	if tap, err = n.safe().LinkByName(tapName); err != nil {
		return nil, nil, fmt.Errorf("tap %q: %w", tapName, err)
	}
	return peer, tap, nil
}

func (n *Netlink) ensureClsact(link netlink.Link) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: link.Attrs().Index,
			Handle:    netlink.MakeHandle(0xffff, 0),
			Parent:    netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	if err := n.h.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("clsact qdisc on %q: %w", link.Attrs().Name, err)
	}
	return nil
}

// UnwireRedirect removes napitap's filters from peer (the tap's go with the
// tap) and the clsact qdisc if nothing else uses it. A missing peer is fine.
func UnwireRedirect(peerName string) error {
	return perRequest.UnwireRedirect(peerName)
}

// UnwireRedirect is UnwireRedirect on n's socket.
func (n *Netlink) UnwireRedirect(peerName string) error {
	peer, err := n.safe().LinkByName(peerName)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("interface %q: %w", peerName, err)
	}
	filters, err := n.RedirectFilters(peer)
	if err != nil {
		return err
	}
	if len(filters) > 0 {
		// Handle 0 deletes napitap's whole priority, hash table included.
		ours := &netlink.U32{FilterAttrs: netlink.FilterAttrs{
			LinkIndex: peer.Attrs().Index,
			Parent:    netlink.HANDLE_MIN_INGRESS,
			Priority:  RedirectPriority,
			Protocol:  unix.ETH_P_ALL,
		}}
		if err := n.h.FilterDel(ours); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete redirect filter on %q: %w", peerName, err)
		}
	}
	return n.removeClsactIfUnused(peer)
}

// RedirectFilters lists napitap's redirect filters on the ingress of link.
func RedirectFilters(link netlink.Link) ([]*netlink.U32, error) {
	return perRequest.RedirectFilters(link)
}

// RedirectFilters is RedirectFilters on n's socket.
func (n *Netlink) RedirectFilters(link netlink.Link) ([]*netlink.U32, error) {
	all, err := n.safe().FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return nil, nil // no clsact qdisc
		}
		return nil, fmt.Errorf("list filters on %q: %w", link.Attrs().Name, err)
	}
	var ours []*netlink.U32
	for _, f := range all {
		if m, ok := f.(*netlink.U32); ok && m.Priority == RedirectPriority {
			ours = append(ours, m)
		}
	}
	return ours, nil
}

// RedirectTarget returns the ifindex napitap's filter on link redirects to,
// or 0 when there is no such filter.
func RedirectTarget(link netlink.Link) (int, error) {
	filters, err := RedirectFilters(link)
	if err != nil {
		return 0, err
	}
	for _, f := range filters {
		for _, a := range f.Actions {
			if m, ok := a.(*netlink.MirredAction); ok && m.MirredAction == netlink.TCA_EGRESS_REDIR {
				return m.Ifindex, nil
			}
		}
	}
	return 0, nil
}

func (n *Netlink) removeClsactIfUnused(link netlink.Link) error {
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		filters, err := n.safe().FilterList(link, parent)
		if err != nil || len(filters) > 0 {
			return nil // someone else's filters, or no clsact at all
		}
	}
	qdiscs, err := n.safe().QdiscList(link)
	if err != nil {
		return fmt.Errorf("list qdiscs on %q: %w", link.Attrs().Name, err)
	}
	for _, q := range qdiscs {
		if q.Type() == "clsact" {
			if err := n.h.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("delete clsact qdisc on %q: %w", link.Attrs().Name, err)
			}
		}
	}
	return nil
}

// WireBridge makes bridge brName in the current netns and enslaves peer and
// tap to it, as KubeVirt's bridge binding does: the guest takes the peer's
// MAC and addresses. So the peer gets newPeerMAC, since a bridge keeps its
// ports' own MACs for itself and would never forward frames for them to the
// tap, and loses its addresses, since the pod's stack would otherwise answer
// ARP for them through the bridge. alias marks the bridge as the
// attachment's, as it marks the tap; the bridge takes its name only once
// marked (see IsTempName), and before the peer is touched. It fails with
// ErrExists if a link called brName exists.
//
// On error it undoes itself. Otherwise it returns undo, for an ADD that
// fails later: it gives the peer back exactly what WireBridge took, which
// prevResult need not tell (UnwireBridge, for DEL, knows only that).
func WireBridge(brName, peerName, tapName string, newPeerMAC net.HardwareAddr, alias string) (undo func() error, err error) {
	return perRequest.WireBridge(brName, peerName, tapName, newPeerMAC, alias)
}

// WireBridge is WireBridge on n's socket.
func (n *Netlink) WireBridge(brName, peerName, tapName string, newPeerMAC net.HardwareAddr, alias string) (undo func() error, err error) {
	if alias == "" {
		return nil, fmt.Errorf("bridge %q: no mark to give it", brName)
	}
	peer, tap, err := n.linkPair(peerName, tapName)
	if err != nil {
		return nil, err
	}
	if err := n.RequireFree(brName); err != nil {
		return nil, fmt.Errorf("bridge %q: %w", brName, err)
	}
	if err := n.createMarkedBridge(brName, alias, peer.Attrs().MTU); err != nil {
		return nil, err
	}
	oldPeerMAC := slices.Clone(peer.Attrs().HardwareAddr)
	var removed []netlink.Addr
	var routes []netlink.Route
	undo = func() error {
		err := n.UnwireBridge(brName, peerName, PeerIdentity{MAC: oldPeerMAC}, alias)
		n.restoreAddrs(peer, removed)
		n.restoreRoutes(routes)
		return err
	}
	defer func() {
		if err != nil {
			_ = undo()
			undo = nil
		}
	}()
	br, err := n.safe().LinkByName(brName)
	if err != nil {
		return nil, fmt.Errorf("bridge %q: %w", brName, err)
	}
	if err := n.h.LinkSetHardwareAddr(peer, newPeerMAC); err != nil {
		return nil, fmt.Errorf("interface %q: set mac %s: %w", peerName, newPeerMAC, err)
	}
	// Removing the last address takes the routes through the peer along.
	if routes, err = n.safe().RouteList(peer, netlink.FAMILY_ALL); err != nil {
		return nil, fmt.Errorf("interface %q: list routes: %w", peerName, err)
	}
	if removed, err = n.flushAddrs(peer); err != nil {
		return nil, err
	}
	for _, port := range []netlink.Link{peer, tap} {
		if err := n.h.LinkSetMaster(port, br); err != nil {
			return nil, fmt.Errorf("bridge %q: add port %q: %w", brName, port.Attrs().Name, err)
		}
	}
	if err := n.h.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("bridge %q: set up: %w", brName, err)
	}
	return undo, nil
}

// flushAddrs removes the peer's global addresses; link-local ones stay, the
// kernel owns them.
func (n *Netlink) flushAddrs(link netlink.Link) (removed []netlink.Addr, err error) {
	addrs, err := n.addrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("interface %q: list addresses: %w", link.Attrs().Name, err)
	}
	for _, addr := range addrs {
		if addr.IP.IsLinkLocalUnicast() {
			continue
		}
		if err := n.h.AddrDel(link, &addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return removed, fmt.Errorf("interface %q: remove address %s: %w", link.Attrs().Name, addr.IPNet, err)
		}
		removed = append(removed, addr)
	}
	return removed, nil
}

// restoreAddrs gives back what flushAddrs took, for a failed ADD.
func (n *Netlink) restoreAddrs(link netlink.Link, addrs []netlink.Addr) {
	for _, addr := range addrs {
		_ = n.h.AddrAdd(link, &netlink.Addr{IPNet: addr.IPNet})
	}
}

// restoreRoutes puts back the routes that left with the addresses; the
// kernel's own come back with the addresses.
func (n *Netlink) restoreRoutes(routes []netlink.Route) {
	for _, r := range routes {
		if r.Protocol == unix.RTPROT_KERNEL {
			continue
		}
		_ = n.h.RouteReplace(&r)
	}
}

// PeerIdentity is what WireBridge moves from the peer to the guest, and
// the routes that left with the addresses.
type PeerIdentity struct {
	MAC    net.HardwareAddr
	Addrs  []net.IPNet
	Routes []PeerRoute
}

// PeerRoute is a route through the peer, as a CNI result lists it.
type PeerRoute struct {
	Dst net.IPNet
	GW  net.IP
}

// createMarkedBridge makes bridge name, marked alias, under a random
// temporary name and renames it once marked (see IsTempName). Until the
// mark is set, the bridge's device group, which the RTM_NEWLINK that makes
// it can carry, tells DeleteLeftovers whose it is.
func (n *Netlink) createMarkedBridge(name, alias string, mtu int) (err error) {
	temp, err := underTempName(tempBridgePrefix, func(try string) error {
		attrs := netlink.LinkAttrs{Name: try, MTU: mtu, Group: creationGroup(alias)}
		if err := n.h.LinkAdd(&netlink.Bridge{LinkAttrs: attrs}); err != nil {
			return fmt.Errorf("create as %q: %w", try, err)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("bridge %q: %w", name, err)
	}
	br, err := n.safe().LinkByName(temp)
	if err != nil {
		_ = n.deleteLink(temp)
		return fmt.Errorf("bridge %q: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = n.h.LinkDel(br)
		}
	}()
	if err := n.h.LinkSetAlias(br, alias); err != nil {
		return fmt.Errorf("bridge %q: set alias %q: %w", name, alias, err)
	}
	if err := n.h.LinkSetGroup(br, 0); err != nil {
		return fmt.Errorf("bridge %q: set group 0: %w", name, err)
	}
	if err := n.h.LinkSetName(br, name); err != nil {
		if errors.Is(err, unix.EEXIST) {
			if err = n.RequireFree(name); err == nil {
				err = ErrExists // gone again already
			}
		}
		return fmt.Errorf("bridge %q: rename from %q: %w", name, temp, err)
	}
	return nil
}

// UnwireBridge undoes WireBridge: if bridge brName is a bridge marked with
// alias, it takes the peer out of it, gives the peer back what is known of
// its identity and deletes the bridge; the bridge last, so that a DEL that
// fails half-way still finds its bridge when tried again. A bridge that is
// not marked so is someone else's: it and the peer are left alone.
// Everything already gone is fine.
func UnwireBridge(brName, peerName string, identity PeerIdentity, alias string) error {
	return perRequest.UnwireBridge(brName, peerName, identity, alias)
}

// UnwireBridge is UnwireBridge on n's socket.
func (n *Netlink) UnwireBridge(brName, peerName string, identity PeerIdentity, alias string) error {
	if alias == "" {
		return fmt.Errorf("bridge %q: no mark to tell it by", brName)
	}
	br, err := n.safe().LinkByName(brName)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("bridge %q: %w", brName, err)
	}
	if _, ok := br.(*netlink.Bridge); !ok || br.Attrs().Alias != alias {
		return nil
	}
	if err := n.restorePeer(br, peerName, identity); err != nil {
		return err
	}
	if err := n.h.LinkDel(br); err != nil && !isNotFound(err) {
		return fmt.Errorf("bridge %q: delete: %w", brName, err)
	}
	return nil
}

// restorePeer takes peer out of br and gives it back identity.
func (n *Netlink) restorePeer(br netlink.Link, peerName string, identity PeerIdentity) error {
	peer, err := n.safe().LinkByName(peerName)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("interface %q: %w", peerName, err)
	}
	if peer.Attrs().MasterIndex == br.Attrs().Index {
		if err := n.h.LinkSetNoMaster(peer); err != nil {
			return fmt.Errorf("bridge %q: remove port %q: %w", br.Attrs().Name, peerName, err)
		}
	}
	if identity.MAC != nil && peer.Attrs().HardwareAddr.String() != identity.MAC.String() {
		if err := n.h.LinkSetHardwareAddr(peer, identity.MAC); err != nil {
			return fmt.Errorf("interface %q: restore mac %s: %w", peerName, identity.MAC, err)
		}
	}
	return n.AddAddrs(peer, identity.Addrs, identity.Routes)
}

// AddAddrs gives link addrs, then routes through it: what a CNI result
// lists for an interface. Addresses and routes already there are fine.
func AddAddrs(link netlink.Link, addrs []net.IPNet, routes []PeerRoute) error {
	return perRequest.AddAddrs(link, addrs, routes)
}

// AddAddrs is AddAddrs on n's socket.
func (n *Netlink) AddAddrs(link netlink.Link, addrs []net.IPNet, routes []PeerRoute) error {
	name := link.Attrs().Name
	for _, addr := range addrs {
		if err := n.h.AddrAdd(link, &netlink.Addr{IPNet: &addr}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("interface %q: add address %s: %w", name, addr.String(), err)
		}
	}
	for _, r := range routes {
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &r.Dst, Gw: r.GW}
		if err := n.h.RouteReplace(route); err != nil {
			return fmt.Errorf("interface %q: add route %s: %w", name, r.Dst.String(), err)
		}
	}
	return nil
}

// CheckRedirect reports what is missing of WireRedirect between peer and tap.
func CheckRedirect(peer, tap netlink.Link) error {
	for _, pair := range [][2]netlink.Link{{peer, tap}, {tap, peer}} {
		target, err := RedirectTarget(pair[0])
		if err != nil {
			return err
		}
		if target != pair[1].Attrs().Index {
			return fmt.Errorf("no redirect filter from %q to %q", pair[0].Attrs().Name, pair[1].Attrs().Name)
		}
	}
	return nil
}

// CheckBridge reports what is missing of WireBridge for peer and tap.
func CheckBridge(brName string, peer, tap netlink.Link) error {
	br, err := netlinksafe.LinkByName(brName)
	if err != nil {
		return fmt.Errorf("bridge %q is missing: %w", brName, err)
	}
	for _, port := range []netlink.Link{peer, tap} {
		if port.Attrs().MasterIndex != br.Attrs().Index {
			return fmt.Errorf("%q is not a port of bridge %q", port.Attrs().Name, brName)
		}
	}
	return nil
}
