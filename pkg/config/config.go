// Package config parses, defaults and validates napitap's network config.
//
// Every rejection is a *types.Error whose message starts with the field at
// fault, so an operator reading kubelet's event knows what to fix.
package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"net"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/katadan"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// SupportedVersions are the CNI spec versions napitap speaks.
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Wiring modes: how the tap reaches the pod's network.
const (
	WiringNone       = "none"
	WiringTCRedirect = "tc-redirect"
	WiringBridge     = "bridge"
	// WiringNodeBridge: the tap is in the node's netns and joins the
	// previous plugin's bridge there (kataDan only).
	WiringNodeBridge = "node-bridge"
)

const (
	MaxQueues = tapsetup.MaxQueues // MAX_TAP_QUEUES in drivers/net/tun.c
	minMTU    = 68
	maxMTU    = 65521 // tun: 65535 minus the Ethernet header
	// uidInvalid is (uid_t)-1, which TUNSETOWNER/TUNSETGROUP reject.
	uidInvalid = 1<<32 - 1
)

// NetConf is the network config as JSON carries it. Pointers tell "absent"
// from a zero value, which matters for owner/group (0 is root) and knobs.
type NetConf struct {
	types.PluginConf

	Queues            *int    `json:"queues,omitempty"`
	NAPI              *bool   `json:"napi,omitempty"`
	NAPIFrags         *bool   `json:"napiFrags,omitempty"`
	ThreadedNAPI      *bool   `json:"threadedNapi,omitempty"`
	GROFlushTimeout   *uint64 `json:"groFlushTimeout,omitempty"`
	NAPIDeferHardIRQs *uint32 `json:"napiDeferHardIrqs,omitempty"`
	VnetHdr           *bool   `json:"vnetHdr,omitempty"`
	VnetHdrSize       *int    `json:"vnetHdrSize,omitempty"`
	MTU               *int    `json:"mtu,omitempty"`
	MAC               string  `json:"mac,omitempty"`
	TxQueueLen        *int    `json:"txQueueLen,omitempty"`
	RootQdisc         string  `json:"rootQdisc,omitempty"`
	Owner             *uint32 `json:"owner,omitempty"`
	Group             *uint32 `json:"group,omitempty"`
	TapName           string  `json:"tapName,omitempty"`
	Wiring            string  `json:"wiring,omitempty"`
	Bridge            string  `json:"bridge,omitempty"`

	Handoff *HandoffConf `json:"handoff,omitempty"`
	KataDan *KataDanConf `json:"kataDan,omitempty"`

	RuntimeConfig struct {
		MAC string `json:"mac,omitempty"`
	} `json:"runtimeConfig,omitempty"`

	Args struct {
		CNI PodArgs `json:"cni,omitempty"`
	} `json:"args,omitempty"`
}

// HandoffConf says how the VM runtime gets NAPI queues.
type HandoffConf struct {
	Mode     string `json:"mode,omitempty"`
	Socket   string `json:"socket,omitempty"`
	Required bool   `json:"required,omitempty"`
	// Disabled is the older spelling of "mode": "off".
	Disabled bool `json:"disabled,omitempty"`
}

// Hand-off modes: how the runtime's guest gets NAPI queues.
const (
	// HandoffFDs: napitapd holds ADD's queues until the runtime fetches them.
	HandoffFDs = "fds"
	// HandoffIntercept: ADD closes its one queue and napitapd records the
	// attachment; the runtime opens the tap by name and napitapd's seccomp
	// agent makes that open a NAPI one.
	HandoffIntercept = "intercept"
	// HandoffOff: ADD closes its one queue; a runtime that opens the tap by
	// name gets plain ones.
	HandoffOff = "off"
)

// Root qdiscs of the tap.
const (
	// RootQdiscNoqueue: transmit straight into the queue's ring, as
	// libvirt leaves every tap it opens (DESIGN.md fact 14). It costs one
	// qdisc, where the kernel's default costs 256 (fact 15).
	RootQdiscNoqueue = "noqueue"
	// RootQdiscMQ: the kernel's default, which napitap leaves alone: mq
	// with one net.core.default_qdisc per tx queue, all 256 of a
	// multiqueue tap; a single-queue tap gets the default_qdisc alone.
	RootQdiscMQ = "mq"
)

