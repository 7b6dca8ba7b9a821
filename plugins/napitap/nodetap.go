package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// Kata runtime-rs looks a DAN "host-tap" up by name in the netns its shim
// runs in, the node's, and opens it there (DESIGN.md fact 18). So with
// kataDan the tap is made in the node's netns, which is the plugin's own,
// under a name of its attachment's, and joins the previous plugin's bridge,
// which is in the node's netns too. The guest takes over the pod
// interface's MAC and addresses on that bridge, so the pod interface's
// veth is cut off there: its node end goes down, which leaves the pod's
// side, routes and all, as the previous plugin made it and checks it
// (runtime-rs does not use the pod's netns when it has a DAN file).

// nodeNetnsPath is the plugin's own netns, the node's: the plugin's main
// thread never leaves it.
const nodeNetnsPath = "/proc/self/ns/net"

func addNodeTap(conf *config.Config, args *skel.CmdArgs, podNetns ns.NetNS) (result *current.Result, err error) {
	bridge, err := nodeBridge(conf)
	if err != nil {
		return nil, err
	}
	var guestMAC net.HardwareAddr
	var podMTU, nodeEnd int
	err = podNetns.Do(func(ns.NetNS) error {
		peer, err := netlinksafe.LinkByName(conf.PeerIfName)
		if err != nil {
			return fmt.Errorf("interface %q from prevResult in netns %s: %w", conf.PeerIfName, args.Netns, err)
		}
		// netlink's attributes alias its receive buffer.
		guestMAC, podMTU = slices.Clone(peer.Attrs().HardwareAddr), peer.Attrs().MTU
		veth, ok := peer.(*netlink.Veth)
		if !ok {
			return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("prevResult: kataDan needs the pod interface %q to be a veth into the node's netns, as the bridge plugin makes it; it is a %s", conf.PeerIfName, peer.Type()), "")
		}
		if nodeEnd, err = netlink.VethPeerIndex(veth); err != nil {
			return fmt.Errorf("interface %q in netns %s: its peer: %w", conf.PeerIfName, args.Netns, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	hostVeth, err := bridgePort(bridge, nodeEnd)
	if err != nil {
		return nil, fmt.Errorf("pod interface %q: %w", conf.PeerIfName, err)
	}
	if bytes.Equal(conf.MAC, guestMAC) {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mac: %s is the guest's MAC; on the bridge the tap needs another", conf.MAC), "")
	}
	if err := tapsetup.RequireFree(conf.TapName); err != nil {
		return nil, fmt.Errorf("tap %q in the node's netns: %w", conf.TapName, err)
	}

	spec := tapSpec(conf)
	spec.Alias = tapsetup.OwnerAlias(args.ContainerID, args.IfName)
	if spec.MTU == 0 {
		spec.MTU = podMTU
	}
	tap, queues, err := tapsetup.Create(spec)
	if err != nil {
		return nil, fmt.Errorf("the node's netns: %w", err)
	}
	defer tapsetup.CloseQueues(queues)
	defer func() {
		if err != nil {
			_ = tapsetup.DeleteTap(conf.TapName, spec.Alias)
		}
	}()
	// While every queue is attached (DESIGN.md fact 9).
	knobs := tapsetup.NAPIKnobs{Threaded: conf.ThreadedNAPI, GROFlushTimeout: conf.GROFlushTimeout, DeferHardIRQs: conf.NAPIDeferHardIRQs}
	if err := tapsetup.ApplyNAPIKnobs(nodeNetnsPath, conf.TapName, knobs); err != nil {
		return nil, fmt.Errorf("tap %q in the node's netns: NAPI settings: %w", conf.TapName, err)
	}
	if err := netlink.LinkSetMaster(tap, bridge); err != nil {
		return nil, fmt.Errorf("tap %q: join bridge %q in the node's netns: %w", conf.TapName, bridge.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(tap); err != nil {
		return nil, fmt.Errorf("tap %q in the node's netns: set up: %w", conf.TapName, err)
	}
	if err := netlink.LinkSetDown(hostVeth); err != nil {
		return nil, fmt.Errorf("pod interface %q: its node end %q: set down: %w", conf.PeerIfName, hostVeth.Attrs().Name, err)
	}
	defer func() {
		if err != nil {
			_ = netlink.LinkSetUp(hostVeth)
		}
	}()

	link, err := netlinksafe.LinkByName(conf.TapName)
	if err != nil {
		return nil, fmt.Errorf("tap %q in the node's netns: %w", conf.TapName, err)
	}
	att := attachmentOf(conf, args, link, guestMAC)
	att.NodeTap, att.Bridge = true, bridge.Attrs().Name
	if att.TapNetnsID, err = tapsetup.NetnsID(nodeNetnsPath); err != nil {
		return nil, fmt.Errorf("the node's netns: %w", err)
	}
	if err := handOff(conf, args, att, queues); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			releaseHandoff(conf, att.Key)
		}
	}()
	result = buildResult(conf, args, link, guestMAC, nil)
	if err := writeKataDan(conf, args, result, bridge.Attrs().Name); err != nil {
		return nil, err
	}
	return result, nil
}

// nodeBridge is the previous plugin's bridge: the first of its interfaces
// outside the sandbox that is a bridge in the node's netns.
func nodeBridge(conf *config.Config) (netlink.Link, error) {
	var host []string
	for _, iface := range conf.PrevResult.Interfaces {
		if iface.Sandbox != "" {
			continue
		}
		host = append(host, iface.Name)
		if link, err := netlinksafe.LinkByName(iface.Name); err == nil && link.Type() == "bridge" {
			return link, nil
		}
	}
	return nil, types.NewError(types.ErrInvalidNetworkConfig,
		fmt.Sprintf("prevResult: kataDan joins the tap to the previous plugin's bridge in the node's netns, and none of its node-side interfaces %q is one: chain napitap after the bridge plugin", host), "")
}

// bridgePort is the link of the node's netns with index index, if it is a
// veth port of bridge: the pod interface's node end, which is all ADD may
// touch of the node's links besides its tap.
func bridgePort(bridge netlink.Link, index int) (netlink.Link, error) {
	link, err := netlink.LinkByIndex(index)
	if err != nil {
		return nil, fmt.Errorf("its node end (index %d): %w", index, err)
	}
	if _, ok := link.(*netlink.Veth); !ok || link.Attrs().MasterIndex != bridge.Attrs().Index {
		return nil, fmt.Errorf("its node end %q is not a veth port of bridge %q", link.Attrs().Name, bridge.Attrs().Name)
	}
	return link, nil
}

// delNodeTap deletes the attachment's tap in the node's netns, and what an
// ADD killed half-way left there, only where it carries the attachment's
// mark: never another link of the node. The pod interface is the previous
// plugin's to delete.
func delNodeTap(conf *config.Config, args *skel.CmdArgs) error {
	owner := tapsetup.OwnerAlias(args.ContainerID, args.IfName)
	if err := tapsetup.DeleteTap(conf.TapName, owner); err != nil && !errors.Is(err, tapsetup.ErrNotTap) {
		return fmt.Errorf("the node's netns: %w", err)
	}
	if err := tapsetup.DeleteLeftovers(owner); err != nil {
		return fmt.Errorf("the node's netns: %w", err)
	}
	return nil
}

// checkNodeBridge: the tap in the node's netns is a port of the previous
// plugin's bridge.
func checkNodeBridge(conf *config.Config, tap netlink.Link) error {
	bridge, err := nodeBridge(conf)
	if err != nil {
		return err
	}
	if tap.Attrs().MasterIndex != bridge.Attrs().Index {
		return fmt.Errorf("tap %q is not a port of bridge %q", tap.Attrs().Name, bridge.Attrs().Name)
	}
	return nil
}
