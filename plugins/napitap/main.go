// napitap is a CNI plugin that gives a VM pod a multiqueue tap whose queues
// are opened with IFF_NAPI, wired to the interface of the plugin before it.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"

	"github.com/napitap/napitap/pkg/buildinfo"

	cnins "github.com/containernetworking/cni/pkg/ns"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/ipamexec"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func main() {
	// One verb is a short run of system calls, one after the other: a
	// second P only makes the runtime start and wake threads for it (its
	// GC workers, the spinning Ms that look for work), which cost every
	// ADD and DEL CPU a burst of pods on a node waits for (issue 46).
	runtime.GOMAXPROCS(1)
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    cmdAdd,
		Del:    cmdDel,
		Check:  cmdCheck,
		Status: cmdStatus,
		GC:     cmdGC,
	}, version.PluginSupports(config.SupportedVersions...), "CNI napitap plugin "+buildinfo.Version())
}

func cmdAdd(args *skel.CmdArgs) (err error) {
	conf, err := config.Load(args.StdinData, attachment(args, false))
	if err != nil {
		return err
	}
	if err := conf.RequireAddable(); err != nil {
		return err
	}
	if err := requireKernel(conf); err != nil {
		return err
	}
	netns, err := openNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer netns.Close()
	if conf.NodeTap {
		// Kata runtime-rs: the tap goes in the node's netns (nodetap.go).
		result, err := addNodeTap(conf, args, netns)
		if err != nil {
			return err
		}
		return types.PrintResult(result, conf.CNIVersion)
	}
	// Before IPAM, so that a taken name costs no address; Create and
	// WireBridge settle a race. Without IPAM they are the check.
	if conf.IPAM.Type != "" {
		if err := netns.Do(func(ns.NetNS) error { return requireNamesFree(conf, args) }); err != nil {
			return err
		}
	}

	var ipamResult *current.Result
	if conf.IPAM.Type != "" {
		if ipamResult, err = ipamexec.Add(context.TODO(), conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError(err)
		}
		defer func() {
			if err != nil {
				_ = ipamexec.Del(context.TODO(), conf.IPAM.Type, args.StdinData)
			}
		}()
		if len(ipamResult.IPs) == 0 {
			return fmt.Errorf("ipam %q returned no IP addresses", conf.IPAM.Type)
		}
	}

	var result *current.Result
	var guestMAC net.HardwareAddr
	err = netns.Do(func(ns.NetNS) (err error) {
		// One socket of the pod netns for all of ADD's requests there.
		nl, err := tapsetup.NewNetlink()
		if err != nil {
			return fmt.Errorf("netns %s: %w", args.Netns, err)
		}
		defer nl.Close()
		spec := tapSpec(conf)
		spec.Alias = tapsetup.OwnerAlias(args.ContainerID, args.IfName)
		if !handsOverQueues(conf) {
			// The runtime attaches its own queues by name. Each queue ADD
			// closes takes rtnl for two RCU grace periods (tun_detach),
			// which every other ADD, DEL and TUNSETIFF on the node waits
			// for under a burst: one queue makes the tap and takes its
			// NAPI knobs, which the queues attached later inherit
			// (DESIGN.md fact 9).
			spec.Queues = 1
		}
		var peer netlink.Link
		if conf.PeerIfName != "" {
			if peer, err = nl.LinkByName(conf.PeerIfName); err != nil {
				return fmt.Errorf("interface %q from prevResult: %w", conf.PeerIfName, err)
			}
			if spec.MTU == 0 {
				spec.MTU = peer.Attrs().MTU // the guest inherits the pod interface's path
			}
			// netlink's attributes alias its receive buffer.
			guestMAC = slices.Clone(peer.Attrs().HardwareAddr)
			if conf.Wiring == config.WiringBridge && conf.MAC.String() == guestMAC.String() {
				return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("mac: %s is the guest's MAC; in bridge wiring the tap needs another", conf.MAC), "")
			}
		}

		// Name, MAC and MTU, what the result and napitapd are told, are
		// final once Create returns: nothing below changes them.
		tap, queues, err := nl.Create(spec)
		if err != nil {
			return nameError(conf, args, "tap", err)
		}
		// napitapd keeps its own copies of what it is handed.
		defer tapsetup.CloseQueues(queues)
		defer func() {
			if err != nil {
				_ = nl.DeleteTap(conf.TapName, spec.Alias)
			}
		}()

		// While every queue is attached (DESIGN.md fact 9).
		knobs := tapsetup.NAPIKnobs{Threaded: conf.ThreadedNAPI, GROFlushTimeout: conf.GROFlushTimeout, DeferHardIRQs: conf.NAPIDeferHardIRQs}
		if err := tapsetup.ApplyNAPIKnobsHere(conf.TapName, knobs); err != nil {
			return fmt.Errorf("tap %q: NAPI settings: netns %s: %w", conf.TapName, args.Netns, err)
		}

		// The wiring undoes itself on error, and undoWiring undoes it for a
		// later one.
		undoWiring := func() error { return nil }
		switch conf.Wiring {
		case config.WiringTCRedirect:
			if err = nl.WireRedirectLinks(peer, tap); err != nil {
				return fmt.Errorf("netns %s: %w", args.Netns, err)
			}
			undoWiring = func() error { return nl.UnwireRedirect(conf.PeerIfName) }
		case config.WiringBridge:
			if undoWiring, err = nl.WireBridge(conf.Bridge, conf.PeerIfName, conf.TapName, randomMAC(), spec.Alias); err != nil {
				return nameError(conf, args, "bridge", err)
			}
		}
		defer func() {
			if err != nil {
				_ = undoWiring()
			}
		}()
		if err := nl.SetUp(tap); err != nil {
			return fmt.Errorf("tap %q in netns %s: set up: %w", conf.TapName, args.Netns, err)
		}
		if ipamResult != nil {
			ipamResult.Interfaces = []*current.Interface{{Name: conf.TapName}}
			ipamResult.IPs = withInterface(ipamResult.IPs, 0)
			var addrs []net.IPNet
			for _, ipc := range ipamResult.IPs {
				addrs = append(addrs, ipc.Address)
			}
			if err := nl.AddAddrs(tap, addrs, routesOf(ipamResult)); err != nil {
				return fmt.Errorf("tap %q in netns %s: %w", conf.TapName, args.Netns, err)
			}
		}
		if err := handOff(conf, args, attachmentOf(conf, args, tap, guestMAC), queues); err != nil {
			return err
		}
		defer func() {
			if err != nil {
				releaseHandoff(conf, handoff.Key{ContainerID: args.ContainerID, IfName: args.IfName})
			}
		}()
		result = buildResult(conf, args, tap, guestMAC, ipamResult)
		return writeKataDan(conf, args, result, conf.Bridge)
	})
	if err != nil {
		return err
	}
	return types.PrintResult(result, conf.CNIVersion)
}