// KataDanConf asks for a Kata runtime-rs DAN file entry per attachment.
type KataDanConf struct {
	Enabled   bool   `json:"enabled,omitempty"`
	Dir       string `json:"dir,omitempty"`
	QueueSize int    `json:"queueSize,omitempty"`
}

// PodArgs are the per-pod overrides Multus passes from a pod's network
// selection `cni-args` as `args.cni`.
type PodArgs struct {
	Queues          *int    `json:"queues,omitempty"`
	NAPI            *bool   `json:"napi,omitempty"`
	ThreadedNAPI    *bool   `json:"threadedNapi,omitempty"`
	GROFlushTimeout *uint64 `json:"groFlushTimeout,omitempty"`
	MAC             string  `json:"mac,omitempty"`
}

// envArgs is what napitap reads from CNI_ARGS.
type envArgs struct {
	types.CommonArgs
	MAC types.UnmarshallableString `json:"mac,omitempty"`
}

// Config is the resolved config: defaults applied, overrides merged,
// everything validated. The plugin works from this only.
type Config struct {
	CNIVersion string
	Name       string
	IPAM       types.IPAM
	DNS        types.DNS
	// PrevResult is the previous plugin's result in the current spec
	// version, nil when napitap runs first.
	PrevResult       *current.Result
	ValidAttachments []types.GCAttachment

	Queues            int
	NAPI              bool
	NAPIFrags         bool
	ThreadedNAPI      bool
	GROFlushTimeout   *uint64
	NAPIDeferHardIRQs *uint32
	VnetHdr           bool
	VnetHdrSize       int
	MTU               int // 0: kernel default, or the chained interface's MTU
	MAC               net.HardwareAddr
	TxQueueLen        *int
	// RootQdisc is RootQdiscNoqueue or RootQdiscMQ.
	RootQdisc string
	Owner     *uint32
	Group     *uint32

	TapName string
	// TapNameGiven is true when the config names the tap.
	TapNameGiven bool
	Wiring       string
	// WiringGiven is false when the wiring was chosen from prevResult, which
	// DEL of old spec versions does not receive.
	WiringGiven bool
	Bridge      string
	// BridgeGiven is true when the config names the bridge.
	BridgeGiven bool
	// PeerIfName is the previous plugin's interface in the sandbox that
	// chained wirings join to the tap (CNI_IFNAME); empty in "none".
	PeerIfName string
	// NodeTap: the tap is made in the node's netns, the plugin's own, where
	// Kata runtime-rs looks a DAN tap up (WiringNodeBridge).
	NodeTap bool

	// HandoffMode is one of HandoffFDs, HandoffIntercept, HandoffOff.
	HandoffMode string
	// HandoffSocket is napitapd's socket, empty in HandoffOff. ADD fails
	// when napitapd cannot take the attachment in HandoffFDs, where
	// napitapd is the runtime's only way to the queues, and with
	// HandoffRequired.
	HandoffSocket   string
	HandoffRequired bool

	// KataDanDir is where ADD writes the sandbox's DAN file for Kata
	// runtime-rs; empty when not asked for.
	KataDanDir       string
	KataDanQueueSize int

	ifName      string
	containerID string
	confMAC     net.HardwareAddr
}

// Attachment is what the runtime says about the attachment besides the
// config: CNI_CONTAINERID, CNI_IFNAME, CNI_ARGS, and whether prevResult is
// the chain's final result (CHECK, DEL) rather than the previous plugin's
// (ADD). The final result holds napitap's own interfaces too.
type Attachment struct {
	ContainerID string
	IfName      string
	CNIArgs     string
	FinalResult bool
	// ForDelete loads for DEL: only what names the attachment's objects is
	// checked, so DEL can clean up after any ADD that failed on a value.
	ForDelete bool
	// AllowUnknown ignores keys napitap does not know, for GC, which
	// sweeps after configs of any version; ADD, CHECK, DEL and STATUS
	// refuse them.
	AllowUnknown bool
}

