package main

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/katadan"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// writeKataDan records the tap for Kata runtime-rs, which plugs "host-tap"
// devices it finds in the sandbox's DAN file into the VM. runtime-rs opens
// the tap by name in its own netns, the node's (DESIGN.md fact 18); under
// napitapd's seccomp agent that open gets NAPI queues.
func writeKataDan(conf *config.Config, args *skel.CmdArgs, result *current.Result, bridge string) error {
	if conf.KataDanDir == "" {
		return nil
	}
	dev := katadan.Device{
		Name: args.IfName,
		Device: katadan.HostTap{
			Type:      "host-tap",
			TapName:   conf.TapName,
			QueueNum:  conf.Queues,
			QueueSize: conf.KataDanQueueSize,
		},
		NetworkInfo: katadan.NetworkInfo{Interface: katadan.Interface{NType: "tuntap", IPAddresses: []string{}}, Routes: []katadan.Route{}, Neighbors: []any{}},
		Network:     conf.Name,
		Wiring:      conf.Wiring,
		Bridge:      bridge,
	}
	// For GC's check that the path still names this pod's netns.
	dev.NetnsID, _ = tapsetup.NetnsID(args.Netns)
	// The guest is the last interface of the result: the guest NIC entry
	// when chained, the tap itself otherwise.
	guest := len(result.Interfaces) - 1
	dev.GuestMAC = result.Interfaces[guest].Mac
	dev.NetworkInfo.Interface.MTU = result.Interfaces[guest].Mtu
	for _, ipc := range result.IPs {
		if ipc.Interface != nil && *ipc.Interface == guest {
			dev.NetworkInfo.Interface.IPAddresses = append(dev.NetworkInfo.Interface.IPAddresses, ipc.Address.String())
		}
	}
	for _, r := range result.Routes {
		route := katadan.Route{Dest: r.Dst.String()}
		if r.GW != nil {
			route.Gateway = r.GW.String()
		}
		dev.NetworkInfo.Routes = append(dev.NetworkInfo.Routes, route)
	}
	// runtime-rs enters the file's netns before it opens the taps: a tap
	// in the node's netns, where its shim runs, needs none.
	danNetns := args.Netns
	if conf.NodeTap {
		danNetns = ""
	}
	if err := katadan.Put(conf.KataDanDir, args.ContainerID, danNetns, dev); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("kataDan: %v", err), "")
	}
	return nil
}

func removeKataDan(conf *config.Config, args *skel.CmdArgs) error {
	if conf.KataDanDir == "" {
		return nil
	}
	if err := katadan.Remove(conf.KataDanDir, args.ContainerID, args.IfName); err != nil {
		return types.NewError(types.ErrIOFailure, fmt.Sprintf("kataDan: %v", err), "")
	}
	return nil
}
