package config_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/napitap/napitap/pkg/config"
)

const (
	containerID = "0123456789abcdef"
	netnsPath   = "/var/run/netns/cni-1234"
)

// conf returns a cniVersion 1.0.0 network config with extra appended to its
// fields; extra is a comma-separated list of JSON members, or "".
func conf(extra string) string {
	return confVersion("1.0.0", extra)
}

func confVersion(version, extra string) string {
	s := fmt.Sprintf(`{"cniVersion":%q,"name":"napinet","type":"napitap"`, version)
	if extra != "" {
		s += "," + extra
	}
	return s + "}"
}

// iface is one interface of a result, in the sandbox when sandbox is set.
func iface(name, sandbox string) string {
	if sandbox == "" {
		return fmt.Sprintf(`{"name":%q,"mac":"02:00:00:00:00:aa"}`, name)
	}
	return fmt.Sprintf(`{"name":%q,"mac":"02:00:00:00:00:bb","sandbox":%q}`, name, sandbox)
}

// prevResult is a "prevResult" member holding a cniVersion 1.0.0 result.
func prevResult(ifaces ...string) string {
	return fmt.Sprintf(`"prevResult":{"cniVersion":"1.0.0","interfaces":[%s],"ips":[]}`, strings.Join(ifaces, ","))
}

func att(ifName string) config.Attachment {
	return config.Attachment{ContainerID: containerID, IfName: ifName}
}

// mustLoad loads stdin for att and fails the test on error.
func mustLoad(t *testing.T, stdin string, a config.Attachment) *config.Config {
	t.Helper()
	c, err := config.Load([]byte(stdin), a)
	if err != nil {
		t.Fatalf("Load(%s) = %v, want no error", stdin, err)
	}
	return c
}

// wantCNIError checks that err is a *types.Error with code whose message
// starts with field.
func wantCNIError(t *testing.T, err error, code uint, field string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want code %d naming %q", code, field)
	}
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("got %T %v, want *types.Error", err, err)
	}
	if e.Code != code {
		t.Errorf("code = %d (%s), want %d", e.Code, e.Msg, code)
	}
	if !strings.HasPrefix(e.Msg, field) {
		t.Errorf("message %q does not start with %q", e.Msg, field)
	}
}