// Load parses a network config for att. Errors are *types.Error: code 6 for
// undecodable JSON, 7 for invalid values, 4 for invalid CNI_ variables.
func Load(stdin []byte, att Attachment) (*Config, error) {
	var nc NetConf
	if err := json.Unmarshal(stdin, &nc); err != nil {
		return nil, decodeError(err)
	}
	if !att.AllowUnknown {
		if err := unknownKeys(stdin); err != nil {
			return nil, err
		}
		if err := misspeltPodArgs(stdin); err != nil {
			return nil, err
		}
	}
	if !slices.Contains(SupportedVersions, nc.CNIVersion) {
		return nil, invalid("cniVersion", "%q is not supported (supported: %s)", nc.CNIVersion, strings.Join(SupportedVersions, ", "))
	}

	c := &Config{
		CNIVersion:        nc.CNIVersion,
		Name:              nc.Name,
		IPAM:              nc.IPAM,
		DNS:               nc.DNS,
		ValidAttachments:  nc.ValidAttachments,
		Queues:            valueOr(nc.Queues, 1),
		NAPI:              valueOr(nc.NAPI, true),
		NAPIFrags:         valueOr(nc.NAPIFrags, false),
		ThreadedNAPI:      valueOr(nc.ThreadedNAPI, false), // defaulted below
		GROFlushTimeout:   nc.GROFlushTimeout,
		NAPIDeferHardIRQs: nc.NAPIDeferHardIRQs,
		VnetHdr:           valueOr(nc.VnetHdr, true),
		VnetHdrSize:       valueOr(nc.VnetHdrSize, 12),
		MTU:               valueOr(nc.MTU, 0),
		TxQueueLen:        nc.TxQueueLen,
		RootQdisc:         nc.RootQdisc,
		Owner:             nc.Owner,
		Group:             nc.Group,
		Wiring:            nc.Wiring,
		Bridge:            nc.Bridge,
		BridgeGiven:       nc.Bridge != "",
		HandoffMode:       HandoffFDs,
		HandoffSocket:     handoff.DefaultSocket,
	}
	// noqueue by default: 0.34 MiB of kernel slab per 4-queue tap, against
	// 6.6 MiB under mq (DESIGN.md fact 15, docs/bench/cni.md).
	if c.RootQdisc == "" {
		c.RootQdisc = RootQdiscNoqueue
	}
	if h := nc.Handoff; h != nil {
		switch h.Mode {
		case "":
			if h.Disabled {
				c.HandoffMode = HandoffOff
			}
		case HandoffFDs, HandoffIntercept, HandoffOff:
			if h.Disabled && h.Mode != HandoffOff {
				return nil, invalid("handoff.mode", "%q with \"disabled\": true; disabled is the older spelling of \"off\"", h.Mode)
			}
			c.HandoffMode = h.Mode
		default:
			return nil, invalid("handoff.mode", "%q is not %q, %q or %q", h.Mode, HandoffFDs, HandoffIntercept, HandoffOff)
		}
		switch {
		case c.HandoffMode == HandoffOff && h.Required:
			return nil, invalid("handoff", "required and off at once")
		case c.HandoffMode == HandoffOff:
			c.HandoffSocket = ""
		case h.Socket != "":
			if !strings.HasPrefix(h.Socket, "/") {
				return nil, invalid("handoff.socket", "%q is not an absolute path", h.Socket)
			}
			c.HandoffSocket = h.Socket
		}
		c.HandoffRequired = h.Required
	}
	if k := nc.KataDan; k != nil && k.Enabled {

		c.KataDanDir, c.KataDanQueueSize = k.Dir, k.QueueSize
		if k.Dir == "" {
			c.KataDanDir = katadan.DefaultDir
		}
		if !strings.HasPrefix(c.KataDanDir, "/") {
			return nil, invalid("kataDan.dir", "%q is not an absolute path", k.Dir)
		}
		if k.QueueSize != 0 && (k.QueueSize < 2 || k.QueueSize > 32768 || k.QueueSize&(k.QueueSize-1) != 0) {
			return nil, invalid("kataDan.queueSize", "%d is not a power of two in 2-32768", k.QueueSize)
		}

	}

	if nc.RawPrevResult != nil {
		if err := version.ParsePrevResult(&nc.PluginConf); err != nil {
			return nil, invalid("prevResult", "cannot parse: %v", err)
		}
		prev, err := current.NewResultFromResult(nc.PluginConf.PrevResult)
		if err != nil {
			return nil, invalid("prevResult", "cannot convert to %s: %v", current.ImplementedSpecVersion, err)
		}
		if err := checkNoNulls(prev); err != nil {
			return nil, err
		}
		c.PrevResult = prev
	}

	// DEL must clean up after an ADD that failed on bad values, or the pod
	// never finishes terminating: it only needs the names.
	mac, confMAC, err := resolveMAC(&nc, att.CNIArgs)
	if err != nil && !att.ForDelete {
		return nil, err
	}
	c.MAC, c.confMAC = mac, confMAC
	if err := applyPodArgs(c, nc.Args.CNI); err != nil && !att.ForDelete {
		return nil, err
	}
	// Threaded NAPI by default: of the NAPI modes it measured best for TCP
	// (one stream 1.08-2.67x a plain queue, by machine; docs/bench/
	// datapath.md), where NAPI in softirq costs 6-20% per frame.
	if nc.ThreadedNAPI == nil && nc.Args.CNI.ThreadedNAPI == nil {
		c.ThreadedNAPI = c.NAPI
	}

	c.containerID = att.ContainerID
	if att.ForDelete && !slices.Contains([]string{"", WiringNone, WiringTCRedirect, WiringBridge, WiringNodeBridge}, c.Wiring) {
		c.Wiring = "" // unknown: let DEL try what a defaulted wiring could be
	}
	if err := c.resolveNodeWiring(att, nc.TapName); err != nil {
		return nil, err
	}
	if !c.NodeTap {
		if err := c.resolveWiring(att.IfName, nc.TapName, att.FinalResult); err != nil {
			return nil, err
		}
	}
	if err := c.validateNames(); err != nil {
		return nil, err
	}
	if !att.ForDelete {
		if err := c.validateValues(); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// checkNoNulls rejects a prevResult with null entries, which decode to nil
// pointers that the rest of the plugin would trip over.
func checkNoNulls(r *current.Result) error {
	for i, iface := range r.Interfaces {
		if iface == nil {
			return invalid("prevResult", "interfaces[%d] is null", i)
		}
	}
	for i, ipc := range r.IPs {
		if ipc == nil {
			return invalid("prevResult", "ips[%d] is null", i)
		}
	}
	for i, route := range r.Routes {
		if route == nil {
			return invalid("prevResult", "routes[%d] is null", i)
		}
	}
	return nil
}

// resolveMAC applies the precedence config < args.cni < CNI_ARGS MAC= <
// runtimeConfig.mac (the "mac" capability), most specific last. It returns
// the config's own MAC too: chained wirings keep the per-pod ones off the
// tap (see resolveWiring).
func resolveMAC(nc *NetConf, cniArgs string) (mac, confMAC net.HardwareAddr, err error) {
	var env envArgs
	if cniArgs != "" {
		if err := types.LoadArgs(cniArgs, &env); err != nil {
			return nil, nil, invalidEnv("CNI_ARGS", "%v", err)
		}
	}
	candidates := []struct{ field, value string }{
		{"mac", nc.MAC},
		{"args.cni.mac", nc.Args.CNI.MAC},
		{"CNI_ARGS MAC", string(env.MAC)},
		{"runtimeConfig.mac", nc.RuntimeConfig.MAC},
	}
	for i, cand := range candidates {
		if cand.value == "" {
			continue
		}
		// A bad CNI_ARGS is the runtime's environment, not the config.
		bad := invalid
		if strings.HasPrefix(cand.field, "CNI_ARGS") {
			bad = invalidEnv
		}
		hw, err := net.ParseMAC(cand.value)
		if err != nil || len(hw) != 6 {
			return nil, nil, bad(cand.field, "%q is not an Ethernet MAC address", cand.value)
		}
		if hw[0]&1 != 0 {
			return nil, nil, bad(cand.field, "%q is a multicast address", cand.value)
		}
		if bytes.Equal(hw, make([]byte, 6)) {
			return nil, nil, bad(cand.field, "%q is the all-zero address", cand.value)
		}
		mac = hw
		if i == 0 {
			confMAC = hw
		}
	}
	return mac, confMAC, nil
}

func applyPodArgs(c *Config, a PodArgs) error {
	if a.Queues != nil {
		if *a.Queues < 1 || *a.Queues > MaxQueues {
			return invalid("args.cni.queues", "%d is out of range 1-%d", *a.Queues, MaxQueues)
		}
		c.Queues = *a.Queues
	}
	if a.NAPI != nil {
		c.NAPI = *a.NAPI
	}
	if a.ThreadedNAPI != nil {
		c.ThreadedNAPI = *a.ThreadedNAPI
	}
	if a.GROFlushTimeout != nil {
		c.GROFlushTimeout = a.GROFlushTimeout
	}
	return nil
}

// resolveNodeWiring: with kataDan the tap goes where Kata runtime-rs looks
// a DAN tap up, the node's netns (DESIGN.md fact 18), under a name of its
// attachment's, so that pods of one node never share one, and joins the
// previous plugin's bridge, which is in the node's netns too. A config
// that asks for another wiring or a tap name is refused, except at DEL,
// which then cleans up a tap an older napitap put in the pod's netns.
func (c *Config) resolveNodeWiring(att Attachment, tapName string) error {
	if c.KataDanDir == "" || (att.ForDelete && c.Wiring != "" && c.Wiring != WiringNodeBridge) {
		return nil
	}
	switch {
	case c.Wiring != "" && c.Wiring != WiringNodeBridge:
		return invalid("wiring", "%q cannot reach a tap in the node's netns: with kataDan the tap is there, where Kata runtime-rs looks for it, and joins the previous plugin's bridge (%q, the default)", c.Wiring, WiringNodeBridge)
	case tapName != "" && !att.ForDelete:
		return invalid("tapName", "with kataDan the tap is in the node's netns, and napitap names it per attachment so that pods never share a name there")
	}
	c.WiringGiven = c.Wiring != ""
	c.Wiring, c.NodeTap = WiringNodeBridge, true
	c.ifName, c.PeerIfName = att.IfName, att.IfName
	if att.IfName != "" {
		if err := ValidateLinkName(att.IfName); err != nil {
			return invalidEnv("CNI_IFNAME", "%v", err)
		}
	}
	c.MAC = c.confMAC // the pod's own MAC is the guest's, as in chained wirings
	c.TapName = NodeTapName(att.ContainerID, att.IfName)
	return nil
}

// NodeTapName names a tap in the node's netns after its attachment: "ktap"
// and 11 hex digits of a hash of the container ID and interface name.
func NodeTapName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "/" + ifName))
	return fmt.Sprintf("ktap%x", sum[:6])[:15]
}

