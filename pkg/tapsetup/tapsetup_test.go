package tapsetup_test

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func ptr[T any](v T) *T { return &v }

func TestCreate(t *testing.T) {
	nstest.RequireRoot(t)
	napiMQ := tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}
	cases := []struct {
		name       string
		spec       tapsetup.Spec
		wantOwner  int64
		wantGroup  int64
		wantIfrSet uint16
	}{
		{
			name:       "a 4-queue NAPI tap has every queue attached with IFF_NAPI",
			spec:       tapsetup.Spec{Queues: 4, Flags: napiMQ, VnetHdrSize: 12},
			wantOwner:  -1,
			wantGroup:  -1,
			wantIfrSet: unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE | unix.IFF_NAPI,
		},
		{
			name:       "a single-queue plain tap is not multiqueue",
			spec:       tapsetup.Spec{Queues: 1, Flags: tapsetup.QueueFlags{VnetHdr: true}, VnetHdrSize: 10},
			wantOwner:  -1,
			wantGroup:  -1,
			wantIfrSet: unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR,
		},
		{
			name:       "a marked tap keeps its 8 queues attached across the rename from its temporary name",
			spec:       tapsetup.Spec{Queues: 8, Flags: napiMQ, VnetHdrSize: 12, Alias: tapsetup.OwnerAlias("napitap-test", "net1")},
			wantOwner:  -1,
			wantGroup:  -1,
			wantIfrSet: unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE | unix.IFF_NAPI,
		},
		{
			name: "owner, group, mtu, mac and txqueuelen are applied",
			spec: tapsetup.Spec{Queues: 2, Flags: napiMQ, Owner: ptr[uint32](107), Group: ptr[uint32](107),
				MTU: 9000, MAC: net.HardwareAddr{0x02, 0, 0, 0, 0x10, 0x07}, TxQueueLen: ptr(5000)},
			wantOwner:  107,
			wantGroup:  107,
			wantIfrSet: unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE | unix.IFF_NAPI,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "tapsetup")
			tc.spec.Name = "napitest0"
			pod.Run(t, func() error {
				_, queues, err := tapsetup.Create(tc.spec)
				if err != nil {
					return err
				}
				defer tapsetup.CloseQueues(queues)
				if len(queues) != tc.spec.Queues {
					t.Errorf("got %d queues, want %d", len(queues), tc.spec.Queues)
				}
				for i, q := range queues {
					flags, err := tapsetup.QueueFlagsOf(q)
					if err != nil {
						return err
					}
					if flags&tc.wantIfrSet != tc.wantIfrSet {
						t.Errorf("queue %d: TUNGETIFF 0x%x lacks 0x%x", i, flags, tc.wantIfrSet)
					}
				}

				tap, err := tapsetup.Inspect(pod.Path(), tc.spec.Name)
				if err != nil {
					return err
				}
				// The kernel reports the queue count of multiqueue taps only.
				if tc.spec.Flags.MultiQueue && tap.Link.Queues != tc.spec.Queues {
					t.Errorf("kernel reports %d queues attached, want %d", tap.Link.Queues, tc.spec.Queues)
				}
				if tap.MultiQueue != tc.spec.Flags.MultiQueue || tap.VnetHdr != tc.spec.Flags.VnetHdr || !tap.Persistent {
					t.Errorf("multiqueue=%v vnet_hdr=%v persist=%v, want %v %v true", tap.MultiQueue, tap.VnetHdr, tap.Persistent, tc.spec.Flags.MultiQueue, tc.spec.Flags.VnetHdr)
				}
				if tap.Sysfs.Owner != tc.wantOwner || tap.Sysfs.Group != tc.wantGroup {
					t.Errorf("owner/group %d/%d, want %d/%d", tap.Sysfs.Owner, tap.Sysfs.Group, tc.wantOwner, tc.wantGroup)
				}
				attrs := tap.Link.Attrs()
				if tc.spec.MTU != 0 && attrs.MTU != tc.spec.MTU {
					t.Errorf("mtu %d, want %d", attrs.MTU, tc.spec.MTU)
				}
				if tc.spec.MAC != nil && attrs.HardwareAddr.String() != tc.spec.MAC.String() {
					t.Errorf("mac %s, want %s", attrs.HardwareAddr, tc.spec.MAC)
				}
				if tc.spec.TxQueueLen != nil && attrs.TxQLen != *tc.spec.TxQueueLen {
					t.Errorf("txqueuelen %d, want %d", attrs.TxQLen, *tc.spec.TxQueueLen)
				}
				if attrs.Alias != tc.spec.Alias {
					t.Errorf("ifalias %q, want %q", attrs.Alias, tc.spec.Alias)
				}
				if links := linkNames(t); len(links) != 2 {
					t.Errorf("links %v, want lo and the tap alone", links)
				}
				return tapsetup.DeleteTap(tc.spec.Name, tc.spec.Alias)
			})
		})
	}
}