// buildResult lists the previous interfaces, then the tap, then, for chained
// wirings, the guest NIC (sandbox = container ID) that takes over the
// previous interface's addresses: the runtime configures the guest from it.
func buildResult(conf *config.Config, args *skel.CmdArgs, tap netlink.Link, guestMAC net.HardwareAddr, ipamResult *current.Result) *current.Result {
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, DNS: conf.DNS}
	if conf.PrevResult != nil {
		result = conf.PrevResult
	}
	tapSandbox := args.Netns
	if conf.NodeTap {
		tapSandbox = "" // the node's netns, as the bridge and its veth
	}
	result.Interfaces = append(result.Interfaces, &current.Interface{
		Name:    tap.Attrs().Name,
		Mac:     tap.Attrs().HardwareAddr.String(),
		Mtu:     tap.Attrs().MTU,
		Sandbox: tapSandbox,
	})
	tapIndex := len(result.Interfaces) - 1

	if ipamResult != nil {
		result.IPs = withInterface(ipamResult.IPs, tapIndex)
		result.Routes = ipamResult.Routes
		if ipamResult.DNS.Nameservers != nil {
			result.DNS = ipamResult.DNS
		}
	}
	if conf.Wiring == config.WiringNone {
		return result
	}

	peerIndex := -1
	for i, iface := range result.Interfaces {
		if iface.Name == conf.PeerIfName && iface.Sandbox != "" {
			peerIndex = i
			break
		}
	}
	result.Interfaces = append(result.Interfaces, &current.Interface{
		Name:    args.IfName,
		Mac:     guestMAC.String(),
		Mtu:     tap.Attrs().MTU,
		Sandbox: args.ContainerID,
	})
	guestIndex := len(result.Interfaces) - 1
	for _, ipc := range result.IPs {
		if ipc.Interface != nil && *ipc.Interface == peerIndex {
			ipc.Interface = current.Int(guestIndex)
		}
	}
	return result
}