// resolveWiring picks the wiring mode, the peer interface and the tap name.
func (c *Config) resolveWiring(ifName, tapName string, final bool) error {
	c.ifName = ifName
	if ifName != "" {
		if err := ValidateLinkName(ifName); err != nil {
			return invalidEnv("CNI_IFNAME", "%v", err)
		}
	}
	switch c.Wiring {
	case "":
		c.Wiring = WiringNone
		// In a final result, a chained napitap left its guest NIC entry;
		// a standalone one left only its tap, which looks like a peer.
		chained := c.PrevSandboxInterface() != nil
		if final {
			chained = chained && c.hasGuestEntry()
		}
		if chained {
			c.Wiring = WiringTCRedirect
		}
	case WiringNone, WiringTCRedirect, WiringBridge:
		c.WiringGiven = true
	case WiringNodeBridge:
		return invalid("wiring", "%q is for kataDan, whose tap is in the node's netns", c.Wiring)
	default:
		return invalid("wiring", "%q is unknown (want %s, %s or %s)", c.Wiring, WiringTCRedirect, WiringBridge, WiringNone)
	}
	if c.Wiring != WiringNone {
		c.PeerIfName = ifName
		// A pod's own MAC (Multus' mac, CNI_ARGS MAC=) is the pod
		// interface's, which the previous plugin sets and the guest takes
		// over; on the tap it would clash with the guest in bridge wiring.
		c.MAC = c.confMAC
	}

	c.TapName, c.TapNameGiven = tapName, tapName != ""
	if c.TapName == "" {
		c.TapName = DefaultTapName(ifName, c.Wiring)
	}
	if c.Wiring == WiringBridge && c.Bridge == "" && c.TapName != "" {
		c.Bridge = "br-" + c.TapName
		if len(c.Bridge) > 15 {
			// Truncating would give two long tap names one bridge.
			c.Bridge = fmt.Sprintf("br%08x", fnv32(c.TapName))
		}
	}
	return nil
}