func TestCreateNeverAdoptsAnExistingLink(t *testing.T) {
	nstest.RequireRoot(t)
	owner := tapsetup.OwnerAlias("napitap-test", "net1")
	cases := []struct {
		name     string
		existing netlink.Link
		alias    string
	}{
		{"an existing veth of the same name is left alone", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}, PeerName: "napitest0p"}, ""},
		{"an existing bridge of the same name is left alone", &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}}, ""},
		{"an existing unmarked tap of the same name is not joined", &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}, Mode: netlink.TUNTAP_MODE_TAP}, ""},
		{"an existing tap marked as this attachment's is not joined", &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}, Mode: netlink.TUNTAP_MODE_TAP}, owner},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "tapsetup")
			pod.Run(t, func() error {
				if err := netlink.LinkAdd(tc.existing); err != nil {
					return err
				}
				if tt, ok := tc.existing.(*netlink.Tuntap); ok {
					tapsetup.CloseQueues(tt.Fds)
				}
				existing, err := netlink.LinkByName("napitest0")
				if err != nil {
					return err
				}
				if tc.alias != "" {
					if err := netlink.LinkSetAlias(existing, tc.alias); err != nil {
						return err
					}
				}
				if err := netlink.LinkSetUp(existing); err != nil {
					return err
				}
				before := linkNames(t)
				_, _, err = tapsetup.Create(tapsetup.Spec{Name: "napitest0", Queues: 2, Flags: tapsetup.QueueFlags{MultiQueue: true, NAPI: true}, Alias: owner})
				if !errors.Is(err, tapsetup.ErrExists) || !errors.Is(err, unix.EEXIST) {
					t.Errorf("Create over an existing link: got %v, want ErrExists", err)
				}
				after, err := netlink.LinkByName("napitest0")
				if err != nil {
					t.Fatalf("the existing link is gone: %v", err)
				}
				if after.Attrs().Index != existing.Attrs().Index || after.Attrs().Alias != tc.alias || after.Attrs().Flags&net.FlagUp == 0 {
					t.Errorf("the existing link changed: index %d alias %q flags %v, was %d %q up",
						after.Attrs().Index, after.Attrs().Alias, after.Attrs().Flags, existing.Attrs().Index, tc.alias)
				}
				if now := linkNames(t); !slices.Equal(now, before) {
					t.Errorf("links after the failed Create: %v, before: %v", now, before)
				}
				return nil
			})
		})
	}
}