func cmdDel(args *skel.CmdArgs) error {
	att := attachment(args, true)
	// Unknown keys are refused here too (a typo must not pass at any verb);
	// Multus gives DEL the config its ADD took (DESIGN.md), and a key
	// napitap once took stays known, so an attachment still cleans up.
	att.ForDelete = true
	conf, err := config.Load(args.StdinData, att)
	if err != nil {
		return err
	}
	releaseHandoff(conf, handoff.Key{ContainerID: args.ContainerID, IfName: args.IfName})
	if err := removeKataDan(conf, args); err != nil {
		return err
	}
	if conf.IPAM.Type != "" {
		if err := ipamexec.Del(context.TODO(), conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError(err)
		}
	}
	if conf.NodeTap {
		return delNodeTap(conf, args)
	}
	if args.Netns == "" {
		return nil
	}
	// Never unwire the node's own interfaces for a pod's.
	if own, cniErr := cnins.CheckNetNS(args.Netns); cniErr == nil && own {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS: %s is the plugin's own netns", args.Netns), "")
	}
	err = ns.WithNetNSPath(args.Netns, func(ns.NetNS) error {
		// One socket of the pod netns for all of DEL's requests there.
		nl, err := tapsetup.NewNetlink()
		if err != nil {
			return err
		}
		defer nl.Close()
		var guestMAC net.HardwareAddr
		if peer := conf.PrevSandboxInterface(); peer != nil {
			guestMAC, _ = net.ParseMAC(peer.Mac)
		}
		if err := unwire(nl, conf, args.IfName, guestMAC); err != nil {
			return err
		}
		// Only taps marked as this attachment's: after a failed ADD the
		// name may well be someone else's (KubeVirt's tap0, say).
		owner := tapsetup.OwnerAlias(args.ContainerID, args.IfName)
		for _, name := range tapsToDelete(conf, args.IfName) {
			if err := nl.DeleteTap(name, owner); err != nil && !errors.Is(err, tapsetup.ErrNotTap) {
				return err
			}
		}
		// What an ADD killed before its renames left under temporary names.
		return nl.DeleteLeftovers(owner)
	})
	if isGone(err) {
		return nil // the runtime removed the netns, and the tap with it
	}
	if err != nil {
		return fmt.Errorf("netns %s: %w", args.Netns, err)
	}
	return nil
}

// requireNamesFree fails, as nameError says, when the tap's or the bridge's
// name is taken in the current netns.
func requireNamesFree(conf *config.Config, args *skel.CmdArgs) error {
	if err := tapsetup.RequireFree(conf.TapName); err != nil {
		return nameError(conf, args, "tap", fmt.Errorf("tap %q: %w", conf.TapName, err))
	}
	if conf.Wiring == config.WiringBridge {
		if err := tapsetup.RequireFree(conf.Bridge); err != nil {
			return nameError(conf, args, "bridge", fmt.Errorf("bridge %q: %w", conf.Bridge, err))
		}
	}
	return nil
}

