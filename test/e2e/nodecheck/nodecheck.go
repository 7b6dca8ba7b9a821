// Package nodecheck holds the assertions every napitap end-to-end suite
// asks of a node: the runtime e2e (containerd), the real-node e2e (kubelet)
// and the kind suite (through the napitap-verify command), so that what
// passes here is what a cluster is asked.
package nodecheck

import (
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// Expect describes one attachment as its network config made it.
type Expect struct {
	ContainerID string
	IfName      string // CNI_IFNAME
	TapName     string
	Queues      int
	NAPI        bool
	Wiring      string // "tc-redirect", "bridge", "node-bridge" or "none"
	Bridge      string // bridge and node-bridge wiring only
	// NodeNetns is where a node-bridge (Kata DAN) tap is: the node's
	// netns, not the pod's.
	NodeNetns string
	// Socket is napitapd's; empty skips the hand-off assertions.
	Socket string
	// Held is how many queue fds napitapd should hold: Queues before a
	// fetch, 0 after.
	Held int
}

// Present checks the tap in the pod netns at netnsPath: a persistent tap
// with the expected queue mode, up, wired as configured, and known to
// napitapd with its queues.
func Present(netnsPath string, want Expect) error {
	tapNetns := tapNetnsOf(netnsPath, want)
	tap, err := tapsetup.Inspect(tapNetns, want.TapName)
	if err != nil {
		return err
	}
	name := fmt.Sprintf("tap %q in netns %s", want.TapName, tapNetns)
	switch {
	case tap.MultiQueue != (want.Queues > 1):
		return fmt.Errorf("%s: multiqueue %v for %d queues", name, tap.MultiQueue, want.Queues)
	case !tap.Persistent || !tap.Up:
		return fmt.Errorf("%s: persist=%v up=%v, want both", name, tap.Persistent, tap.Up)
	case want.ContainerID != "" && tap.Link.Attrs().Alias != owner(want):
		// DEL and GC go by the mark: without it the tap would leak.
		return fmt.Errorf("%s: ifalias %q, want %q", name, tap.Link.Attrs().Alias, owner(want))
	}
	if err := checkWiring(tapNetns, tap.Link, want); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if want.Socket == "" {
		return nil
	}
	att, err := find(want)
	if err != nil {
		return err
	}
	if att == nil {
		return fmt.Errorf("napitapd does not know %s/%s", want.ContainerID, want.IfName)
	}
	if att.TapName != want.TapName || att.Queues != want.Queues || att.NAPI != want.NAPI || att.Held != want.Held || att.Netns != netnsPath {
		return fmt.Errorf("napitapd holds %+v, want tap %q, %d queues (napi %v), %d held, netns %s",
			*att, want.TapName, want.Queues, want.NAPI, want.Held, netnsPath)
	}
	return nil
}

// Gone checks that nothing of the attachment is left: no tap in the netns
// (a netns already removed is fine) and nothing in napitapd.
func Gone(netnsPath string, want Expect) error {
	tapNetns := tapNetnsOf(netnsPath, want)
	if _, err := os.Stat(tapNetns); err == nil {
		err := ns.WithNetNSPath(tapNetns, func(ns.NetNS) error {
			_, err := netlinksafe.LinkByName(want.TapName)
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			if err == nil {
				return fmt.Errorf("tap %q is still there", want.TapName)
			}
			return err
		})
		var notNS ns.NSPathNotNSErr
		if err != nil && !errors.As(err, &notNS) {
			return fmt.Errorf("netns %s: %w", tapNetns, err)
		}
	}
	if want.Socket == "" {
		return nil
	}
	att, err := find(want)
	if err != nil {
		return err
	}
	if att != nil {
		return fmt.Errorf("napitapd still holds %+v", *att)
	}
	return nil
}

func find(want Expect) (*handoff.Attachment, error) {
	atts, err := (&handoff.Client{Socket: want.Socket}).List()
	if err != nil {
		return nil, err
	}
	for i := range atts {
		if atts[i].ContainerID == want.ContainerID && atts[i].IfName == want.IfName {
			return &atts[i], nil
		}
	}
	return nil, nil
}

// tapNetnsOf is where the attachment's tap is: the pod's netns, or the
// node's for a Kata DAN tap.
func tapNetnsOf(podNetns string, want Expect) string {
	if want.Wiring == "node-bridge" {
		return want.NodeNetns
	}
	return podNetns
}

func checkWiring(netnsPath string, tap netlink.Link, want Expect) error {
	if want.Wiring == "none" || want.Wiring == "" {
		return nil
	}
	if want.Wiring == "node-bridge" {
		// The pod interface is in the pod's netns; the tap is a port of
		// the bridge plugin's bridge in the node's.
		return ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
			br, err := netlinksafe.LinkByName(want.Bridge)
			if err != nil {
				return fmt.Errorf("bridge %q: %w", want.Bridge, err)
			}
			if tap.Attrs().MasterIndex != br.Attrs().Index {
				return fmt.Errorf("not a port of bridge %q", want.Bridge)
			}
			return nil
		})
	}
	return ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		peer, err := netlinksafe.LinkByName(want.IfName)
		if err != nil {
			return fmt.Errorf("interface %q: %w", want.IfName, err)
		}
		switch want.Wiring {
		case "tc-redirect":
			return tapsetup.CheckRedirect(peer, tap)
		case "bridge":
			if err := tapsetup.CheckBridge(want.Bridge, peer, tap); err != nil {
				return err
			}
			br, err := netlinksafe.LinkByName(want.Bridge)
			if err != nil {
				return err
			}
			if want.ContainerID != "" && br.Attrs().Alias != owner(want) {
				return fmt.Errorf("bridge %q: ifalias %q, want %q", want.Bridge, br.Attrs().Alias, owner(want))
			}
			return nil
		}
		return fmt.Errorf("unknown wiring %q", want.Wiring)
	})
}

// owner is the mark napitap gives the attachment's tap and bridge.
func owner(want Expect) string { return tapsetup.OwnerAlias(want.ContainerID, want.IfName) }