// TestEveryLinkGetsAFreshTemporaryName: temporary names are drawn at
// random, so that a pod that saw one cannot take the next ADD's first: two
// rounds of one attachment's tap and bridge pass through four different
// names, each of the temporary form.
func TestEveryLinkGetsAFreshTemporaryName(t *testing.T) {
	nstest.RequireRoot(t)
	pod := bridgePod(t)
	owner := tapsetup.OwnerAlias("napitap-test", "eth0")
	watch := pod.WatchLinkNames(t)
	pod.Run(t, func() error {
		for range 2 {
			_, queues, err := tapsetup.Create(tapsetup.Spec{Name: "napitest0", Queues: 1, Alias: owner})
			if err != nil {
				return err
			}
			tapsetup.CloseQueues(queues)
			undo, err := tapsetup.WireBridge("br0", "eth0", "napitest0", net.HardwareAddr{0x02, 0x4e, 0x41, 0, 0, 0x03}, owner)
			if err != nil {
				return err
			}
			if err := undo(); err != nil {
				return err
			}
			if err := tapsetup.DeleteTap("napitest0", owner); err != nil {
				return err
			}
		}
		return nil
	})
	var temps []string
	for _, name := range watch() {
		if tapsetup.IsTempName(name) && !slices.Contains(temps, name) {
			temps = append(temps, name)
		}
	}
	if len(temps) != 4 {
		t.Fatalf("temporary names of two taps and two bridges: %q, want 4 different ones", temps)
	}
	for i, name := range temps {
		prefix := []string{"napi~t", "napi~b"}[i%2]
		if err := tapsetup.ValidateLinkName(name); err != nil || len(name) != 15 || !strings.HasPrefix(name, prefix) {
			t.Errorf("temporary name %q: %v, want a valid name of 15 bytes starting %s", name, err, prefix)
		}
	}
}

// TestNAPIIsAPropertyOfTheQueue proves NAPI behaviourally (DESIGN.md fact
// 10): with gro_flush_timeout set, in-order TCP segments written into a
// NAPI queue leave GRO merged; written into a plain queue they do not.
func TestNAPIIsAPropertyOfTheQueue(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name       string
		napi       bool
		wantMerged bool
	}{
		{"queues opened with IFF_NAPI merge segments in GRO", true, true},
		{"queues opened without IFF_NAPI deliver every segment alone", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "napi")
			spec := tapsetup.Spec{Name: "napitest0", Queues: 2, VnetHdrSize: 12,
				Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: tc.napi}}
			pod.Run(t, func() error {
				tap, queues, err := tapsetup.Create(spec)
				if err != nil {
					return err
				}
				defer tapsetup.CloseQueues(queues)
				if err := tapsetup.ApplyNAPIKnobs(pod.Path(), spec.Name, tapsetup.NAPIKnobs{GROFlushTimeout: ptr[uint64](200_000)}); err != nil {
					return err
				}
				if err := netlink.LinkSetUp(tap); err != nil {
					return err
				}
				for i, q := range queues {
					res, err := napiprobe.Run(pod.Path(), spec.Name, q, 12, 16, 1000)
					if err != nil {
						return err
					}
					t.Logf("queue %d: frame lengths %v", i, res.SKBLens)
					if res.Merged() != tc.wantMerged {
						t.Errorf("queue %d: merged=%v, want %v (frame lengths %v)", i, res.Merged(), tc.wantMerged, res.SKBLens)
					}
				}
				return nil
			})
		})
	}
}

func TestWireRedirectAndUnwire(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "wire")
	pod.Run(t, func() error {
		peer := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "napipeer0"}, PeerName: "napipeer1"}
		if err := netlink.LinkAdd(peer); err != nil {
			return err
		}
		tap, queues, err := tapsetup.Create(tapsetup.Spec{Name: "napitest0", Queues: 1})
		if err != nil {
			return err
		}
		tapsetup.CloseQueues(queues)
		if err := tapsetup.WireRedirect("napipeer0", "napitest0"); err != nil {
			return err
		}
		peerLink, _ := netlink.LinkByName("napipeer0")
		for _, c := range []struct {
			from netlink.Link
			to   int
		}{{peerLink, tap.Attrs().Index}, {tap, peerLink.Attrs().Index}} {
			target, err := tapsetup.RedirectTarget(c.from)
			if err != nil {
				return err
			}
			if target != c.to {
				t.Errorf("%s redirects to ifindex %d, want %d", c.from.Attrs().Name, target, c.to)
			}
		}

		if err := tapsetup.DeleteTap("napitest0", ""); err != nil {
			return err
		}
		if err := tapsetup.UnwireRedirect("napipeer0"); err != nil {
			return err
		}
		if err := tapsetup.UnwireRedirect("napipeer0"); err != nil {
			t.Errorf("a second unwire must succeed: %v", err)
		}
		qdiscs, err := netlink.QdiscList(peerLink)
		if err != nil {
			return err
		}
		for _, q := range qdiscs {
			if q.Type() == "clsact" {
				t.Errorf("clsact qdisc left on the peer")
			}
		}
		return nil
	})
}