// nameError makes the CNI error of a failure to create the tap or the
// bridge (kind). A name another link holds is the fault of whoever chose
// the name: the config (code 7) or, for a default, CNI_IFNAME (code 4).
// Anything else is wrapped as it is.
func nameError(conf *config.Config, args *skel.CmdArgs, kind string, err error) error {
	if !errors.Is(err, tapsetup.ErrExists) {
		return fmt.Errorf("netns %s: %w", args.Netns, err)
	}
	cause := tapsetup.ErrExists.Error()
	var exists tapsetup.ExistsError
	if errors.As(err, &exists) {
		cause = exists.Error()
	}
	name, given, origin := conf.TapName, conf.TapNameGiven, ""
	field := "tapName"
	if kind == "bridge" {
		name, given, field = conf.Bridge, conf.BridgeGiven, "bridge"
		if !given && conf.TapNameGiven {
			// "br-" + tapName: the config chose it all the same.
			given, origin = true, fmt.Sprintf(" (named after tapName %q)", conf.TapName)
		}
	}
	if given {
		return types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("%s: %s %q%s in netns %s: %s", field, kind, name, origin, args.Netns, cause), "")
	}
	if name != args.IfName {
		origin = fmt.Sprintf(" (named after CNI_IFNAME %q)", args.IfName)
	}
	return types.NewError(types.ErrInvalidEnvironmentVariables,
		fmt.Sprintf("CNI_IFNAME: %s %q%s in netns %s: %s", kind, name, origin, args.Netns, cause), "")
}

// podAddrs are the pod interface's addresses as prevResult knows them: on
// the previous plugin's entry (ADD) or on napitap's guest entry (DEL).
func podAddrs(conf *config.Config, ifName string) []net.IPNet {
	if conf.PrevResult == nil {
		return nil
	}
	var addrs []net.IPNet
	for _, ipc := range conf.PrevResult.IPs {
		if ipc.Interface == nil || *ipc.Interface < 0 || *ipc.Interface >= len(conf.PrevResult.Interfaces) {
			continue
		}
		if conf.PrevResult.Interfaces[*ipc.Interface].Name == ifName {
			addrs = append(addrs, ipc.Address)
		}
	}
	return addrs
}

// podRoutes are prevResult's routes: the pod interface's, which went with
// its addresses when bridge wiring took them.
func podRoutes(conf *config.Config) []tapsetup.PeerRoute {
	if conf.PrevResult == nil {
		return nil
	}
	return routesOf(conf.PrevResult)
}

// routesOf are result's routes; one without a gateway goes through the
// gateway of its family's address, as the plugins that made the result
// installed it.
func routesOf(result *current.Result) []tapsetup.PeerRoute {
	var routes []tapsetup.PeerRoute
	for _, r := range result.Routes {
		gw := r.GW
		if gw == nil {
			for _, ipc := range result.IPs {
				if ipc.Gateway != nil && (ipc.Gateway.To4() == nil) == (r.Dst.IP.To4() == nil) {
					gw = ipc.Gateway
					break
				}
			}
		}
		routes = append(routes, tapsetup.PeerRoute{Dst: r.Dst, GW: gw})
	}
	return routes
}

// tapsToDelete names the taps DEL removes, the configured one first. Before spec 0.4.0 DEL comes
// without prevResult, so a defaulted wiring cannot be told from the config;
// try the chained name as well. Only tuntap links are ever deleted.
func tapsToDelete(conf *config.Config, ifName string) []string {
	names := []string{conf.TapName}
	if !conf.WiringGiven && !conf.TapNameGiven && conf.PrevResult == nil {
		names = append(names, config.DefaultTapName(ifName, config.WiringTCRedirect))
	}
	return names
}

