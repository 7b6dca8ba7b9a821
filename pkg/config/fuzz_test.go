package config_test

import (
	"bytes"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/napitap/napitap/pkg/config"
)

// The attachment every fuzzed Load runs for, besides the fuzzed CNI_ARGS,
// CNI_IFNAME and final-result flag. Seeds use the same sandbox and ID.
const (
	fuzzContainerID = "napitap-fuzz-0123"
	fuzzNetns       = "/run/netns/napitap-fuzz"
)

// fuzzSeeds are good and bad configs with the rest of the attachment: the
// bad inputs of plugins/napitap/badinput_test.go, and valid configs of every
// wiring, prevResult shape, per-pod override, hand-off and kataDan form.
var fuzzSeeds = []struct {
	stdin, cniArgs, ifName string
	final                  bool
}{
	// Valid: standalone, chained in every wiring, CHECK/DEL's final result,
	// STATUS/GC without an interface.
	{`{"cniVersion":"1.1.0","name":"n","type":"napitap"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","queues":256,"napi":true,"napiFrags":true,"threadedNapi":true,"groFlushTimeout":200000,"napiDeferHardIrqs":2,"vnetHdr":false,"vnetHdrSize":10,"mtu":9000,"mac":"02:00:00:00:00:01","txQueueLen":1000,"rootQdisc":"mq","owner":107,"group":107,"tapName":"vmtap","wiring":"none","ipam":{"type":"host-local","subnet":"10.1.0.0/24"},"dns":{"nameservers":["10.1.0.1"]}}`, "", "net1", false},
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","queues":4,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"br0","mac":"02:00:00:00:00:aa"},{"name":"eth0","mac":"02:00:00:00:00:bb","sandbox":"/run/netns/napitap-fuzz"}],"ips":[{"address":"10.1.0.2/24","gateway":"10.1.0.1","interface":1}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.0.1"}]}}`, "", "eth0", false},
	{`{"cniVersion":"1.1.0","name":"n","type":"napitap","wiring":"bridge","bridge":"br-vm","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"net1","mac":"02:00:00:00:00:bb","sandbox":"/run/netns/napitap-fuzz"}]}}`, "", "net1", false},
	{`{"cniVersion":"1.1.0","name":"n","type":"napitap","wiring":"tc-redirect","tapName":"tapvm","prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"pod0123456789a","sandbox":"/run/netns/napitap-fuzz"}]}}`, "", "pod0123456789a", false},
	{`{"cniVersion":"0.4.0","name":"n","type":"napitap","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"}],"ips":[{"version":"4","address":"10.1.0.2/24","interface":0}]}}`, "", "eth0", false},
	{`{"cniVersion":"0.3.1","name":"n","type":"napitap","prevResult":{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"}]}}`, "", "eth0", false},
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"},{"name":"tap0","sandbox":"/run/netns/napitap-fuzz"},{"name":"eth0","mac":"02:00:00:00:00:bb","sandbox":"napitap-fuzz-0123"}]}}`, "", "eth0", true},
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"tap0","sandbox":"/run/netns/napitap-fuzz"}]}}`, "", "tap0", true},
	{`{"cniVersion":"0.3.0","name":"n","type":"napitap","wiring":"bridge"}`, "", "net1", true},
	{`{"cniVersion":"1.1.0","name":"n","type":"napitap","cni.dev/valid-attachments":[{"containerID":"a","ifname":"net1"}],"kataDan":{"enabled":true}}`, "", "", false},
	{`{"cniVersion":"1.1.0","name":"n","type":"napitap","wiring":"bridge"}`, "", "", false},
	// Explicit nulls, as Go marshals nil pointers, maps and slices.
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","queues":null,"mac":null,"ipam":null,"dns":null,"args":null,"runtimeConfig":null,"handoff":null,"kataDan":null,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"}],"ips":null,"routes":null,"dns":null}}`, "", "eth0", false},
	// Per-pod overrides and the MAC's four sources.
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","queues":1,"mac":"02:00:00:00:00:0a","args":{"cni":{"queues":8,"napi":true,"threadedNapi":true,"groFlushTimeout":1,"mac":"02:00:00:00:00:0b"}},"runtimeConfig":{"mac":"02:00:00:00:00:0c"},"capabilities":{"mac":true}}`, "IgnoreUnknown=1;MAC=02:00:00:00:00:0d;K8S_POD_NAME=vm", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","mac":"02:00:00:00:00:0a","runtimeConfig":{"mac":"02:00:00:00:00:0c"},"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"}]}}`, "IgnoreUnknown=true;MAC=02:00:00:00:00:0d", "eth0", false},
	// Hand-off and kataDan.
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","handoff":{"socket":"/run/napitap/other.sock","required":true},"kataDan":{"enabled":true,"dir":"/run/kata-containers/dans","queueSize":1024}}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n","type":"napitap","handoff":{"disabled":true},"kataDan":{"enabled":false,"dir":"relative"}}`, "", "tap0", false},

	// Bad: malformed JSON.
	{``, "", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n"`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n"} x`, "", "tap0", false},
	{`{'cniVersion':'1.0.0'}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","queues":NaN}`, "", "tap0", false},
	{`[{"cniVersion":"1.0.0"}]`, "", "tap0", false},
	{`null`, "", "tap0", false},
	{"\xff\xfe{\"cniVersion\":\"1.0.0\"}", "", "tap0", false},
	// Bad: versions and types.
	{`{"cniVersion":"0.2.0","name":"n"}`, "", "tap0", false},
	{`{"cniVersion":"2.0.0","name":"n"}`, "", "tap0", false},
	{`{"name":"n"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","queues":"4","napi":"yes","mtu":"1500"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","owner":-1,"group":1.5,"tapName":5,"wiring":3}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","handoff":{"socket":5,"required":"yes"},"kataDan":{"dir":5}}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","args":{"cni":{"queues":"8","napi":1,"mac":5}},"runtimeConfig":{"mac":5},"ipam":"x"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","prevResult":5}`, "", "eth0", false},
	// Bad: values.
	{`{"cniVersion":"1.0.0","queues":257,"vnetHdrSize":11,"mtu":67}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","queues":0}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","napi":false,"napiFrags":true}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","threadedNapi":true,"args":{"cni":{"napi":false}}}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","mtu":65522,"txQueueLen":-1,"napiDeferHardIrqs":2147483648}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","owner":4294967295}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","rootQdisc":"pfifo_fast"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","rootQdisc":["noqueue"]}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","tapName":"tap0123456789abc"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","tapName":"tap\u00000"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","tapName":"tap%d"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","mac":"01:00:5e:00:00:01"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","mac":"00:00:00:00:00:00"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","mac":"02:00:00:00:00:00:00:01"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","wiring":"macvtap"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","wiring":"none","bridge":"br0"}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","wiring":"bridge","bridge":"br-0123456789abc","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"}]}}`, "", "eth0", false},
	{`{"cniVersion":"1.0.0","ipam":{"type":"host-local"},"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/run/netns/napitap-fuzz"}]}}`, "", "eth0", false},
	{`{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","interfaces":"eth0"}}`, "", "eth0", false},
	{`{"cniVersion":"1.0.0","prevResult":{"cniVersion":"1.0.0","ips":[{"address":"10.1.0.2"}]}}`, "", "eth0", false},
	{`{"cniVersion":"1.0.0","handoff":{"socket":"run/x.sock"}}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","handoff":{"required":true,"disabled":true}}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","kataDan":{"enabled":true,"dir":"kata"}}`, "", "tap0", false},
	{`{"cniVersion":"1.0.0","kataDan":{"enabled":true,"queueSize":3}}`, "", "tap0", false},
	// Bad: the runtime's variables.
	{`{"cniVersion":"1.0.0","name":"n"}`, "IgnoreUnknown", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n"}`, "K8S_POD_NAME=vm", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n"}`, "IgnoreUnknown=1;MAC=zz", "tap0", false},
	{`{"cniVersion":"1.0.0","name":"n"}`, "", "eth0123456789abc", false},
	{`{"cniVersion":"1.0.0","name":"n"}`, "", "eth%d", false},
	{`{"cniVersion":"1.0.0","name":"n"}`, "", "..", false},
}

// FuzzLoad: whatever the runtime passes, Load does not panic; a config it
// accepts is one the plugin can act on, and a rejection is a CNI error of
// code 4, 6 or 7 with a message.
func FuzzLoad(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s.stdin), s.cniArgs, s.ifName, s.final)
	}
	f.Fuzz(func(t *testing.T, stdin []byte, cniArgs, ifName string, final bool) {
		att := config.Attachment{ContainerID: fuzzContainerID, IfName: ifName, CNIArgs: cniArgs, FinalResult: final}
		c, err := config.Load(slices.Clone(stdin), att)
		if err != nil {
			if c != nil {
				t.Errorf("Load returned a config and the error %v", err)
			}
			checkRejection(t, err)
			return
		}
		if c == nil {
			t.Fatal("Load returned neither a config nor an error")
		}
		checkConfig(t, c, ifName)

		again, err := config.Load(slices.Clone(stdin), att)
		if err != nil || !reflect.DeepEqual(c, again) {
			t.Errorf("a second Load of the same input gave %+v, %v; the first gave %+v", again, err, c)
		}
	})
}

func checkRejection(t *testing.T, err error) {
	t.Helper()
	cniErr, ok := err.(*types.Error)
	if !ok {
		t.Fatalf("error %v is a %T, want a *types.Error", err, err)
	}
	switch cniErr.Code {
	case types.ErrInvalidEnvironmentVariables, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig:
	default:
		t.Errorf("error code %d (%q), want 4, 6 or 7", cniErr.Code, cniErr.Msg)
	}
	// Every message starts with what is at fault: "queues: ...".
	if i := strings.Index(cniErr.Msg, ": "); i <= 0 {
		t.Errorf("error message %q does not start with the field or variable at fault", cniErr.Msg)
	}
}

// checkConfig holds a loaded config to what the plugin relies on.
func checkConfig(t *testing.T, c *config.Config, ifName string) {
	t.Helper()
	if !slices.Contains(config.SupportedVersions, c.CNIVersion) {
		t.Errorf("CNIVersion %q is not supported", c.CNIVersion)
	}
	if c.Queues < 1 || c.Queues > config.MaxQueues {
		t.Errorf("Queues %d, want 1-%d", c.Queues, config.MaxQueues)
	}
	if c.TapName != "" {
		if err := config.ValidateLinkName(c.TapName); err != nil {
			t.Errorf("TapName %q: %v", c.TapName, err)
		}
	} else if ifName != "" {
		t.Errorf("no TapName for CNI_IFNAME %q", ifName)
	}
	if c.VnetHdrSize != 10 && c.VnetHdrSize != 12 {
		t.Errorf("VnetHdrSize %d, want 10 or 12", c.VnetHdrSize)
	}
	if c.NAPIFrags && !c.NAPI {
		t.Error("NAPIFrags without NAPI")
	}
	if c.ThreadedNAPI && !c.NAPI {
		t.Error("ThreadedNAPI without NAPI")
	}
	if c.RootQdisc != config.RootQdiscNoqueue && c.RootQdisc != config.RootQdiscMQ {
		t.Errorf("RootQdisc %q, want noqueue or mq", c.RootQdisc)
	}
	if c.MTU != 0 && (c.MTU < 68 || c.MTU > 65521) {
		t.Errorf("MTU %d, want 0 or 68-65521", c.MTU)
	}

	switch c.Wiring {
	case config.WiringNone:
		if c.PeerIfName != "" {
			t.Errorf("wiring none with PeerIfName %q", c.PeerIfName)
		}
	case config.WiringTCRedirect, config.WiringBridge:
		// STATUS and GC carry no CNI_IFNAME, so a chained wiring has no
		// peer to name there; ADD, CHECK and DEL always do.
		if ifName != "" && c.PeerIfName != ifName {
			t.Errorf("wiring %s with PeerIfName %q, want CNI_IFNAME %q", c.Wiring, c.PeerIfName, ifName)
		}
		if c.PeerIfName != "" && c.PeerIfName == c.TapName {
			t.Errorf("the tap %q is the chained interface", c.TapName)
		}
	case config.WiringNodeBridge:
		// kataDan's: a tap in the node's netns named after its attachment.
		if !c.NodeTap || c.KataDanDir == "" || c.TapName != config.NodeTapName(fuzzContainerID, ifName) {
			t.Errorf("wiring %s with NodeTap %v, kataDan dir %q, tap %q", c.Wiring, c.NodeTap, c.KataDanDir, c.TapName)
		}
	default:
		t.Errorf("Wiring %q is none of the four", c.Wiring)
	}
	if c.NodeTap != (c.Wiring == config.WiringNodeBridge) {
		t.Errorf("NodeTap %v with wiring %s", c.NodeTap, c.Wiring)
	}
	if c.Bridge != "" {
		if c.Wiring != config.WiringBridge {
			t.Errorf("Bridge %q with wiring %s", c.Bridge, c.Wiring)
		}
		if err := config.ValidateLinkName(c.Bridge); err != nil || c.Bridge == c.TapName || c.Bridge == c.PeerIfName {
			t.Errorf("Bridge %q (tap %q, peer %q): %v", c.Bridge, c.TapName, c.PeerIfName, err)
		}
	}
	if c.IPAM.Type != "" && c.Wiring != config.WiringNone {
		t.Errorf("IPAM %q with wiring %s", c.IPAM.Type, c.Wiring)
	}

	if c.MAC != nil {
		if len(c.MAC) != 6 || c.MAC[0]&1 != 0 || bytes.Equal(c.MAC, make(net.HardwareAddr, 6)) {
			t.Errorf("MAC %s, want a unicast, non-zero Ethernet address", c.MAC)
		}
	}
	if c.HandoffSocket != "" && !strings.HasPrefix(c.HandoffSocket, "/") {
		t.Errorf("HandoffSocket %q is relative", c.HandoffSocket)
	}
	if c.HandoffRequired && c.HandoffSocket == "" {
		t.Error("a required hand-off without a socket")
	}
	if c.KataDanDir != "" && !strings.HasPrefix(c.KataDanDir, "/") {
		t.Errorf("KataDanDir %q is relative", c.KataDanDir)
	}
	if q := c.KataDanQueueSize; q != 0 && (q < 2 || q > 32768 || q&(q-1) != 0) {
		t.Errorf("KataDanQueueSize %d, want 0 or a power of two in 2-32768", q)
	}
	if c.NAPIDeferHardIRQs != nil && *c.NAPIDeferHardIRQs > 1<<31-1 {
		t.Errorf("NAPIDeferHardIRQs %d is above the kernel's limit", *c.NAPIDeferHardIRQs)
	}
	if c.TxQueueLen != nil && (*c.TxQueueLen < 0 || *c.TxQueueLen > 1<<31-1) {
		t.Errorf("TxQueueLen %d, want 0-%d", *c.TxQueueLen, 1<<31-1)
	}
	for _, id := range []*uint32{c.Owner, c.Group} {
		if id != nil && *id == 1<<32-1 {
			t.Error("owner or group is (uid_t)-1")
		}
	}
}