// ContainerID is CNI_CONTAINERID of the attachment the config was loaded for.
func (c *Config) ContainerID() string { return c.containerID }

// PrevSandboxInterface returns the previous result's interface that chained
// wirings join: the one called CNI_IFNAME inside the sandbox, or nil.
func (c *Config) PrevSandboxInterface() *current.Interface {
	if c.PrevResult == nil || c.ifName == "" {
		return nil
	}
	for _, iface := range c.PrevResult.Interfaces {
		if iface.Name == c.ifName && iface.Sandbox != "" && iface.Sandbox != c.containerID {
			return iface
		}
	}
	return nil
}

// hasGuestEntry reports napitap's guest NIC entry in prevResult: named
// CNI_IFNAME, sandbox = the container ID.
func (c *Config) hasGuestEntry() bool {
	for _, iface := range c.PrevResult.Interfaces {
		if iface.Name == c.ifName && c.containerID != "" && iface.Sandbox == c.containerID {
			return true
		}
	}
	return false
}

// RequireAddable checks what only ADD and CHECK need: no two settings fight
// (RequireConsistent), and a chained wiring has the previous plugin's
// interface to join. DEL skips it: old spec versions send DEL without
// prevResult, a config written before a rule existed must still be
// deletable, and DEL must clean up anyway.
func (c *Config) RequireAddable() error {
	if err := c.RequireConsistent(); err != nil {
		return err
	}
	return c.requirePeer()
}