// unwire undoes the wiring; a defaulted wiring seen without prevResult may
// have been tc-redirect on ifName, so its filters go too.
func unwire(nl *tapsetup.Netlink, conf *config.Config, ifName string, guestMAC net.HardwareAddr) error {
	switch conf.Wiring {
	case config.WiringBridge:
		identity := tapsetup.PeerIdentity{MAC: guestMAC, Addrs: podAddrs(conf, ifName), Routes: podRoutes(conf)}
		return nl.UnwireBridge(conf.Bridge, conf.PeerIfName, identity, tapsetup.OwnerAlias(conf.ContainerID(), ifName))
	case config.WiringTCRedirect:
		return nl.UnwireRedirect(conf.PeerIfName)
	}
	if !conf.WiringGiven && conf.PrevResult == nil {
		return nl.UnwireRedirect(ifName)
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, attachment(args, true))
	if err != nil {
		return err
	}
	if err := conf.RequireAddable(); err != nil {
		return err
	}
	if err := requireKernel(conf); err != nil {
		return err
	}
	netns, err := openNetNS(args.Netns)
	if err != nil {
		return err
	}
	defer netns.Close()
	if conf.IPAM.Type != "" {
		if err := ipamexec.Check(context.TODO(), conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError(err)
		}
	}
	if err := checkTap(conf, args.Netns); err != nil {
		var cniErr *types.Error
		if errors.As(err, &cniErr) {
			return err
		}
		return types.NewError(config.ErrCheckDrift, err.Error(), "")
	}
	return nil
}

// cmdStatus reports whether napitap can serve ADD for this config now.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, config.Attachment{CNIArgs: args.Args})
	if err != nil {
		return err
	}
	if err := conf.RequireConsistent(); err != nil {
		return err
	}
	if err := requireKernel(conf); err != nil {
		return err
	}
	if conf.IPAM.Type != "" {
		if err := ipamexec.Status(context.TODO(), conf.IPAM.Type, args.StdinData); err != nil {
			if errors.Is(err, ipamexec.ErrNotFound) {
				return types.NewError(types.ErrPluginNotAvailable, "ipam.type: "+err.Error(), "")
			}
			return ipamError(err)
		}
	}
	// ADD cannot work without napitapd in fds mode, or with "required".
	if handoffNeeded(conf) {
		if _, err := (&handoff.Client{Socket: conf.HandoffSocket}).List(); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "handoff: "+err.Error(), "")
		}
	}
	return nil
}

// cmdGC releases what napitapd holds for attachments of this network that
// are not in cni.dev/valid-attachments, and passes GC on to IPAM.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, config.Attachment{CNIArgs: args.Args, AllowUnknown: true})
	if err != nil {
		return err
	}
	gcHandoff(conf)
	if err := gcKataDan(conf); err != nil {
		return err
	}
	if conf.IPAM.Type != "" {
		if err := ipamexec.GC(context.TODO(), conf.IPAM.Type, args.StdinData); err != nil {
			return ipamError(err)
		}
	}
	return nil
}

// requireKernel fails with code 50 (plugin not available) naming the config
// field when this kernel cannot serve conf, before anything is made.
// TUNSETIFF drops flags it does not know without a word (DESIGN.md fact
// 11), and a missing sysfs knob would only fail after the tap exists.
func requireKernel(conf *config.Config) error {
	features, err := tapsetup.Features()
	if err == nil {
		err = tapsetup.RequireKernel(conf.KernelNeeds(), features, tapsetup.ProbeDevDir)
	}
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	return nil
}

// attachmentOf describes the attachment for napitapd and the runtime.
func attachmentOf(conf *config.Config, args *skel.CmdArgs, tap netlink.Link, guestMAC net.HardwareAddr) *handoff.Attachment {
	att := &handoff.Attachment{
		Key:         handoff.Key{ContainerID: args.ContainerID, IfName: args.IfName},
		Network:     conf.Name,
		Netns:       args.Netns,
		TapName:     conf.TapName,
		Queues:      conf.Queues,
		MultiQueue:  conf.Queues > 1,
		NAPI:        conf.NAPI,
		NAPIFrags:   conf.NAPIFrags,
		VnetHdr:     conf.VnetHdr,
		VnetHdrSize: conf.VnetHdrSize,
		MTU:         tap.Attrs().MTU,
		Owner:       conf.Owner,
		Group:       conf.Group,
		Wiring:      conf.Wiring,
		Bridge:      conf.Bridge,
	}
	if guestMAC == nil {
		// A standalone tap has no pod interface to take a MAC from, yet
		// the VMM needs one for the guest ({mac}).
		guestMAC = standaloneGuestMAC(args.ContainerID, args.IfName, tap.Attrs().HardwareAddr)
	}
	att.MAC = guestMAC.String()
	return att
}