func TestDeleteTapDeletesOnlyWhatIsMarkedAsTheOwners(t *testing.T) {
	nstest.RequireRoot(t)
	owner := tapsetup.OwnerAlias("napitap-test", "net1")
	tap := func(name, alias string) func() error {
		return func() error {
			tt := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP}
			if err := netlink.LinkAdd(tt); err != nil {
				return err
			}
			tapsetup.CloseQueues(tt.Fds)
			if alias == "" {
				return nil
			}
			return netlink.LinkSetAlias(tt, alias)
		}
	}
	cases := []struct {
		name        string
		prepare     func() error
		delName     string
		owner       string
		wantErr     error
		wantDeleted bool
	}{
		{"a tap marked as the owner's is deleted", tap("napitest0", owner), "napitest0", owner, nil, true},
		{"an unmarked tap, such as KubeVirt's tap0, is left alone", tap("napitest0", ""), "napitest0", owner, tapsetup.ErrNotTap, false},
		{"a tap marked as another attachment's is left alone", tap("napitest0", tapsetup.OwnerAlias("napitap-test", "net2")), "napitest0", owner, tapsetup.ErrNotTap, false},
		{"a bridge is left alone", func() error { return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}}) }, "napitest0", owner, tapsetup.ErrNotTap, false},
		{"a bridge is left alone even with no owner given", func() error { return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}}) }, "napitest0", "", tapsetup.ErrNotTap, false},
		{"an unmarked tap goes with no owner given", tap("napitest0", ""), "napitest0", "", nil, true},
		{"a missing link is success", func() error { return nil }, "napimissing0", owner, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "del")
			pod.Run(t, func() error {
				if err := tc.prepare(); err != nil {
					return err
				}
				err := tapsetup.DeleteTap(tc.delName, tc.owner)
				if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Errorf("DeleteTap(%q, %q): got %v, want %v", tc.delName, tc.owner, err, tc.wantErr)
				}
				_, lookup := netlink.LinkByName(tc.delName)
				if deleted := lookup != nil; deleted != tc.wantDeleted {
					t.Errorf("%q deleted: %v, want %v", tc.delName, deleted, tc.wantDeleted)
				}
				return nil
			})
		})
	}
}

// bridgePod is a pod netns with eth0 (a veth whose peer stays in it), its
// MAC, an address and a default route, as a previous plugin leaves them.
func bridgePod(t *testing.T) *nstest.NetNS {
	t.Helper()
	pod := nstest.New(t, "bridge")
	pod.Run(t, func() error {
		mac, _ := net.ParseMAC("02:4e:41:00:00:02")
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", HardwareAddr: mac}, PeerName: "napipeer0"}); err != nil {
			return err
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.199.0.2/24")
		if err := netlink.AddrAdd(eth0, addr); err != nil {
			return err
		}
		for _, l := range []string{"eth0", "napipeer0"} {
			if link, err := netlink.LinkByName(l); err != nil || netlink.LinkSetUp(link) != nil {
				return fmt.Errorf("set %s up: %v", l, err)
			}
		}
		_, all, _ := net.ParseCIDR("0.0.0.0/0")
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: all, Gw: net.IPv4(10, 199, 0, 1)})
	})
	return pod
}