func TestLoadAppliesDefaults(t *testing.T) {
	c := mustLoad(t, conf(""), att("net1"))
	tests := []struct {
		name      string
		got, want any
	}{
		{"queues default to 1", c.Queues, 1},
		{"napi is on by default", c.NAPI, true},
		{"napiFrags is off by default", c.NAPIFrags, false},
		{"threadedNapi follows napi by default", c.ThreadedNAPI, true},
		{"vnetHdr is on by default", c.VnetHdr, true},
		{"vnetHdrSize defaults to 12", c.VnetHdrSize, 12},
		{"mtu defaults to 0, the kernel's choice", c.MTU, 0},
		{"wiring defaults to none without prevResult", c.Wiring, config.WiringNone},
		{"a defaulted wiring is not marked as given", c.WiringGiven, false},
		{"the tap is CNI_IFNAME in none wiring", c.TapName, "net1"},
		{"a defaulted tap name is not marked as given", c.TapNameGiven, false},
		{"there is no peer in none wiring", c.PeerIfName, ""},
		{"there is no bridge in none wiring", c.Bridge, ""},
		{"the cniVersion is kept", c.CNIVersion, "1.0.0"},
		{"the network name is kept", c.Name, "napinet"},
		{"no prevResult means a nil PrevResult", c.PrevResult == nil, true},
		{"no mac means a nil MAC", c.MAC == nil, true},
		{"groFlushTimeout is unset by default", c.GROFlushTimeout == nil, true},
		{"napiDeferHardIrqs is unset by default", c.NAPIDeferHardIRQs == nil, true},
		{"txQueueLen is unset by default", c.TxQueueLen == nil, true},
		{"the root qdisc is noqueue by default", c.RootQdisc, config.RootQdiscNoqueue},
		{"owner is unset by default", c.Owner == nil, true},
		{"group is unset by default", c.Group == nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestLoadKeepsGivenValues(t *testing.T) {
	c := mustLoad(t, conf(`"queues":8,"napi":true,"napiFrags":true,"threadedNapi":true,`+
		`"groFlushTimeout":20000,"napiDeferHardIrqs":2,"vnetHdr":false,"vnetHdrSize":10,"mtu":9000,`+
		`"mac":"02:00:00:00:00:01","txQueueLen":0,"rootQdisc":"mq","owner":0,"group":107,"tapName":"vmtap0"`), att("net1"))
	tests := []struct {
		name      string
		got, want any
	}{
		{"queues are kept", c.Queues, 8},
		{"napiFrags is kept", c.NAPIFrags, true},
		{"threadedNapi is kept", c.ThreadedNAPI, true},
		{"groFlushTimeout is kept", *c.GROFlushTimeout, uint64(20000)},
		{"napiDeferHardIrqs is kept", *c.NAPIDeferHardIRQs, uint32(2)},
		{"vnetHdr false is kept", c.VnetHdr, false},
		{"vnetHdrSize 10 is kept", c.VnetHdrSize, 10},
		{"mtu is kept", c.MTU, 9000},
		{"mac is parsed", c.MAC.String(), "02:00:00:00:00:01"},
		{"a zero txQueueLen is kept, not dropped", *c.TxQueueLen, 0},
		{"the root qdisc mq is kept", c.RootQdisc, config.RootQdiscMQ},
		{"owner 0 (root) is kept, not dropped", *c.Owner, uint32(0)},
		{"group is kept", *c.Group, uint32(107)},
		{"a given tap name is used", c.TapName, "vmtap0"},
		{"a given tap name is marked as given", c.TapNameGiven, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

func TestLoadChecksCNIVersion(t *testing.T) {
	for _, v := range config.SupportedVersions {
		t.Run("cniVersion "+v+" is supported", func(t *testing.T) {
			c := mustLoad(t, confVersion(v, ""), att("net1"))
			if c.CNIVersion != v {
				t.Errorf("CNIVersion = %q, want %q", c.CNIVersion, v)
			}
		})
		t.Run("cniVersion "+v+" parses a prevResult of its own version", func(t *testing.T) {
			prev := fmt.Sprintf(`"prevResult":{"cniVersion":%q,"interfaces":[%s]}`, v, iface("net1", netnsPath))
			c := mustLoad(t, confVersion(v, prev), att("net1"))
			if c.PrevResult == nil || c.Wiring != config.WiringTCRedirect {
				t.Errorf("PrevResult = %v, wiring %q; want a prevResult and tc-redirect", c.PrevResult, c.Wiring)
			}
		})
	}
	want := []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	t.Run("the supported versions are exactly the documented ones", func(t *testing.T) {
		if fmt.Sprint(config.SupportedVersions) != fmt.Sprint(want) {
			t.Errorf("SupportedVersions = %v, want %v", config.SupportedVersions, want)
		}
	})
	for _, v := range []string{"0.1.0", "0.2.0", "1.2.0", "2.0.0", "1.0", "v1.0.0", ""} {
		t.Run(fmt.Sprintf("cniVersion %q is rejected naming the field", v), func(t *testing.T) {
			_, err := config.Load([]byte(confVersion(v, "")), att("net1"))
			wantCNIError(t, err, types.ErrInvalidNetworkConfig, "cniVersion")
		})
	}
	t.Run("a missing cniVersion is rejected naming the field", func(t *testing.T) {
		_, err := config.Load([]byte(`{"name":"napinet","type":"napitap"}`), att("net1"))
		wantCNIError(t, err, types.ErrInvalidNetworkConfig, "cniVersion")
	})
}

func TestLoadRejectsInvalidConfig(t *testing.T) {
	chained := prevResult(iface("net1", netnsPath))
	tests := []struct {
		name   string
		stdin  string
		ifName string
		code   uint
		field  string
	}{
		// Ranges and combinations.
		{"zero queues are rejected naming the field", conf(`"queues":0`), "net1", 7, "queues"},
		{"queues above 256 are rejected naming the field", conf(`"queues":257`), "net1", 7, "queues"},
		{"negative queues are rejected naming the field", conf(`"queues":-1`), "net1", 7, "queues"},
		{"napiFrags without napi is rejected naming napiFrags", conf(`"napi":false,"napiFrags":true`), "net1", 7, "napiFrags"},
		{"a vnetHdrSize of 11 is rejected naming the field", conf(`"vnetHdrSize":11`), "net1", 7, "vnetHdrSize"},
		{"a vnetHdrSize of 0 is rejected naming the field", conf(`"vnetHdrSize":0`), "net1", 7, "vnetHdrSize"},
		{"an mtu of 67 is rejected naming the field", conf(`"mtu":67`), "net1", 7, "mtu"},
		{"an mtu of 65522 is rejected naming the field", conf(`"mtu":65522`), "net1", 7, "mtu"},
		{"a negative mtu is rejected naming the field", conf(`"mtu":-1`), "net1", 7, "mtu"},
		{"a negative txQueueLen is rejected naming the field", conf(`"txQueueLen":-1`), "net1", 7, "txQueueLen"},
		{"a root qdisc other than noqueue or mq is rejected naming the field", conf(`"rootQdisc":"fq_codel"`), "net1", 7, "rootQdisc"},
		{"a root qdisc in the wrong case is rejected naming the field", conf(`"rootQdisc":"NoQueue"`), "net1", 7, "rootQdisc"},
		{"owner 4294967295 ((uid_t)-1) is rejected naming the field", conf(`"owner":4294967295`), "net1", 7, "owner"},
		{"group 4294967295 ((gid_t)-1) is rejected naming the field", conf(`"group":4294967295`), "net1", 7, "group"},
		{"a negative owner is rejected naming the field", conf(`"owner":-1`), "net1", 7, "owner"},
		{"a negative group is rejected naming the field", conf(`"group":-1`), "net1", 7, "group"},
		{"an owner beyond 32 bits is rejected naming the field", conf(`"owner":4294967296`), "net1", 7, "owner"},

		// MAC addresses.
		{"a mac that is not an address is rejected naming the field", conf(`"mac":"not-a-mac"`), "net1", 7, "mac"},
		{"a 5-byte mac is rejected naming the field", conf(`"mac":"02:00:00:00:01"`), "net1", 7, "mac"},
		{"an EUI-64 mac is rejected naming the field", conf(`"mac":"02:00:00:00:00:00:00:01"`), "net1", 7, "mac"},
		{"a multicast mac is rejected naming the field", conf(`"mac":"01:00:5e:00:00:01"`), "net1", 7, "mac"},
		{"the broadcast mac is rejected naming the field", conf(`"mac":"ff:ff:ff:ff:ff:ff"`), "net1", 7, "mac"},

		// Tap and bridge names.
		{"a 16-byte tapName is rejected naming the field", conf(`"tapName":"abcdefghijklmnop"`), "net1", 7, "tapName"},
		{"a tapName with '/' is rejected naming the field", conf(`"tapName":"tap/0"`), "net1", 7, "tapName"},
		{"a tapName with ':' is rejected naming the field", conf(`"tapName":"tap:0"`), "net1", 7, "tapName"},
		{"the tapName '..' is rejected naming the field", conf(`"tapName":".."`), "net1", 7, "tapName"},
		{"the tapName '.' is rejected naming the field", conf(`"tapName":"."`), "net1", 7, "tapName"},
		{"a tapName with a space is rejected naming the field", conf(`"tapName":"tap 0"`), "net1", 7, "tapName"},
		{"a tapName with a tab is rejected naming the field", conf(`"tapName":"tap\t0"`), "net1", 7, "tapName"},
		{"a tapName with '%' is rejected naming the field", conf(`"tapName":"tap%d"`), "net1", 7, "tapName"},
		{"a tapName equal to the chained interface is rejected naming the field", conf(chained + `,"tapName":"net1"`), "net1", 7, "tapName"},
		{"a bridge name that is too long is rejected naming bridge", conf(`"wiring":"bridge","bridge":"bridge-too-long-"`), "net1", 7, "bridge"},
		{"a bridge named like the tap is rejected naming bridge", conf(`"wiring":"bridge","bridge":"tap1"`), "net1", 7, "bridge"},
		{"a bridge named like the chained interface is rejected naming bridge", conf(`"wiring":"bridge","bridge":"net1"`), "net1", 7, "bridge"},

		// Wiring.
		{"an unknown wiring is rejected naming the field", conf(`"wiring":"macvtap"`), "net1", 7, "wiring"},
		{"a wiring in the wrong case is rejected naming the field", conf(`"wiring":"Bridge"`), "net1", 7, "wiring"},
		{"ipam with tc-redirect wiring is rejected naming ipam", conf(`"wiring":"tc-redirect","ipam":{"type":"host-local"}`), "net1", 7, "ipam"},
		{"ipam with bridge wiring is rejected naming ipam", conf(`"wiring":"bridge","ipam":{"type":"host-local"}`), "net1", 7, "ipam"},
		{"ipam with a wiring chosen from prevResult is rejected naming ipam", conf(chained + `,"ipam":{"type":"host-local"}`), "net1", 7, "ipam"},
		{"a bridge field without bridge wiring is rejected naming bridge", conf(`"bridge":"br0"`), "net1", 7, "bridge"},
		{"a bridge field with tc-redirect wiring is rejected naming bridge", conf(`"wiring":"tc-redirect","bridge":"br0"`), "net1", 7, "bridge"},

		// Wrong JSON types name the field.
		{"napi as a string is rejected naming the field", conf(`"napi":"yes"`), "net1", 7, "napi"},
		{"napiFrags as a number is rejected naming the field", conf(`"napiFrags":1`), "net1", 7, "napiFrags"},
		{"threadedNapi as a string is rejected naming the field", conf(`"threadedNapi":"true"`), "net1", 7, "threadedNapi"},
		{"vnetHdr as a string is rejected naming the field", conf(`"vnetHdr":"true"`), "net1", 7, "vnetHdr"},
		{"queues as a string is rejected naming the field", conf(`"queues":"4"`), "net1", 7, "queues"},
		{"fractional queues are rejected naming the field", conf(`"queues":2.5`), "net1", 7, "queues"},
		{"mtu as a string is rejected naming the field", conf(`"mtu":"1500"`), "net1", 7, "mtu"},
		{"a negative groFlushTimeout is rejected naming the field", conf(`"groFlushTimeout":-1`), "net1", 7, "groFlushTimeout"},
		{"a negative napiDeferHardIrqs is rejected naming the field", conf(`"napiDeferHardIrqs":-1`), "net1", 7, "napiDeferHardIrqs"},
		{"mac as a number is rejected naming the field", conf(`"mac":5`), "net1", 7, "mac"},
		{"tapName as a number is rejected naming the field", conf(`"tapName":5`), "net1", 7, "tapName"},
		{"rootQdisc as a number is rejected naming the field", conf(`"rootQdisc":0`), "net1", 7, "rootQdisc"},
		{"wiring as a boolean is rejected naming the field", conf(`"wiring":true`), "net1", 7, "wiring"},
		{"runtimeConfig.mac as a number is rejected naming the field", conf(`"runtimeConfig":{"mac":5}`), "net1", 7, "runtimeConfig.mac"},

		// Undecodable JSON.
		{"truncated JSON is a decoding failure", `{"cniVersion":"1.0.0",`, "net1", 6, "network config"},
		{"empty stdin is a decoding failure", ``, "net1", 6, "network config"},
		{"a JSON array is a decoding failure", `[]`, "net1", 6, "network config"},
		{"a JSON string is a decoding failure", `"napitap"`, "net1", 6, "network config"},
		{"a missing value is a decoding failure", `{"cniVersion":"1.0.0","queues":}`, "net1", 6, "network config"},

		// CNI_ environment.
		{"a CNI_IFNAME with '/' is an environment error", conf(""), "net/1", 4, "CNI_IFNAME"},
		{"a CNI_IFNAME longer than 15 bytes is an environment error", conf(""), "abcdefghijklmnop", 4, "CNI_IFNAME"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Load([]byte(tt.stdin), att(tt.ifName))
			if c != nil {
				t.Errorf("got a config alongside error %v", err)
			}
			wantCNIError(t, err, tt.code, tt.field)
		})
	}
}

// A pod's cni-args typo would run with the network's value: a key one or
// two edits from one of napitap's per-pod keys is refused, naming the one
// meant; any other key is left to the chain's other plugins, as CNI's
// conventions ask.
func TestLoadRefusesMisspeltPodArgsAndPassesOthers(t *testing.T) {
	tests := []struct {
		name, args, field, want string // field "": accepted
	}{
		{"a misspelt queues is refused with the right spelling", `"queus":8`, "args.cni.queus", `did you mean "queues"?`},
		{"threadedNapi in the wrong case is refused", `"threadedNAPI":false`, "args.cni.threadedNAPI", `did you mean "threadedNapi"?`},
		{"a groFlushTimeout missing a letter is refused", `"groFlushTimeot":50000`, "args.cni.groFlushTimeot", `did you mean "groFlushTimeout"?`},
		{"the ips of CNI's conventions pass to other plugins", `"ips":["10.1.1.5/24"]`, "", ""},
		{"a key of another plugin far from napitap's passes", `"vlanTrunk":"100-200"`, "", ""},
		{"napitap's own keys pass", `"queues":8,"napi":true,"threadedNapi":true,"groFlushTimeout":50000,"mac":"02:00:00:00:00:01"`, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load([]byte(conf(`"args":{"cni":{`+tt.args+`}}`)), att("net1"))
			if tt.field == "" {
				if err != nil {
					t.Fatalf("Load: %v, want it accepted", err)
				}
				return
			}
			wantCNIError(t, err, types.ErrInvalidNetworkConfig, tt.field)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load: %v, want it to say %q", err, tt.want)
			}
		})
	}
}

// A typo in a key would run with the default; it is refused, naming the
// key and the one that was meant.
func TestLoadRefusesUnknownKeys(t *testing.T) {
	tests := []struct {
		name, extra, field, want string
	}{
		{"a misspelt queues is refused with the right spelling", `"queus":4`, "queus", `did you mean "queues"?`},
		{"the tap plugin's multiQueue is refused with napitap's queues", `"multiQueue":true`, "multiQueue", `the reference tap plugin's; napitap takes "queues", a count`},
		{"the tap plugin's selinuxContext is refused saying napitap takes none", `"selinuxContext":"system_u:system_r:container_t:s0"`, "selinuxContext", "the reference tap plugin's"},
		{"a handoff with two letters swapped is refused", `"hadnoff":{"mode":"intercept"}`, "hadnoff", `did you mean "handoff"?`},
		{"a key in the wrong case is refused with its case", `"Queues":4`, "Queues", `did you mean "queues"?`},
		{"a misspelt key inside handoff is refused naming its path", `"handoff":{"mdoe":"intercept"}`, "handoff.mdoe", `did you mean "mode"?`},
		{"a misspelt key inside kataDan is refused naming its path", `"kataDan":{"enabeld":true}`, "kataDan.enabeld", `did you mean "enabled"?`},
		{"a key like no other is refused listing the known ones", `"someFutureKnob":1`, "someFutureKnob", "known: args, bridge,"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load([]byte(conf(tt.extra)), att("net1"))
			wantCNIError(t, err, types.ErrInvalidNetworkConfig, tt.field)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load: %v, want it to say %s", err, tt.want)
			}
		})
	}
}

func TestLoadAcceptsBoundaryValues(t *testing.T) {
	tests := []struct {
		name  string
		extra string
	}{
		{"one queue is accepted", `"queues":1`},
		{"256 queues are accepted", `"queues":256`},
		{"an mtu of 68 is accepted", `"mtu":68`},
		{"an mtu of 65521 is accepted", `"mtu":65521`},
		{"an explicit mtu of 0 is accepted as the kernel default", `"mtu":0`},
		{"a vnetHdrSize of 10 is accepted", `"vnetHdrSize":10`},
		{"the root qdisc noqueue is accepted", `"rootQdisc":"noqueue"`},
		{"the root qdisc mq on a single-queue tap is accepted as the kernel's default", `"queues":1,"rootQdisc":"mq"`},
		{"napiFrags with napi is accepted", `"napi":true,"napiFrags":true`},
		{"napi off without napiFrags is accepted", `"napi":false`},
		{"owner 4294967294 is accepted", `"owner":4294967294`},
		{"a 15-byte tapName is accepted", `"tapName":"abcdefghijklmno"`},
		{"ipam with none wiring is accepted", `"wiring":"none","ipam":{"type":"host-local"}`},
		{"ipam with defaulted wiring is accepted", `"ipam":{"type":"host-local"}`},
		{"a bridge field with bridge wiring is accepted", `"wiring":"bridge","bridge":"br0"`},
		{"null knobs fall back to defaults", `"queues":null,"napi":null`},
		{"the keys runtimes add, and namespaced ones, are accepted", `"capabilities":{"mac":true},"runtimeConfig":{"portMappings":[]},"args":{"cni":{"queues":2},"k8s":{"x":1}},"example.com/knob":1`},
		{"a unicast mac in dash notation is accepted", `"mac":"02-00-00-00-00-01"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mustLoad(t, conf(tt.extra), att("net1"))
		})
	}
}

func TestLoadChecksCNIArgs(t *testing.T) {
	tests := []struct {
		name    string
		cniArgs string
		wantErr bool
	}{
		{"Kubernetes-style CNI_ARGS with IgnoreUnknown are accepted", "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=x", false},
		{"empty CNI_ARGS are accepted", "", false},
		{"CNI_ARGS that are not key=value pairs are an environment error", "garbage", true},
		{"unknown CNI_ARGS keys without IgnoreUnknown are an environment error", "K8S_POD_NAME=x", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := att("net1")
			a.CNIArgs = tt.cniArgs
			_, err := config.Load([]byte(conf("")), a)
			if !tt.wantErr {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			wantCNIError(t, err, types.ErrInvalidEnvironmentVariables, "CNI_ARGS")
		})
	}
}

func TestPodArgsOverrideConfig(t *testing.T) {
	base := `"queues":2,"napi":true,"threadedNapi":false,"groFlushTimeout":100,"mac":"02:00:00:00:00:01"`
	tests := []struct {
		name  string
		args  string
		check func(*config.Config) (got, want any)
	}{
		{"args.cni.queues override queues", `"queues":16`,
			func(c *config.Config) (any, any) { return c.Queues, 16 }},
		{"args.cni.napi overrides napi", `"napi":false`,
			func(c *config.Config) (any, any) { return c.NAPI, false }},
		{"args.cni.threadedNapi overrides threadedNapi", `"threadedNapi":true`,
			func(c *config.Config) (any, any) { return c.ThreadedNAPI, true }},
		{"args.cni.groFlushTimeout overrides groFlushTimeout", `"groFlushTimeout":50000`,
			func(c *config.Config) (any, any) { return *c.GROFlushTimeout, uint64(50000) }},
		{"args.cni.groFlushTimeout of 0 overrides, not dropped", `"groFlushTimeout":0`,
			func(c *config.Config) (any, any) { return *c.GROFlushTimeout, uint64(0) }},
		{"args.cni.mac overrides mac", `"mac":"02:00:00:00:00:02"`,
			func(c *config.Config) (any, any) { return c.MAC.String(), "02:00:00:00:00:02" }},
		{"absent args.cni fields leave queues alone", `"napi":true`,
			func(c *config.Config) (any, any) { return c.Queues, 2 }},
		{"absent args.cni fields leave groFlushTimeout alone", `"queues":4`,
			func(c *config.Config) (any, any) { return *c.GROFlushTimeout, uint64(100) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, conf(base+`,"args":{"cni":{`+tt.args+`}}`), att("net1"))
			if got, want := tt.check(c); got != want {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}

	rejected := []struct {
		name  string
		args  string
		field string
	}{
		{"args.cni.queues as a string is rejected naming args.cni.queues", `"queues":"4"`, "args.cni.queues"},
		{"fractional args.cni.queues are rejected naming args.cni.queues", `"queues":1.5`, "args.cni.queues"},
		{"args.cni.napi as a string is rejected naming args.cni.napi", `"napi":"yes"`, "args.cni.napi"},
		{"args.cni.threadedNapi as a number is rejected naming args.cni.threadedNapi", `"threadedNapi":1`, "args.cni.threadedNapi"},
		{"a negative args.cni.groFlushTimeout is rejected naming args.cni.groFlushTimeout", `"groFlushTimeout":-1`, "args.cni.groFlushTimeout"},
		{"args.cni.mac as a number is rejected naming args.cni.mac", `"mac":5`, "args.cni.mac"},
		{"an invalid args.cni.mac is rejected naming args.cni.mac", `"mac":"zz"`, "args.cni.mac"},
		{"a multicast args.cni.mac is rejected naming args.cni.mac", `"mac":"03:00:00:00:00:01"`, "args.cni.mac"},
		{"args.cni.queues above 256 are rejected naming args.cni.queues", `"queues":300`, "args.cni.queues"},
		{"args.cni.napi off with napiFrags on is rejected naming napiFrags", `"napi":false`, "napiFrags"},
	}
	for _, tt := range rejected {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Load([]byte(conf(`"napiFrags":true,"args":{"cni":{`+tt.args+`}}`)), att("net1"))
			wantCNIError(t, err, types.ErrInvalidNetworkConfig, tt.field)
		})
	}
}

func TestMACPrecedence(t *testing.T) {
	const (
		confMAC    = "02:00:00:00:00:01"
		podArgsMAC = "02:00:00:00:00:02"
		envMAC     = "02:00:00:00:00:03"
		runtimeMAC = "02:00:00:00:00:04"
	)
	member := func(name, mac string) string { return fmt.Sprintf(`%q:%q`, name, mac) }
	tests := []struct {
		name    string
		extra   []string
		cniArgs string
		want    string
	}{
		{"without any mac the MAC is unset", nil, "", ""},
		{"the config mac is used alone", []string{member("mac", confMAC)}, "", confMAC},
		{"args.cni.mac beats the config mac",
			[]string{member("mac", confMAC), `"args":{"cni":{` + member("mac", podArgsMAC) + `}}`}, "", podArgsMAC},
		{"CNI_ARGS MAC beats args.cni.mac",
			[]string{member("mac", confMAC), `"args":{"cni":{` + member("mac", podArgsMAC) + `}}`},
			"IgnoreUnknown=1;K8S_POD_NAME=x;MAC=" + envMAC, envMAC},
		{"CNI_ARGS MAC beats the config mac", []string{member("mac", confMAC)}, "IgnoreUnknown=1;MAC=" + envMAC, envMAC},
		{"CNI_ARGS MAC is used alone", nil, "IgnoreUnknown=1;K8S_POD_NAME=x;MAC=" + envMAC, envMAC},
		{"runtimeConfig.mac beats CNI_ARGS MAC",
			[]string{member("mac", confMAC), `"args":{"cni":{` + member("mac", podArgsMAC) + `}}`,
				`"runtimeConfig":{` + member("mac", runtimeMAC) + `}`},
			"IgnoreUnknown=1;K8S_POD_NAME=x;MAC=" + envMAC, runtimeMAC},
		{"runtimeConfig.mac beats the config mac",
			[]string{member("mac", confMAC), `"runtimeConfig":{` + member("mac", runtimeMAC) + `}`}, "", runtimeMAC},
		{"runtimeConfig.mac is used alone", []string{`"runtimeConfig":{` + member("mac", runtimeMAC) + `}`}, "", runtimeMAC},
		{"an uppercase mac is normalized", []string{member("mac", "02:AB:CD:EF:00:01")}, "", "02:ab:cd:ef:00:01"},
		{"chained, a pod's runtimeConfig.mac stays off the tap: it is the pod interface's",
			[]string{member("mac", confMAC), `"runtimeConfig":{` + member("mac", runtimeMAC) + `}`, prevResult(iface("net1", "/run/netns/pod"))},
			"IgnoreUnknown=1;MAC=" + envMAC, confMAC},
		{"chained without a config mac, the tap keeps the kernel's",
			[]string{`"runtimeConfig":{` + member("mac", runtimeMAC) + `}`, prevResult(iface("net1", "/run/netns/pod"))}, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := att("net1")
			a.CNIArgs = tt.cniArgs
			c := mustLoad(t, conf(strings.Join(tt.extra, ",")), a)
			got := ""
			if c.MAC != nil {
				got = c.MAC.String()
			}
			if got != tt.want {
				t.Errorf("MAC = %q, want %q", got, tt.want)
			}
		})
	}

	rejected := []struct {
		name    string
		extra   string
		cniArgs string
		field   string
	}{
		{"an invalid CNI_ARGS MAC is rejected naming CNI_ARGS MAC", "", "IgnoreUnknown=1;MAC=zz", "CNI_ARGS MAC"},
		{"a multicast CNI_ARGS MAC is rejected naming CNI_ARGS MAC", "", "IgnoreUnknown=1;MAC=01:00:00:00:00:01", "CNI_ARGS MAC"},
		{"an invalid runtimeConfig.mac is rejected naming the field", `"runtimeConfig":{"mac":"zz"}`, "", "runtimeConfig.mac"},
		{"a multicast runtimeConfig.mac is rejected naming the field", `"runtimeConfig":{"mac":"33:33:00:00:00:01"}`, "", "runtimeConfig.mac"},
		{"an invalid config mac is rejected even when a later level overrides it",
			`"mac":"zz","runtimeConfig":{"mac":"02:00:00:00:00:04"}`, "", "mac"},
	}
	for _, tt := range rejected {
		t.Run(tt.name, func(t *testing.T) {
			a := att("net1")
			a.CNIArgs = tt.cniArgs
			_, err := config.Load([]byte(conf(tt.extra)), a)
			code := uint(types.ErrInvalidNetworkConfig)
			if strings.HasPrefix(tt.field, "CNI_ARGS") {
				code = types.ErrInvalidEnvironmentVariables // the runtime's input, not the config
			}
			wantCNIError(t, err, code, tt.field)
		})
	}
}

func TestWiring(t *testing.T) {
	tests := []struct {
		name        string
		extra       string
		ifName      string
		final       bool
		wiring      string
		wiringGiven bool
		tapName     string
		peer        string
		bridge      string
		// requirePeer is the field RequirePeer's error names, "" for none.
		requirePeer string
	}{
		{
			name:   "a prevResult with net1 in the sandbox chooses tc-redirect and tap1",
			extra:  prevResult(iface("cni0", ""), iface("veth1234", ""), iface("net1", netnsPath)),
			ifName: "net1", wiring: config.WiringTCRedirect, tapName: "tap1", peer: "net1",
		},
		{
			name:   "a prevResult with eth0 in the sandbox chooses tc-redirect and tap0",
			extra:  prevResult(iface("eth0", netnsPath)),
			ifName: "eth0", wiring: config.WiringTCRedirect, tapName: "tap0", peer: "eth0",
		},
		{
			name:   "a Multus pod interface name gives a KubeVirt tap name",
			extra:  prevResult(iface("pod1234567890a", netnsPath)),
			ifName: "pod1234567890a", wiring: config.WiringTCRedirect, tapName: "tap1234567890a", peer: "pod1234567890a",
		},
		{
			name:   "a prevResult with CNI_IFNAME only on the host keeps wiring none",
			extra:  prevResult(iface("net1", "")),
			ifName: "net1", wiring: config.WiringNone, tapName: "net1",
		},
		{
			name:   "a prevResult with another sandbox interface keeps wiring none",
			extra:  prevResult(iface("eth0", netnsPath)),
			ifName: "net1", wiring: config.WiringNone, tapName: "net1",
		},
		{
			name:   "a prevResult entry whose sandbox is the container ID is not a peer",
			extra:  prevResult(iface("net1", containerID)),
			ifName: "net1", wiring: config.WiringNone, tapName: "net1",
		},
		{
			name:   "explicit tc-redirect without prevResult loads but needs a peer",
			extra:  `"wiring":"tc-redirect"`,
			ifName: "net1", wiring: config.WiringTCRedirect, wiringGiven: true, tapName: "tap1", peer: "net1",
			requirePeer: "wiring",
		},
		{
			name:   "explicit bridge without prevResult loads but needs a peer",
			extra:  `"wiring":"bridge"`,
			ifName: "net1", wiring: config.WiringBridge, wiringGiven: true, tapName: "tap1", peer: "net1", bridge: "br-tap1",
			requirePeer: "wiring",
		},
		{
			name:   "explicit tc-redirect with a prevResult lacking CNI_IFNAME needs a peer",
			extra:  `"wiring":"tc-redirect",` + prevResult(iface("eth0", netnsPath)),
			ifName: "net1", wiring: config.WiringTCRedirect, wiringGiven: true, tapName: "tap1", peer: "net1",
			requirePeer: "prevResult",
		},
		{
			name:   "explicit tc-redirect with CNI_IFNAME only on the host needs a peer",
			extra:  `"wiring":"tc-redirect",` + prevResult(iface("net1", "")),
			ifName: "net1", wiring: config.WiringTCRedirect, wiringGiven: true, tapName: "tap1", peer: "net1",
			requirePeer: "prevResult",
		},
		{
			name:   "explicit tc-redirect with a peer is satisfied",
			extra:  `"wiring":"tc-redirect",` + prevResult(iface("net1", netnsPath)),
			ifName: "net1", wiring: config.WiringTCRedirect, wiringGiven: true, tapName: "tap1", peer: "net1",
		},
		{
			name:   "explicit bridge with a peer gets a default bridge name",
			extra:  `"wiring":"bridge",` + prevResult(iface("net1", netnsPath)),
			ifName: "net1", wiring: config.WiringBridge, wiringGiven: true, tapName: "tap1", peer: "net1", bridge: "br-tap1",
		},
		{
			name:   "explicit none ignores a peer in prevResult",
			extra:  `"wiring":"none",` + prevResult(iface("net1", netnsPath)),
			ifName: "net1", wiring: config.WiringNone, wiringGiven: true, tapName: "net1",
		},
		{
			name:   "a given tapName is used in chained wiring",
			extra:  `"tapName":"vm0",` + prevResult(iface("net1", netnsPath)),
			ifName: "net1", wiring: config.WiringTCRedirect, tapName: "vm0", peer: "net1",
		},
		{
			name:   "a final result holding only a standalone tap means wiring none",
			extra:  prevResult(iface("net1", netnsPath)),
			ifName: "net1", final: true, wiring: config.WiringNone, tapName: "net1",
		},
		{
			name:   "a final result holding the guest entry too means tc-redirect",
			extra:  prevResult(iface("net1", netnsPath), iface("tap1", netnsPath), iface("net1", containerID)),
			ifName: "net1", final: true, wiring: config.WiringTCRedirect, tapName: "tap1", peer: "net1",
		},
		{
			name:   "a final result with the guest entry listed first still means tc-redirect",
			extra:  prevResult(iface("net1", containerID), iface("net1", netnsPath)),
			ifName: "net1", final: true, wiring: config.WiringTCRedirect, tapName: "tap1", peer: "net1",
		},
		{
			name:   "a final result without prevResult means wiring none",
			ifName: "net1", final: true, wiring: config.WiringNone, tapName: "net1",
		},
		{
			name:   "without CNI_IFNAME (GC, STATUS) the tap name is empty",
			ifName: "", wiring: config.WiringNone, tapName: "",
		},
		{
			name:   "without CNI_IFNAME a prevResult cannot choose a chained wiring",
			extra:  prevResult(iface("net1", netnsPath)),
			ifName: "", wiring: config.WiringNone, tapName: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := att(tt.ifName)
			a.FinalResult = tt.final
			c := mustLoad(t, conf(tt.extra), a)
			if c.Wiring != tt.wiring {
				t.Errorf("Wiring = %q, want %q", c.Wiring, tt.wiring)
			}
			if c.WiringGiven != tt.wiringGiven {
				t.Errorf("WiringGiven = %v, want %v", c.WiringGiven, tt.wiringGiven)
			}
			if c.TapName != tt.tapName {
				t.Errorf("TapName = %q, want %q", c.TapName, tt.tapName)
			}
			if c.PeerIfName != tt.peer {
				t.Errorf("PeerIfName = %q, want %q", c.PeerIfName, tt.peer)
			}
			if c.Bridge != tt.bridge {
				t.Errorf("Bridge = %q, want %q", c.Bridge, tt.bridge)
			}
			err := c.RequireAddable()
			if tt.requirePeer == "" {
				if err != nil {
					t.Errorf("RequireAddable() = %v, want nil", err)
				}
				return
			}
			wantCNIError(t, err, types.ErrInvalidNetworkConfig, tt.requirePeer)
		})
	}
}

func TestPrevSandboxInterface(t *testing.T) {
	t.Run("the peer is the sandbox interface named CNI_IFNAME", func(t *testing.T) {
		c := mustLoad(t, conf(prevResult(iface("net1", ""), iface("net1", containerID), iface("net1", netnsPath))), att("net1"))
		p := c.PrevSandboxInterface()
		if p == nil {
			t.Fatal("PrevSandboxInterface() = nil, want the sandbox net1")
		}
		if p.Name != "net1" || p.Sandbox != netnsPath {
			t.Errorf("PrevSandboxInterface() = %+v, want net1 in %s", p, netnsPath)
		}
	})
	t.Run("without prevResult there is no peer", func(t *testing.T) {
		c := mustLoad(t, conf(""), att("net1"))
		if p := c.PrevSandboxInterface(); p != nil {
			t.Errorf("PrevSandboxInterface() = %+v, want nil", p)
		}
	})
	t.Run("without CNI_IFNAME there is no peer", func(t *testing.T) {
		c := mustLoad(t, conf(prevResult(iface("net1", netnsPath))), att(""))
		if p := c.PrevSandboxInterface(); p != nil {
			t.Errorf("PrevSandboxInterface() = %+v, want nil", p)
		}
	})
}

func TestDefaultTapName(t *testing.T) {
	tests := []struct {
		name   string
		ifName string
		wiring string
		want   string
	}{
		{"in none wiring the tap is CNI_IFNAME", "net1", config.WiringNone, "net1"},
		{"in none wiring a tap-like CNI_IFNAME is kept", "tap1", config.WiringNone, "tap1"},
		{"net1 becomes tap1", "net1", config.WiringTCRedirect, "tap1"},
		{"eth0 becomes tap0", "eth0", config.WiringTCRedirect, "tap0"},
		{"bridge wiring names the tap the same way", "net1", config.WiringBridge, "tap1"},
		{"a Multus pod name keeps its hash", "pod1234567890a", config.WiringTCRedirect, "tap1234567890a"},
		{"a 15-byte name keeps its tail", "abcdefghijklmno", config.WiringTCRedirect, "tapdefghijklmno"},
		{"a 3-byte name is prefixed whole", "abc", config.WiringTCRedirect, "tapabc"},
		{"a 1-byte name is prefixed whole", "a", config.WiringTCRedirect, "tapa"},
		{"an empty CNI_IFNAME gives no name", "", config.WiringTCRedirect, ""},
		// README's examples of the edge cases.
		{"README: a name of 3 bytes or fewer is kept whole", "e0", config.WiringTCRedirect, "tape0"},
		{"README: tap alone is 3 bytes, kept whole", "tap", config.WiringTCRedirect, "taptap"},
		{"README: a longer CNI_IFNAME starting with tap is hashed", "tap1", config.WiringTCRedirect, "tapb64a6569"},
		{"README: tapnet1 is hashed too", "tapnet1", config.WiringBridge, "tap5799563c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := config.DefaultTapName(tt.ifName, tt.wiring); got != tt.want {
				t.Errorf("DefaultTapName(%q, %q) = %q, want %q", tt.ifName, tt.wiring, got, tt.want)
			}
		})
	}

	chained := []struct {
		name   string
		ifName string
	}{
		{"a chained tap1 does not collide with itself", "tap1"},
		{"a chained tap does not collide with itself", "tap"},
		{"a chained 15-byte tap name does not collide with itself", "tapabcdefghijkl"},
		{"a chained 15-byte name stays within 15 bytes", "abcdefghijklmno"},
		{"a chained 14-byte name stays within 15 bytes", "pod1234567890a"},
		{"a chained short name stays within 15 bytes", "e"},
		{"a chained 3-byte name stays within 15 bytes", "eth"},
		{"a chained 12-byte name stays within 15 bytes", "abcdefghijkl"},
	}
	for _, tt := range chained {
		t.Run(tt.name, func(t *testing.T) {
			for _, wiring := range []string{config.WiringTCRedirect, config.WiringBridge} {
				got := config.DefaultTapName(tt.ifName, wiring)
				if got == tt.ifName {
					t.Errorf("DefaultTapName(%q, %q) = %q, the chained interface itself", tt.ifName, wiring, got)
				}
				if len(got) > 15 {
					t.Errorf("DefaultTapName(%q, %q) = %q, longer than 15 bytes", tt.ifName, wiring, got)
				}
				if err := config.ValidateLinkName(got); err != nil {
					t.Errorf("DefaultTapName(%q, %q) = %q, invalid: %v", tt.ifName, wiring, got, err)
				}
				if again := config.DefaultTapName(tt.ifName, wiring); again != got {
					t.Errorf("DefaultTapName(%q, %q) is not stable: %q then %q", tt.ifName, wiring, got, again)
				}
			}
		})
	}

	t.Run("colliding names hash to distinct taps", func(t *testing.T) {
		a := config.DefaultTapName("tap1", config.WiringTCRedirect)
		b := config.DefaultTapName("tap2", config.WiringTCRedirect)
		if a == b {
			t.Errorf("tap1 and tap2 both give %q", a)
		}
	})

	t.Run("a chained tap1 loads with a tap name other than tap1", func(t *testing.T) {
		c := mustLoad(t, conf(prevResult(iface("tap1", netnsPath))), att("tap1"))
		if c.Wiring != config.WiringTCRedirect || c.TapName == "tap1" || len(c.TapName) > 15 {
			t.Errorf("wiring %q, TapName %q; want tc-redirect and a tap name other than tap1", c.Wiring, c.TapName)
		}
	})
}

func TestBridgeName(t *testing.T) {
	tests := []struct {
		name   string
		extra  string
		ifName string
		want   string
	}{
		{"the default bridge is br- plus the tap name", `"wiring":"bridge"`, "net1", "br-tap1"},
		{"the default bridge follows a given tap name", `"wiring":"bridge","tapName":"vm0"`, "net1", "br-vm0"},
		{"a default bridge too long for 15 bytes is named by a hash of the tap name", `"wiring":"bridge"`, "abcdefghijklmno", "br2946f5d2"},
		{"two long tap names sharing a prefix get different bridges", `"wiring":"bridge"`, "abcdefghijklmnp", "br3c4713bb"},
		{"the default bridge for a 12-byte tap name fits exactly", `"wiring":"bridge","tapName":"abcdefghijkl"`, "net1", "br-abcdefghijkl"},
		{"a given bridge name is kept", `"wiring":"bridge","bridge":"br0"`, "net1", "br0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, conf(tt.extra), att(tt.ifName))
			if c.Bridge != tt.want {
				t.Errorf("Bridge = %q, want %q", c.Bridge, tt.want)
			}
			if len(c.Bridge) > 15 {
				t.Errorf("Bridge %q is longer than 15 bytes", c.Bridge)
			}
		})
	}
}

func TestValidateLinkName(t *testing.T) {
	tests := []struct {
		name    string
		link    string
		wantErr bool
	}{
		{"a plain name is valid", "tap0", false},
		{"a 15-byte name is valid", "abcdefghijklmno", false},
		{"a name with dashes and dots is valid", "br-net.1", false},
		{"an empty name is invalid", "", true},
		{"a 16-byte name is invalid", "abcdefghijklmnop", true},
		{"'.' is invalid", ".", true},
		{"'..' is invalid", "..", true},
		{"a name with '/' is invalid", "a/b", true},
		{"a name with ':' is invalid", "eth0:1", true},
		{"a name with '%' is invalid", "tap%d", true},
		{"a name with a space is invalid", "tap 0", true},
		{"a name with a newline is invalid", "tap\n0", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := config.ValidateLinkName(tt.link)
			if (err != nil) != tt.wantErr {
				t.Errorf("ValidateLinkName(%q) = %v, want error %v", tt.link, err, tt.wantErr)
			}
		})
	}
}

func TestThreadedNAPIDefault(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		want  bool
	}{
		{"threaded NAPI is on when napi is", ``, true},
		{"threaded NAPI is off when napi is off", `"napi":false`, false},
		{"threaded NAPI is off when a pod turns napi off", `"args":{"cni":{"napi":false}}`, false},
		{"an explicit threadedNapi false wins", `"threadedNapi":false`, false},
		{"a pod's threadedNapi false wins", `"args":{"cni":{"threadedNapi":false}}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := mustLoad(t, conf(tt.extra), att("net1")); c.ThreadedNAPI != tt.want {
				t.Errorf("ThreadedNAPI = %v, want %v", c.ThreadedNAPI, tt.want)
			}
		})
	}
}