// standaloneGuestMAC is the guest's MAC behind a tap of wiring "none": a
// locally administered unicast MAC derived from the attachment, so it stays
// the same across napitapd restarts and refetches, and never the tap's own.
func standaloneGuestMAC(containerID, ifName string, tapMAC net.HardwareAddr) net.HardwareAddr {
	sum := sha256.Sum256([]byte("napitap-guest-mac:" + containerID + "/" + ifName))
	mac := net.HardwareAddr(sum[:6])
	mac[0] = mac[0]&^0x01 | 0x02
	if bytes.Equal(mac, tapMAC) {
		mac[5] ^= 0x01
	}
	return mac
}

func attachment(args *skel.CmdArgs, finalResult bool) config.Attachment {
	return config.Attachment{ContainerID: args.ContainerID, IfName: args.IfName, CNIArgs: args.Args, FinalResult: finalResult}
}

func queueFlags(conf *config.Config) tapsetup.QueueFlags {
	return tapsetup.QueueFlags{
		MultiQueue: conf.Queues > 1,
		VnetHdr:    conf.VnetHdr,
		NAPI:       conf.NAPI,
		NAPIFrags:  conf.NAPIFrags,
	}
}

func tapSpec(conf *config.Config) tapsetup.Spec {
	spec := tapsetup.Spec{
		Name:        conf.TapName,
		Queues:      conf.Queues,
		Flags:       queueFlags(conf),
		VnetHdrSize: conf.VnetHdrSize,
		Owner:       conf.Owner,
		Group:       conf.Group,
		MTU:         conf.MTU,
		MAC:         conf.MAC,
		TxQueueLen:  conf.TxQueueLen,
	}
	// mq is what the kernel attaches when the tap goes up with no qdisc.
	if conf.RootQdisc == config.RootQdiscNoqueue {
		spec.RootQdisc = tapsetup.QdiscNoqueue
	}
	return spec
}

func openNetNS(path string) (ns.NetNS, error) {
	// skel checks this only after ADD has done its work.
	if own, err := cnins.CheckNetNS(path); err == nil && own {
		return nil, types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS: %s is the plugin's own netns", path), "")
	}
	netns, err := ns.GetNS(path)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS: %v", err), "")
	}
	// GetNS accepts any file on procfs; ask the kernel what it is.
	if kind, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_NSTYPE); err != nil || kind != unix.CLONE_NEWNET {
		netns.Close()
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS: %s is not a network namespace", path), "")
	}
	return netns, nil
}

// isGone: the netns path is missing, or is a file no netns is mounted on
// any more (what runtimes leave after tearing a sandbox down).
func isGone(err error) bool {
	var notExist ns.NSPathNotExistErr
	var notNS ns.NSPathNotNSErr
	return errors.As(err, &notExist) || errors.As(err, &notNS)
}

func withInterface(ips []*current.IPConfig, index int) []*current.IPConfig {
	for _, ipc := range ips {
		ipc.Interface = current.Int(index)
	}
	return ips
}

// randomMAC is a locally administered unicast MAC for a bridge port that
// gives its own MAC to the guest.
func randomMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	_, _ = rand.Read(mac)
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// ipamError names the IPAM plugin's field when the node lacks it, and keeps
// the plugin's own CNI error (and code) otherwise.
func ipamError(err error) error {
	if errors.Is(err, ipamexec.ErrNotFound) {
		return types.NewError(types.ErrInvalidNetworkConfig, "ipam.type: "+err.Error(), "")
	}
	return err
}