// podState describes every link of the current netns (name, type, MAC,
// master, up, alias, global addresses) and every route, sorted.
func podState(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []string
	for _, l := range links {
		a := l.Attrs()
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_ALL)
		var global []string
		for _, ad := range addrs {
			if !ad.IP.IsLinkLocalUnicast() {
				global = append(global, ad.IPNet.String())
			}
		}
		out = append(out, fmt.Sprintf("link %s type=%s mac=%s master=%s up=%v alias=%q addrs=%v",
			a.Name, l.Type(), a.HardwareAddr, names[a.MasterIndex], a.Flags&net.FlagUp != 0, a.Alias, global))
	}
	routes, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		// The kernel adds fe80::/64 when IPv6 autoconf gets to a link that
		// is up, whenever that is: not napitap's doing.
		if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() {
			continue
		}
		out = append(out, fmt.Sprintf("route dst=%v gw=%v dev=%s", r.Dst, r.Gw, names[r.LinkIndex]))
	}
	slices.Sort(out)
	return out
}

// TestUnwireBridgeTouchesOnlyAMarkedBridge: the bridge and the peer's MAC,
// addresses and routes are napitap's to change only when the bridge is
// marked as the attachment's.
func TestUnwireBridgeTouchesOnlyAMarkedBridge(t *testing.T) {
	nstest.RequireRoot(t)
	owner := tapsetup.OwnerAlias("napitap-test", "eth0")
	// What a DEL's prevResult says of the peer; not what it has now.
	identity := tapsetup.PeerIdentity{
		MAC:    net.HardwareAddr{0x02, 0x4e, 0x41, 0, 0, 0x09},
		Addrs:  []net.IPNet{{IP: net.IPv4(10, 199, 9, 9), Mask: net.CIDRMask(24, 32)}},
		Routes: []tapsetup.PeerRoute{{Dst: net.IPNet{IP: net.IPv4(10, 198, 0, 0), Mask: net.CIDRMask(16, 32)}, GW: net.IPv4(10, 199, 9, 1)}},
	}
	bridgeWithPeer := func(name, alias string) func() error {
		return func() error {
			if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
				return err
			}
			br, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if alias != "" {
				if err := netlink.LinkSetAlias(br, alias); err != nil {
					return err
				}
			}
			eth0, err := netlink.LinkByName("eth0")
			if err != nil {
				return err
			}
			return netlink.LinkSetMaster(eth0, br)
		}
	}
	cases := []struct {
		name     string
		prepare  func() error
		wantGone []string // links UnwireBridge deletes
		restored bool     // the peer gets identity
	}{
		{"an unmarked bridge with the peer as its port, and the peer, are left alone", bridgeWithPeer("br0", ""), nil, false},
		{"a bridge marked as another attachment's, and the peer, are left alone", bridgeWithPeer("br0", tapsetup.OwnerAlias("napitap-test", "net1")), nil, false},
		{"without a bridge the peer is left alone", func() error { return nil }, nil, false},
		{"a tap of the bridge's name is left alone", func() error {
			tt := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "br0", Alias: owner}, Mode: netlink.TUNTAP_MODE_TAP}
			if err := netlink.LinkAdd(tt); err != nil {
				return err
			}
			tapsetup.CloseQueues(tt.Fds)
			return netlink.LinkSetAlias(tt, owner)
		}, nil, false},
		{"the attachment's own bridge goes and the peer gets its identity back", bridgeWithPeer("br0", owner), []string{"br0"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := bridgePod(t)
			pod.Run(t, func() error {
				if err := tc.prepare(); err != nil {
					return err
				}
				before := podState(t)
				if err := tapsetup.UnwireBridge("br0", "eth0", identity, owner); err != nil {
					t.Errorf("UnwireBridge: %v", err)
				}
				for _, name := range tc.wantGone {
					if _, err := netlink.LinkByName(name); err == nil {
						t.Errorf("%q is still there", name)
					}
				}
				after := podState(t)
				if !tc.restored {
					var want []string
					for _, l := range before {
						if !slices.ContainsFunc(tc.wantGone, func(n string) bool { return strings.HasPrefix(l, "link "+n+" ") }) {
							want = append(want, l)
						}
					}
					if !slices.Equal(after, want) {
						t.Errorf("pod after UnwireBridge:\n  %s\nwant:\n  %s", strings.Join(after, "\n  "), strings.Join(want, "\n  "))
					}
					return nil
				}
				eth0, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				if eth0.Attrs().HardwareAddr.String() != identity.MAC.String() || eth0.Attrs().MasterIndex != 0 {
					t.Errorf("eth0 mac %s master %d, want %s and no master", eth0.Attrs().HardwareAddr, eth0.Attrs().MasterIndex, identity.MAC)
				}
				for _, want := range []string{"10.199.9.9/24", "route dst=10.198.0.0/16 gw=10.199.9.1 dev=eth0"} {
					if !slices.ContainsFunc(after, func(l string) bool { return strings.Contains(l, want) }) {
						t.Errorf("pod after UnwireBridge lacks %s:\n  %s", want, strings.Join(after, "\n  "))
					}
				}
				return nil
			})
		})
	}
}