// RequireConsistent checks that no two settings fight, which needs no
// prevResult: STATUS asks it too, so that a config no ADD could take is
// reported before a pod needs it.
func (c *Config) RequireConsistent() error {
	if c.HandoffMode == HandoffFDs && c.Queues > handoff.MaxFDs {
		return fdsQueuesError(c.Queues)
	}
	// runtime-rs opens the tap by name: queues napitapd held as well would
	// take traffic nobody reads (DESIGN.md fact 7).
	if c.KataDanDir != "" && c.HandoffMode == HandoffFDs {
		return invalid("kataDan", `needs "handoff": {"mode": "intercept"} (or "off"): Kata opens the tap itself`)
	}
	// Each TUNSETIFF rewrites the device's IFF_VNET_HDR from the caller's
	// flags, and libvirt always sets it (DESIGN.md fact 11).
	if !c.VnetHdr && c.RuntimeOpensByName() {
		return invalid("vnetHdr", "false cannot hold with \"handoff\" mode %q: the runtime opens the tap by name and its TUNSETIFF decides IFF_VNET_HDR", c.HandoffMode)
	}
	return nil
}

// KernelNeeds lists what the config asks of the kernel, each with the
// field that asks, for STATUS, ADD and CHECK to probe (tapsetup.RequireKernel).
// Only what the config sets: CHECK must not fail on a knob it leaves alone.
func (c *Config) KernelNeeds() []tapsetup.KernelNeed {
	var needs []tapsetup.KernelNeed
	add := func(on bool, n tapsetup.KernelNeed) {
		if on {
			needs = append(needs, n)
		}
	}
	add(c.Queues > 1, tapsetup.KernelNeed{Field: "queues", Feature: unix.IFF_MULTI_QUEUE, What: "IFF_MULTI_QUEUE (Linux 3.8+)", Fix: "use 1 queue"})
	add(c.VnetHdr, tapsetup.KernelNeed{Field: "vnetHdr", Feature: unix.IFF_VNET_HDR, What: "IFF_VNET_HDR"})
	add(c.NAPI, tapsetup.KernelNeed{Field: "napi", Feature: unix.IFF_NAPI, What: "IFF_NAPI (Linux 4.15+)", Fix: `set "napi": false for plain queues`})
	add(c.NAPIFrags, tapsetup.KernelNeed{Field: "napiFrags", Feature: unix.IFF_NAPI_FRAGS, What: "IFF_NAPI_FRAGS (Linux 4.15+)", Fix: `leave "napiFrags" out`})
	add(c.ThreadedNAPI, tapsetup.KernelNeed{Field: "threadedNapi", Attr: "threaded", What: "threaded NAPI (Linux 5.12+)",
		Fix: `set "threadedNapi": false (it is on by default with "napi")`})
	add(c.GROFlushTimeout != nil, tapsetup.KernelNeed{Field: "groFlushTimeout", Attr: "gro_flush_timeout", What: "gro_flush_timeout (Linux 3.19+)", Fix: `leave "groFlushTimeout" out`})
	add(c.NAPIDeferHardIRQs != nil, tapsetup.KernelNeed{Field: "napiDeferHardIrqs", Attr: "napi_defer_hard_irqs", What: "napi_defer_hard_irqs (Linux 5.10+)", Fix: `leave "napiDeferHardIrqs" out`})
	return needs
}