// TestDeleteLoadsWhatADDRejected: DEL cleans up after any ADD that failed
// on a value; only names are still checked.
func TestDeleteLoadsWhatADDRejected(t *testing.T) {
	del := func(ifName, cniArgs string) config.Attachment {
		a := att(ifName)
		a.CNIArgs, a.ForDelete = cniArgs, true
		return a
	}
	loaded := []struct {
		name    string
		conf    string
		cniArgs string
	}{
		{"a bad CNI_ARGS MAC", conf(``), "IgnoreUnknown=1;MAC=zz"},
		{"threadedNapi without napi from a pod", conf(`"threadedNapi":true,"args":{"cni":{"napi":false}}`), ""},
		{"queues out of range", conf(`"queues":300`), ""},
		{"args.cni.queues out of range", conf(`"args":{"cni":{"queues":0}}`), ""},
		{"an unknown wiring", conf(`"wiring":"vxlan"`), ""},
		{"vnetHdrSize 11", conf(`"vnetHdrSize":11`), ""},
		{"an unknown root qdisc", conf(`"rootQdisc":"fq"`), ""},
		{"the older spelling of handoff mode off", conf(`"handoff":{"disabled":true}`), ""},
	}
	for _, tt := range loaded {
		t.Run("DEL loads a config with "+tt.name, func(t *testing.T) {
			if _, err := config.Load([]byte(tt.conf), del("net1", tt.cniArgs)); err != nil {
				t.Errorf("Load for DEL: %v", err)
			}
		})
	}
	t.Run("DEL still refuses a misspelt key, naming it", func(t *testing.T) {
		_, err := config.Load([]byte(conf(`"handoff":{"mdoe":"intercept"}`)), del("net1", ""))
		wantCNIError(t, err, types.ErrInvalidNetworkConfig, "handoff.mdoe")
	})
	t.Run("DEL still rejects a tap name the kernel would not take", func(t *testing.T) {
		_, err := config.Load([]byte(conf(`"tapName":"../etc"`)), del("net1", ""))
		wantCNIError(t, err, types.ErrInvalidNetworkConfig, "tapName")
	})
}

