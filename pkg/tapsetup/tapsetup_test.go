package tapsetup_test

import (
	"errors"
	"net"
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
				return tapsetup.DeleteTap(tc.spec.Name, "")
			})
		})
	}
}

func TestCreateNeverAdoptsAnExistingLink(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name     string
		existing netlink.Link
	}{
		{"an existing veth of the same name is left alone", &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}, PeerName: "napitest0p"}},
		{"an existing tap of the same name is not joined", &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}, Mode: netlink.TUNTAP_MODE_TAP}},
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
				_, _, err := tapsetup.Create(tapsetup.Spec{Name: "napitest0", Queues: 2, Flags: tapsetup.QueueFlags{MultiQueue: true, NAPI: true}})
				if !errors.Is(err, unix.EEXIST) {
					t.Errorf("Create over an existing link: got %v, want EEXIST", err)
				}
				if _, err := netlink.LinkByName("napitest0"); err != nil {
					t.Errorf("the existing link is gone: %v", err)
				}
				return nil
			})
		})
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

func TestDeleteTapLeavesOtherLinksAlone(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "del")
	pod.Run(t, func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "napitest0"}}); err != nil {
			return err
		}
		if err := tapsetup.DeleteTap("napitest0", ""); !errors.Is(err, tapsetup.ErrNotTap) {
			t.Errorf("DeleteTap of a bridge: got %v, want ErrNotTap", err)
		}
		if err := tapsetup.DeleteTap("napimissing0", ""); err != nil {
			t.Errorf("DeleteTap of a missing link: %v", err)
		}
		return nil
	})
}