// TestWireBridgeMarksItsBridgeAndNeverTakesAnother: the bridge WireBridge
// makes carries the mark under its own name, with nothing left under the
// temporary one; a name taken fails before the peer is touched.
func TestWireBridgeMarksItsBridgeAndNeverTakesAnother(t *testing.T) {
	nstest.RequireRoot(t)
	owner := tapsetup.OwnerAlias("napitap-test", "eth0")
	cases := []struct {
		name     string
		existing netlink.Link
		wantErr  error
	}{
		{"a new bridge is marked as the attachment's", nil, nil},
		{"an unmarked bridge of the name fails and is left alone", &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}, tapsetup.ErrExists},
		{"a veth of the name fails and is left alone", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "br0"}, PeerName: "br0p"}, tapsetup.ErrExists},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := bridgePod(t)
			pod.Run(t, func() error {
				_, queues, err := tapsetup.Create(tapsetup.Spec{Name: "napitest0", Queues: 1, Alias: owner})
				if err != nil {
					return err
				}
				tapsetup.CloseQueues(queues)
				if tc.existing != nil {
					if err := netlink.LinkAdd(tc.existing); err != nil {
						return err
					}
				}
				before := podState(t)
				undo, err := tapsetup.WireBridge("br0", "eth0", "napitest0", net.HardwareAddr{0x02, 0x4e, 0x41, 0, 0, 0x03}, owner)
				if tc.wantErr == nil && err != nil || tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("WireBridge: got %v, want %v", err, tc.wantErr)
				}
				if tc.wantErr != nil {
					if after := podState(t); !slices.Equal(after, before) {
						t.Errorf("pod after the failed WireBridge:\n  %s\nbefore:\n  %s", strings.Join(after, "\n  "), strings.Join(before, "\n  "))
					}
					return nil
				}
				br, err := netlink.LinkByName("br0")
				if err != nil {
					return err
				}
				if br.Attrs().Alias != owner || br.Attrs().Group != 0 {
					t.Errorf("bridge ifalias %q group %d, want %q and the default group 0", br.Attrs().Alias, br.Attrs().Group, owner)
				}
				for _, name := range linkNames(t) {
					if tapsetup.IsTempName(name) {
						t.Errorf("a link is left under the temporary name %q", name)
					}
				}
				// As a failed ADD does: the pod exactly as before.
				if err := undo(); err != nil {
					t.Errorf("undo: %v", err)
				}
				if after := podState(t); !slices.Equal(after, before) {
					t.Errorf("pod after undo:\n  %s\nbefore:\n  %s", strings.Join(after, "\n  "), strings.Join(before, "\n  "))
				}
				return nil
			})
		})
	}
}

// linkNames lists the links of the current netns, sorted.
func linkNames(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}