// TestTheQueuesRangeSaysFdsModesBound: in fds mode one message carries at
// most handoff.MaxFDs queues; the range error says that number, whether
// Load or RequireConsistent (ADD, STATUS) finds it.
func TestTheQueuesRangeSaysFdsModesBound(t *testing.T) {
	tests := []struct {
		name   string
		extra  string
		errHas string // "" accepted
	}{
		{"253 queues in fds mode are accepted", `"queues":253,"handoff":{"mode":"fds"}`, ""},
		{"254 queues in fds mode are out of range 1-253", `"queues":254,"handoff":{"mode":"fds"}`, `out of range 1-253 in "handoff" mode "fds": one message carries at most 253 fds`},
		{"300 queues in fds mode are out of range 1-253", `"queues":300,"handoff":{"mode":"fds"}`, `out of range 1-253 in "handoff" mode "fds"`},
		{"300 queues in intercept mode are out of range 1-256", `"queues":300,"handoff":{"mode":"intercept"}`, "out of range 1-256"},
		{"256 queues in intercept mode are accepted", `"queues":256,"handoff":{"mode":"intercept"}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Load([]byte(conf(tc.extra)), att("net1"))
			if err == nil {
				err = c.RequireConsistent()
			}
			if tc.errHas == "" && err != nil || tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)) {
				t.Errorf("Load and RequireConsistent: %v, want %q", err, tc.errHas)
			}
		})
	}
}