// RuntimeOpensByName: the runtime attaches the tap's queues itself, so the
// queue count and IFF_VNET_HDR are its own, not the config's.
func (c *Config) RuntimeOpensByName() bool { return c.HandoffMode != HandoffFDs }

func (c *Config) requirePeer() error {
	if c.Wiring == WiringNone {
		return nil
	}
	if c.PrevResult == nil && c.NodeTap {
		return invalid("kataDan", "needs a prevResult: chain napitap after the bridge plugin, whose bridge in the node's netns the tap joins")
	}
	if c.PrevResult == nil {
		return invalid("wiring", "%q needs a prevResult: chain napitap after an interface plugin such as bridge or ptp", c.Wiring)
	}
	if c.PrevSandboxInterface() == nil {
		return invalid("prevResult", "has no interface %q in the sandbox for wiring %q", c.ifName, c.Wiring)
	}
	return nil
}

// DefaultTapName names the tap when the config does not. Without wiring the
// tap is the pod interface itself. Chained, CNI_IFNAME belongs to the
// previous plugin, so follow KubeVirt: "tap" + the name minus its first
// three letters (net1 -> tap1, pod<11 hex> -> tap<11 hex>, eth0 -> tap0).
func DefaultTapName(ifName, wiring string) string {
	if wiring == WiringNone {
		return ifName
	}
	name := "tap" + ifName
	if len(ifName) > 3 {
		name = "tap" + ifName[3:]
	}
	if ifName == "" {
		return ""
	}
	if name == ifName || len(name) > 15 {
		name = fmt.Sprintf("tap%08x", fnv32(ifName))
	}
	return name
}

// fdsQueuesError: fds mode hands the queues over in one message.
func fdsQueuesError(queues int) error {
	return invalid("queues", "%d is out of range 1-%d in \"handoff\" mode %q: one message carries at most %d fds; use \"handoff\": {\"mode\": %q} (up to %d) or fewer", queues, handoff.MaxFDs, HandoffFDs, handoff.MaxFDs, HandoffIntercept, MaxQueues)
}

