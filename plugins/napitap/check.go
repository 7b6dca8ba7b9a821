package main

import (
	"fmt"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// checkTap compares the tap and its wiring in netnsPath with conf and names
// every difference it finds.
func checkTap(conf *config.Config, netnsPath string) error {
	if conf.NodeTap {
		netnsPath = nodeNetnsPath
	}
	tap, err := tapsetup.Inspect(netnsPath, conf.TapName)
	if err != nil {
		return err
	}
	var drift []string
	differs := func(what string, want, have any) {
		if fmt.Sprint(want) != fmt.Sprint(have) {
			drift = append(drift, fmt.Sprintf("%s is %v, config wants %v", what, have, want))
		}
	}
	attrs := tap.Link.Attrs()
	differs("multiqueue", conf.Queues > 1, tap.MultiQueue)
	differs("persist", true, tap.Persistent)
	differs("up", true, tap.Up)
	// A runtime that opens the tap by name attaches as many queues as its
	// VM has vCPUs (libvirt: 4 on a "queues": 2 tap) and sets
	// IFF_VNET_HDR itself; only the multiqueue mode must match.
	if !conf.RuntimeOpensByName() {
		differs("vnet_hdr", conf.VnetHdr, tap.VnetHdr)
		if tap.Link.Queues > conf.Queues {
			drift = append(drift, fmt.Sprintf("%d queues are attached, config allows %d", tap.Link.Queues, conf.Queues))
		}
	}
	if err := checkRootQdisc(conf, tap); err != nil {
		drift = append(drift, err.Error())
	}
	if conf.MAC != nil {
		differs("mac", conf.MAC, attrs.HardwareAddr)
	}
	if conf.TxQueueLen != nil {
		differs("txqueuelen", *conf.TxQueueLen, attrs.TxQLen)
	}
	differs("owner", idOrUnset(conf.Owner), tap.Sysfs.Owner)
	differs("group", idOrUnset(conf.Group), tap.Sysfs.Group)
	if conf.ThreadedNAPI {
		differs("threaded NAPI", true, tap.Sysfs.Threaded)
	}
	if conf.GROFlushTimeout != nil {
		differs("gro_flush_timeout", *conf.GROFlushTimeout, tap.Sysfs.GROFlushTimeout)
	}
	if conf.NAPIDeferHardIRQs != nil {
		differs("napi_defer_hard_irqs", *conf.NAPIDeferHardIRQs, tap.Sysfs.DeferHardIRQs)
	}

	err = ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		wiringDrift, err := checkWiring(conf, tap.Link)
		drift = append(drift, wiringDrift...)
		return err
	})
	if err != nil {
		return fmt.Errorf("tap %q in netns %s: %w", conf.TapName, netnsPath, err)
	}
	if len(drift) > 0 {
		return fmt.Errorf("tap %q in netns %s: %s", conf.TapName, netnsPath, strings.Join(drift, "; "))
	}
	return nil
}

// checkWiring runs in the pod netns. MTU is checked here because in chained
// wirings it defaults to the peer's.
func checkWiring(conf *config.Config, tap netlink.Link) (drift []string, err error) {
	wantMTU := conf.MTU
	var peer netlink.Link
	// The pod interface of a tap in the node's netns is in another netns.
	if conf.PeerIfName != "" && !conf.NodeTap {
		if peer, err = netlinksafe.LinkByName(conf.PeerIfName); err != nil {
			return nil, fmt.Errorf("interface %q: %w", conf.PeerIfName, err)
		}
		if wantMTU == 0 {
			wantMTU = peer.Attrs().MTU
		}
	}
	if wantMTU != 0 && tap.Attrs().MTU != wantMTU {
		drift = append(drift, fmt.Sprintf("mtu is %d, want %d", tap.Attrs().MTU, wantMTU))
	}

	var wiringErr error
	switch conf.Wiring {
	case config.WiringTCRedirect:
		wiringErr = tapsetup.CheckRedirect(peer, tap)
	case config.WiringBridge:
		wiringErr = tapsetup.CheckBridge(conf.Bridge, peer, tap)
	case config.WiringNodeBridge:
		wiringErr = checkNodeBridge(conf, tap)
	}
	if wiringErr != nil {
		drift = append(drift, wiringErr.Error())
	}
	return drift, nil
}

// checkRootQdisc: noqueue is napitap's, and libvirt sets the same on every
// tap it opens (DESIGN.md fact 14). mq is the kernel's default; a runtime
// that opens the tap by name may replace it as libvirt does, which is its
// own business as the queue count is. A single-queue tap's default is the
// node's net.core.default_qdisc, which CHECK does not guess.
func checkRootQdisc(conf *config.Config, tap *tapsetup.Tap) error {
	have := tap.RootQdisc
	switch {
	case conf.RootQdisc == config.RootQdiscNoqueue && have == tapsetup.QdiscNoqueue:
	case conf.RootQdisc == config.RootQdiscMQ && !tap.MultiQueue && have != tapsetup.QdiscNoqueue:
	case conf.RootQdisc == config.RootQdiscMQ && have == "mq":
	case conf.RootQdisc == config.RootQdiscMQ && have == tapsetup.QdiscNoqueue && conf.RuntimeOpensByName():
	default:
		return fmt.Errorf("root qdisc is %s, config wants %s", have, conf.RootQdisc)
	}
	return nil
}

func idOrUnset(id *uint32) int64 {
	if id == nil {
		return -1
	}
	return int64(*id)
}