// validateValues checks what ADD and CHECK act on.
func (c *Config) validateValues() error {
	if c.Queues < 1 || c.Queues > MaxQueues {
		if c.HandoffMode == HandoffFDs {
			return fdsQueuesError(c.Queues)
		}
		return invalid("queues", "%d is out of range 1-%d", c.Queues, MaxQueues)
	}
	if c.NAPIFrags && !c.NAPI {
		return invalid("napiFrags", "requires napi")
	}
	if c.ThreadedNAPI && !c.NAPI {
		return invalid("threadedNapi", "requires napi: a tap without NAPI has nothing to thread")
	}
	if c.VnetHdrSize != 10 && c.VnetHdrSize != 12 {
		return invalid("vnetHdrSize", "%d is not 10 or 12", c.VnetHdrSize)
	}
	if c.MTU != 0 && (c.MTU < minMTU || c.MTU > maxMTU) {
		return invalid("mtu", "%d is out of range %d-%d", c.MTU, minMTU, maxMTU)
	}
	if c.NAPIDeferHardIRQs != nil && *c.NAPIDeferHardIRQs > math.MaxInt32 {
		return invalid("napiDeferHardIrqs", "%d is above the kernel's limit %d", *c.NAPIDeferHardIRQs, math.MaxInt32)
	}
	if c.TxQueueLen != nil && (*c.TxQueueLen < 0 || *c.TxQueueLen > math.MaxInt32) {
		return invalid("txQueueLen", "%d is out of range 0-%d", *c.TxQueueLen, math.MaxInt32)
	}
	if c.RootQdisc != RootQdiscNoqueue && c.RootQdisc != RootQdiscMQ {
		return invalid("rootQdisc", "%q is not %q or %q (the kernel's default)", c.RootQdisc, RootQdiscNoqueue, RootQdiscMQ)
	}
	if c.Owner != nil && *c.Owner == uidInvalid {
		return invalid("owner", "%d is not a valid uid", *c.Owner)
	}
	if c.Group != nil && *c.Group == uidInvalid {
		return invalid("group", "%d is not a valid gid", *c.Group)
	}
	if c.IPAM.Type != "" && c.Wiring != WiringNone {
		return invalid("ipam", "only applies to wiring %q; chained wirings take addresses from prevResult", WiringNone)
	}
	// DEL deletes marked links of such names as what a killed ADD left.
	// Not checked for DEL itself, which must clean up after any config.
	if c.TapNameGiven && tapsetup.IsTempName(c.TapName) {
		return invalid("tapName", "%q: names starting with \"napi~\" are napitap's own, for links it is still setting up", c.TapName)
	}
	if c.BridgeGiven && tapsetup.IsTempName(c.Bridge) {
		return invalid("bridge", "%q: names starting with \"napi~\" are napitap's own, for links it is still setting up", c.Bridge)
	}
	return nil
}

// validateNames checks the names every verb acts on, DEL included: a bad
// name must never reach the kernel or match a link napitap did not make.
func (c *Config) validateNames() error {
	// GC and STATUS carry no CNI_IFNAME, so no tap name either.
	if c.TapName != "" {
		if err := ValidateLinkName(c.TapName); err != nil {
			return invalid("tapName", "%v", err)
		}
	}
	if c.PeerIfName != "" && c.TapName == c.PeerIfName {
		return invalid("tapName", "%q is the chained interface itself", c.TapName)
	}
	if c.Bridge != "" {
		if c.Wiring != WiringBridge {
			return invalid("bridge", "only applies to wiring %q", WiringBridge)
		}
		if err := ValidateLinkName(c.Bridge); err != nil {
			return invalid("bridge", "%v", err)
		}
		if c.Bridge == c.TapName || c.Bridge == c.PeerIfName {
			return invalid("bridge", "%q clashes with another interface of this attachment", c.Bridge)
		}
	}
	return nil
}

// ValidateLinkName is tapsetup.ValidateLinkName, for config callers.
func ValidateLinkName(name string) error { return tapsetup.ValidateLinkName(name) }

// decodeError turns a JSON error into a CNI error naming the field when the
// JSON is well formed but a value has the wrong type.
func decodeError(err error) error {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		// Fields of the embedded types.PluginConf come prefixed with its name.
		field := strings.TrimPrefix(typeErr.Field, "PluginConf.")
		return invalid(field, "must be %s, not a JSON %s", describeType(typeErr.Type.String()), typeErr.Value)
	}
	return types.NewError(types.ErrDecodingFailure, fmt.Sprintf("network config: %v", err), "")
}

func describeType(goType string) string {
	goType = strings.TrimPrefix(goType, "*")
	switch {
	case goType == "bool":
		return "a boolean"
	case goType == "string":
		return "a string"
	case strings.HasPrefix(goType, "uint"):
		return "a non-negative integer"
	case strings.HasPrefix(goType, "int"):
		return "an integer"
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	}
	return "an object"
}

// ErrCheckDrift is napitap's CNI error code (the spec leaves 100 and up
// to plugins) for a CHECK that found the tap or its wiring other than ADD
// left them.
const ErrCheckDrift uint = 100

func invalid(field, format string, a ...any) error {
	return types.NewError(types.ErrInvalidNetworkConfig, field+": "+fmt.Sprintf(format, a...), "")
}

func invalidEnv(variable, format string, a ...any) error {
	return types.NewError(types.ErrInvalidEnvironmentVariables, variable+": "+fmt.Sprintf(format, a...), "")
}

func valueOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func fnv32(s string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return h.Sum32()
}
