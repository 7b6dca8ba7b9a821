package main_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
)

// A bad input is one ADD that must fail with a CNI error naming what is
// wrong and leave the node exactly as it found it. Every case runs the real
// napitap binary against a fresh pod netns that holds a stand-in for the
// previous plugin's interface (veth eth0, its peer in the host netns), an
// in-process napitapd and a kataDan dir, all of which a wrongly accepted
// config would touch.
type badInput struct {
	name string

	// The network config is the base config (chained after eth0: a
	// prevResult naming it, hand-off to the test's napitapd, kataDan on)
	// with fields, a comma-separated list of JSON members, put over its
	// top-level members, and omit taken out. standalone drops the
	// prevResult and makes CNI_IFNAME tap0. raw, when set, is the whole
	// stdin instead. Placeholders: see badInputFixture.expand.
	fields     string
	omit       []string
	standalone bool
	raw        *string

	// env is put over the CNI_ variables of a good ADD; "" leaves the
	// variable out. A case with env runs the binary with exactly that
	// environment; the others go through cnitest.Env.ExecNapitap.
	env map[string]string

	code uint
	// want is how the error message must start: the config field at fault
	// followed by ':', or the variable, or skel's own wording.
	want string
}

func raw(s string) *string { return &s }

// Messages that come from skel, not from napitap.
const (
	skelMalformed  = "error unmarshall network config"
	skelBadVersion = "incompatible CNI versions"
)

var badInputs = []badInput{
	// Malformed JSON: skel rejects it before napitap sees it.
	{name: "an empty config is malformed JSON", raw: raw(``), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a truncated object is malformed JSON", raw: raw(`{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap"`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "garbage after the object is malformed JSON", raw: raw(`{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap"} napitap`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "two objects back to back are malformed JSON", raw: raw(`{"cniVersion":"1.0.0","name":"napitap-test"}{"type":"napitap"}`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "single-quoted strings are malformed JSON", raw: raw(`{'cniVersion':'1.0.0','name':'napitap-test','type':'napitap'}`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a trailing comma is malformed JSON", raw: raw(`{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap",}`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "an unquoted key is malformed JSON", raw: raw(`{cniVersion:"1.0.0","name":"napitap-test","type":"napitap"}`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a comment is malformed JSON", raw: raw("// napitap\n" + `{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap"}`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "NaN is malformed JSON", raw: raw(`{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap","queues":NaN}`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a list of configs is not a config", raw: raw(`[{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap"}]`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a bare JSON string is not a config", raw: raw(`"napitap"`), code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a network name that is a number cannot be decoded", fields: `"name":5`, code: types.ErrDecodingFailure, want: skelMalformed},
	{name: "a cniVersion that is a number cannot be decoded", fields: `"cniVersion":1.0`, code: types.ErrDecodingFailure, want: "decoding version from network config"},

	// The network name, which skel checks.
	{name: "a config without a network name is rejected", omit: []string{"name"}, code: types.ErrInvalidNetworkConfig, want: "missing network name"},
	{name: "a JSON null has no network name", raw: raw(`null`), code: types.ErrInvalidNetworkConfig, want: "missing network name"},
	{name: "a network name with a slash is rejected", fields: `"name":"napi/tap"`, code: types.ErrInvalidNetworkConfig, want: "invalid characters found in network name"},

	// Spec versions napitap does not speak: skel answers code 1.
	{name: "cniVersion 0.2.0 is incompatible", fields: `"cniVersion":"0.2.0"`, code: types.ErrIncompatibleCNIVersion, want: skelBadVersion},
	{name: "cniVersion 2.0.0 is incompatible", fields: `"cniVersion":"2.0.0"`, code: types.ErrIncompatibleCNIVersion, want: skelBadVersion},
	{name: "an empty cniVersion means 0.1.0, which is incompatible", fields: `"cniVersion":""`, code: types.ErrIncompatibleCNIVersion, want: skelBadVersion},
	{name: "a missing cniVersion means 0.1.0, which is incompatible", omit: []string{"cniVersion"}, code: types.ErrIncompatibleCNIVersion, want: skelBadVersion},
	{name: "cniVersion 1.0 is not 1.0.0", fields: `"cniVersion":"1.0"`, code: types.ErrIncompatibleCNIVersion, want: skelBadVersion},

	// Wrong JSON types: code 7 naming the field, nested ones by their path.
	{name: "queues as a string names queues", fields: `"queues":"4"`, code: types.ErrInvalidNetworkConfig, want: "queues:"},
	{name: "queues as a non-numeric string names queues", fields: `"queues":"x"`, code: types.ErrInvalidNetworkConfig, want: "queues:"},
	{name: "queues as a fraction names queues", fields: `"queues":1.5`, code: types.ErrInvalidNetworkConfig, want: "queues:"},
	{name: "napi as a string names napi", fields: `"napi":"yes"`, code: types.ErrInvalidNetworkConfig, want: "napi:"},
	{name: "napiFrags as a number names napiFrags", fields: `"napiFrags":1`, code: types.ErrInvalidNetworkConfig, want: "napiFrags:"},
	{name: "threadedNapi as a string names threadedNapi", fields: `"threadedNapi":"true"`, code: types.ErrInvalidNetworkConfig, want: "threadedNapi:"},
	{name: "a negative groFlushTimeout names groFlushTimeout", fields: `"groFlushTimeout":-1`, code: types.ErrInvalidNetworkConfig, want: "groFlushTimeout:"},
	{name: "napiDeferHardIrqs as a string names napiDeferHardIrqs", fields: `"napiDeferHardIrqs":"2"`, code: types.ErrInvalidNetworkConfig, want: "napiDeferHardIrqs:"},
	{name: "vnetHdr as a number names vnetHdr", fields: `"vnetHdr":0`, code: types.ErrInvalidNetworkConfig, want: "vnetHdr:"},
	{name: "vnetHdrSize as a string names vnetHdrSize", fields: `"vnetHdrSize":"12"`, code: types.ErrInvalidNetworkConfig, want: "vnetHdrSize:"},
	{name: "mtu as a string names mtu", fields: `"mtu":"1500"`, code: types.ErrInvalidNetworkConfig, want: "mtu:"},
	{name: "mac as a number names mac", fields: `"mac":5`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "txQueueLen as a string names txQueueLen", fields: `"txQueueLen":"1000"`, code: types.ErrInvalidNetworkConfig, want: "txQueueLen:"},
	{name: "rootQdisc as a boolean names rootQdisc", fields: `"rootQdisc":true`, code: types.ErrInvalidNetworkConfig, want: "rootQdisc:"},
	{name: "a negative owner names owner", fields: `"owner":-1`, code: types.ErrInvalidNetworkConfig, want: "owner:"},
	{name: "an owner beyond 32 bits names owner", fields: `"owner":4294967296`, code: types.ErrInvalidNetworkConfig, want: "owner:"},
	{name: "a fractional group names group", fields: `"group":1.5`, code: types.ErrInvalidNetworkConfig, want: "group:"},
	{name: "tapName as a number names tapName", fields: `"tapName":5`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "wiring as a number names wiring", fields: `"wiring":3`, code: types.ErrInvalidNetworkConfig, want: "wiring:"},
	{name: "bridge as a list names bridge", fields: `"bridge":["br0"]`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},
	{name: "handoff as a string names handoff", fields: `"handoff":"x"`, code: types.ErrInvalidNetworkConfig, want: "handoff:"},
	{name: "handoff.socket as a number names handoff.socket", fields: `"handoff":{"socket":5}`, code: types.ErrInvalidNetworkConfig, want: "handoff.socket:"},
	{name: "handoff.required as a string names handoff.required", fields: `"handoff":{"socket":"$SOCKET","required":"yes"}`, code: types.ErrInvalidNetworkConfig, want: "handoff.required:"},
	{name: "kataDan as a boolean names kataDan", fields: `"kataDan":true`, code: types.ErrInvalidNetworkConfig, want: "kataDan:"},
	{name: "kataDan.dir as a number names kataDan.dir", fields: `"kataDan":{"enabled":true,"dir":5}`, code: types.ErrInvalidNetworkConfig, want: "kataDan.dir:"},
	{name: "kataDan.queueSize as a string names kataDan.queueSize", fields: `"kataDan":{"enabled":true,"dir":"$DANDIR","queueSize":"256"}`, code: types.ErrInvalidNetworkConfig, want: "kataDan.queueSize:"},
	{name: "args as a number names args", fields: `"args":5`, code: types.ErrInvalidNetworkConfig, want: "args:"},
	{name: "args.cni as a number names args.cni", fields: `"args":{"cni":5}`, code: types.ErrInvalidNetworkConfig, want: "args.cni:"},
	{name: "args.cni.queues as a string names args.cni.queues", fields: `"args":{"cni":{"queues":"8"}}`, code: types.ErrInvalidNetworkConfig, want: "args.cni.queues:"},
	{name: "args.cni.napi as a number names args.cni.napi", fields: `"args":{"cni":{"napi":1}}`, code: types.ErrInvalidNetworkConfig, want: "args.cni.napi:"},
	{name: "args.cni.mac as a number names args.cni.mac", fields: `"args":{"cni":{"mac":5}}`, code: types.ErrInvalidNetworkConfig, want: "args.cni.mac:"},
	{name: "runtimeConfig.mac as a number names runtimeConfig.mac", fields: `"runtimeConfig":{"mac":5}`, code: types.ErrInvalidNetworkConfig, want: "runtimeConfig.mac:"},
	{name: "ipam as a string names ipam", fields: `"ipam":"x"`, code: types.ErrInvalidNetworkConfig, want: "ipam:"},
	{name: "prevResult as a number names prevResult", fields: `"prevResult":5`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "type as a number names type", fields: `"type":5`, code: types.ErrInvalidNetworkConfig, want: "type:"},

	// Values out of range or contradicting each other.
	{name: "zero queues are out of range", fields: `"queues":0`, code: types.ErrInvalidNetworkConfig, want: "queues:"},
	{name: "257 queues are more than a tap has", fields: `"queues":257`, code: types.ErrInvalidNetworkConfig, want: "queues:"},
	{name: "negative queues are out of range", fields: `"queues":-1`, code: types.ErrInvalidNetworkConfig, want: "queues:"},
	{name: "zero queues from args.cni are out of range", fields: `"args":{"cni":{"queues":0}}`, code: types.ErrInvalidNetworkConfig, want: "args.cni.queues:"},
	{name: "napiFrags without napi is rejected", fields: `"napi":false,"napiFrags":true`, code: types.ErrInvalidNetworkConfig, want: "napiFrags:"},
	{name: "threadedNapi without napi is rejected", fields: `"napi":false,"threadedNapi":true`, code: types.ErrInvalidNetworkConfig, want: "threadedNapi:"},
	{name: "threadedNapi with napi switched off by args.cni is rejected", fields: `"threadedNapi":true,"args":{"cni":{"napi":false}}`, code: types.ErrInvalidNetworkConfig, want: "threadedNapi:"},
	{name: "vnetHdrSize 11 is neither 10 nor 12", fields: `"vnetHdrSize":11`, code: types.ErrInvalidNetworkConfig, want: "vnetHdrSize:"},
	{name: "vnetHdrSize 0 is neither 10 nor 12", fields: `"vnetHdrSize":0`, code: types.ErrInvalidNetworkConfig, want: "vnetHdrSize:"},
	{name: "vnetHdrSize 16 is neither 10 nor 12", fields: `"vnetHdrSize":16`, code: types.ErrInvalidNetworkConfig, want: "vnetHdrSize:"},
	{name: "mtu 67 is below Ethernet's minimum", fields: `"mtu":67`, code: types.ErrInvalidNetworkConfig, want: "mtu:"},
	{name: "mtu 65522 is above a tap's maximum", fields: `"mtu":65522`, code: types.ErrInvalidNetworkConfig, want: "mtu:"},
	{name: "a negative mtu is out of range", fields: `"mtu":-5`, code: types.ErrInvalidNetworkConfig, want: "mtu:"},
	{name: "a negative txQueueLen is out of range", fields: `"txQueueLen":-1`, code: types.ErrInvalidNetworkConfig, want: "txQueueLen:"},
	{name: "a txQueueLen beyond 31 bits is out of range", fields: `"txQueueLen":2147483648`, code: types.ErrInvalidNetworkConfig, want: "txQueueLen:"},
	{name: "a rootQdisc of fq_codel is neither noqueue nor mq", fields: `"rootQdisc":"fq_codel"`, code: types.ErrInvalidNetworkConfig, want: "rootQdisc:"},
	{name: "napiDeferHardIrqs beyond 31 bits is above the kernel's limit", fields: `"napiDeferHardIrqs":2147483648`, code: types.ErrInvalidNetworkConfig, want: "napiDeferHardIrqs:"},
	{name: "owner (uid_t)-1 is not a uid", fields: `"owner":4294967295`, code: types.ErrInvalidNetworkConfig, want: "owner:"},
	{name: "group (gid_t)-1 is not a gid", fields: `"group":4294967295`, code: types.ErrInvalidNetworkConfig, want: "group:"},

	// Tap names the kernel would refuse or misread.
	{name: "a tap name of 16 bytes is too long", fields: `"tapName":"tap0123456789abc"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a slash is rejected", fields: `"tapName":"tap/0"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name of .. is rejected", fields: `"tapName":".."`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name of . is rejected", fields: `"tapName":"."`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a space is rejected", fields: `"tapName":"tap 0"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a percent sign is rejected", fields: `"tapName":"tap%d"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a colon is rejected", fields: `"tapName":"tap0:1"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a tab is rejected", fields: `"tapName":"tap\t0"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a newline is rejected", fields: `"tapName":"tap\n0"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a NUL is rejected", fields: `"tapName":"tap\u00000"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with DEL is rejected", fields: `"tapName":"tap\u007f0"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "the chained interface's own name is no tap name", fields: `"tapName":"eth0"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name with a no-break space is rejected", fields: `"tapName":"tap\u00a00"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a tap name of napitap's temporary form is rejected", fields: `"tapName":"napi~t0123456789"`, code: types.ErrInvalidNetworkConfig, want: "tapName:"},
	{name: "a bridge name of napitap's temporary form is rejected", fields: `"wiring":"bridge","bridge":"napi~b0123456789"`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},
	{name: "a bridge name with a no-break space is rejected", fields: `"wiring":"bridge","bridge":"br\u00a00"`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},

	// MACs a tap cannot have.
	{name: "a MAC of non-hex digits is rejected", fields: `"mac":"zz:zz:zz:zz:zz:zz"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "a MAC of five bytes is rejected", fields: `"mac":"02:00:00:00:00"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "an EUI-64 is no Ethernet MAC", fields: `"mac":"02:00:00:00:00:00:00:01"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "a MAC that is a word is rejected", fields: `"mac":"not-a-mac"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "a multicast MAC is rejected", fields: `"mac":"01:00:5e:00:00:01"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "the broadcast MAC is rejected", fields: `"mac":"ff:ff:ff:ff:ff:ff"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "the all-zero MAC is rejected", fields: `"mac":"00:00:00:00:00:00"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},
	{name: "an invalid args.cni.mac names args.cni.mac", fields: `"args":{"cni":{"mac":"02-00-00"}}`, code: types.ErrInvalidNetworkConfig, want: "args.cni.mac:"},
	{name: "a multicast runtimeConfig.mac names runtimeConfig.mac", fields: `"runtimeConfig":{"mac":"33:33:00:00:00:01"}`, code: types.ErrInvalidNetworkConfig, want: "runtimeConfig.mac:"},
	{name: "the guest's own MAC on the tap is rejected in bridge wiring", fields: `"wiring":"bridge","mac":"$PEERMAC"`, code: types.ErrInvalidNetworkConfig, want: "mac:"},

	// Wiring, prevResult and what goes with them.
	{name: "an unknown wiring is rejected", fields: `"wiring":"macvtap"`, code: types.ErrInvalidNetworkConfig, want: "wiring:"},
	{name: "wiring names are case-sensitive", fields: `"wiring":"TC-Redirect"`, code: types.ErrInvalidNetworkConfig, want: "wiring:"},
	{name: "tc-redirect wiring without a prevResult is rejected", standalone: true, fields: `"wiring":"tc-redirect"`, code: types.ErrInvalidNetworkConfig, want: "wiring:"},
	{name: "bridge wiring without a prevResult is rejected", standalone: true, fields: `"wiring":"bridge"`, code: types.ErrInvalidNetworkConfig, want: "wiring:"},
	{name: "a prevResult interface outside the sandbox cannot be wired", fields: `"wiring":"tc-redirect","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"$PEERMAC"}]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a prevResult interface of another name cannot be wired", fields: `"wiring":"tc-redirect","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"net9","mac":"$PEERMAC","sandbox":"$POD"}]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a prevResult holding only a guest entry cannot be wired", fields: `"wiring":"bridge","prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"$PEERMAC","sandbox":"$CONTAINER"}]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a prevResult with interfaces that are no list is rejected", fields: `"prevResult":{"cniVersion":"1.0.0","interfaces":"eth0"}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a prevResult with an address that is no CIDR is rejected", fields: `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"$POD"}],"ips":[{"address":"10.199.0.2","interface":0}]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a null prevResult interface is rejected", fields: `"prevResult":{"cniVersion":"1.0.0","interfaces":[null]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a null prevResult IP is rejected", fields: `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"$PEERMAC","sandbox":"$POD"}],"ips":[null]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "a null prevResult route is rejected", fields: `"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"$PEERMAC","sandbox":"$POD"}],"routes":[null]}`, code: types.ErrInvalidNetworkConfig, want: "prevResult:"},
	{name: "ipam with defaulted tc-redirect wiring is rejected", fields: `"ipam":{"type":"host-local","subnet":"10.198.0.0/24","dataDir":"$DATADIR/ipam"}`, code: types.ErrInvalidNetworkConfig, want: "ipam:"},
	{name: "ipam with bridge wiring is rejected", fields: `"wiring":"bridge","ipam":{"type":"host-local","subnet":"10.198.0.0/24","dataDir":"$DATADIR/ipam"}`, code: types.ErrInvalidNetworkConfig, want: "ipam:"},
	{name: "a bridge name with wiring none is rejected", standalone: true, fields: `"wiring":"none","bridge":"br0"`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},
	{name: "a bridge name of 16 bytes is too long", fields: `"wiring":"bridge","bridge":"br-0123456789abc"`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},
	{name: "a bridge named like the tap is rejected", fields: `"wiring":"bridge","bridge":"tap0"`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},
	{name: "a bridge named like the chained interface is rejected", fields: `"wiring":"bridge","bridge":"eth0"`, code: types.ErrInvalidNetworkConfig, want: "bridge:"},

	// Hand-off and kataDan.
	{name: "a relative handoff.socket is rejected", fields: `"handoff":{"socket":"run/napitap.sock"}`, code: types.ErrInvalidNetworkConfig, want: "handoff.socket:"},
	{name: "a hand-off both required and disabled is rejected", fields: `"handoff":{"socket":"$SOCKET","required":true,"disabled":true}`, code: types.ErrInvalidNetworkConfig, want: "handoff:"},
	{name: "an unknown handoff.mode names handoff.mode", fields: `"handoff":{"mode":"magic"}`, code: types.ErrInvalidNetworkConfig, want: "handoff.mode:"},
	{name: "handoff.mode intercept with disabled names handoff.mode", fields: `"handoff":{"mode":"intercept","disabled":true}`, code: types.ErrInvalidNetworkConfig, want: "handoff.mode:"},
	{name: "a hand-off both required and off is rejected", fields: `"handoff":{"mode":"off","required":true}`, code: types.ErrInvalidNetworkConfig, want: "handoff:"},
	{name: "vnetHdr false with a runtime that opens the tap by name names vnetHdr", fields: `"vnetHdr":false,"handoff":{"mode":"intercept","socket":"$SOCKET"}`, code: types.ErrInvalidNetworkConfig, want: "vnetHdr:"},
	{name: "vnetHdr false with the hand-off off names vnetHdr", fields: `"vnetHdr":false,"handoff":{"mode":"off"}`, code: types.ErrInvalidNetworkConfig, want: "vnetHdr:"},
	{name: "a handoff.socket that is a regular file is rejected after the tap is wired", fields: `"handoff":{"socket":"$FILE","required":true}`, code: types.ErrInvalidNetworkConfig, want: "handoff.socket:"},
	{name: "a handoff.socket that is a directory is rejected after the tap is wired", fields: `"handoff":{"socket":"$DATADIR","required":false}`, code: types.ErrInvalidNetworkConfig, want: "handoff.socket:"},
	{name: "a handoff.socket that is a regular file is rejected after a standalone tap is made", standalone: true, fields: `"queues":4,"handoff":{"socket":"$FILE","required":true}`, code: types.ErrInvalidNetworkConfig, want: "handoff.socket:"},
	{name: "a handoff.socket that is a regular file is rejected after the bridge is built", fields: `"wiring":"bridge","handoff":{"socket":"$FILE","required":true}`, code: types.ErrInvalidNetworkConfig, want: "handoff.socket:"},
	{name: "a relative kataDan.dir is rejected", fields: `"kataDan":{"enabled":true,"dir":"kata/dans"}`, code: types.ErrInvalidNetworkConfig, want: "kataDan.dir:"},
	{name: "kataDan with a hand-off is rejected: Kata opens the tap itself", fields: `"kataDan":{"enabled":true,"dir":"$DANDIR"}`, code: types.ErrInvalidNetworkConfig, want: "kataDan:"},
	{name: "kataDan.queueSize 3 is no power of two", fields: `"kataDan":{"enabled":true,"dir":"$DANDIR","queueSize":3}`, code: types.ErrInvalidNetworkConfig, want: "kataDan.queueSize:"},
	{name: "kataDan.queueSize 1 is below 2", fields: `"kataDan":{"enabled":true,"dir":"$DANDIR","queueSize":1}`, code: types.ErrInvalidNetworkConfig, want: "kataDan.queueSize:"},
	{name: "kataDan.queueSize 65536 is above 32768", fields: `"kataDan":{"enabled":true,"dir":"$DANDIR","queueSize":65536}`, code: types.ErrInvalidNetworkConfig, want: "kataDan.queueSize:"},

	// The runtime's environment.
	{name: "a CNI_NETNS that does not exist is rejected", env: map[string]string{"CNI_NETNS": "/run/netns/napitap-no-such-netns"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_NETNS:"},
	{name: "a CNI_NETNS that is a regular file is rejected", env: map[string]string{"CNI_NETNS": "$FILE"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_NETNS:"},
	{name: "a CNI_NETNS that is a directory is rejected", env: map[string]string{"CNI_NETNS": "$DATADIR"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_NETNS:"},
	{name: "a CNI_NETNS that is a procfs file but no netns is rejected", env: map[string]string{"CNI_NETNS": "/proc/self/status"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_NETNS:"},
	{name: "a CNI_NETNS of another kind of namespace is rejected", env: map[string]string{"CNI_NETNS": "/proc/self/ns/uts"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_NETNS:"},
	{name: "a missing CNI_NETNS is rejected", env: map[string]string{"CNI_NETNS": ""}, code: types.ErrInvalidEnvironmentVariables, want: "required env variables [CNI_NETNS] missing"},
	{name: "a CNI_NETNS that is the plugin's own netns is rejected", standalone: true, env: map[string]string{"CNI_NETNS": "$HOST"}, code: types.ErrInvalidNetNS, want: "CNI_NETNS:"},
	{name: "a missing CNI_CONTAINERID is rejected", env: map[string]string{"CNI_CONTAINERID": ""}, code: types.ErrInvalidEnvironmentVariables, want: "required env variables [CNI_CONTAINERID] missing"},
	{name: "a CNI_CONTAINERID with a slash is rejected", env: map[string]string{"CNI_CONTAINERID": "napitap/test"}, code: types.ErrInvalidEnvironmentVariables, want: "invalid characters in containerID"},
	{name: "a missing CNI_IFNAME is rejected", env: map[string]string{"CNI_IFNAME": ""}, code: types.ErrInvalidEnvironmentVariables, want: "required env variables [CNI_IFNAME] missing"},
	{name: "a CNI_IFNAME of 16 bytes is rejected", env: map[string]string{"CNI_IFNAME": "eth0123456789abc"}, code: types.ErrInvalidEnvironmentVariables, want: "interface name is too long"},
	{name: "a CNI_IFNAME with a percent sign is rejected", env: map[string]string{"CNI_IFNAME": "eth%d"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_IFNAME:"},
	{name: "a CNI_IFNAME with a raw 0xa0 byte is rejected", standalone: true, env: map[string]string{"CNI_IFNAME": "tap\xa00"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_IFNAME:"},
	{name: "a CNI_IFNAME with DEL is rejected", env: map[string]string{"CNI_IFNAME": "eth\x7f0"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_IFNAME:"},
	{name: "a CNI_ARGS pair without '=' is rejected", env: map[string]string{"CNI_ARGS": "IgnoreUnknown"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_ARGS:"},
	{name: "a CNI_ARGS pair with two '=' is rejected", env: map[string]string{"CNI_ARGS": "IgnoreUnknown=1;MAC=02=00"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_ARGS:"},
	{name: "an unknown CNI_ARGS key without IgnoreUnknown is rejected", env: map[string]string{"CNI_ARGS": "K8S_POD_NAME=vm"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_ARGS:"},
	{name: "a CNI_ARGS IgnoreUnknown that is no boolean is rejected", env: map[string]string{"CNI_ARGS": "IgnoreUnknown=maybe"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_ARGS:"},
	{name: "an invalid CNI_ARGS MAC is an invalid CNI_ARGS", env: map[string]string{"CNI_ARGS": "IgnoreUnknown=1;MAC=zz:zz:zz:zz:zz:zz"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_ARGS"},
	{name: "a multicast CNI_ARGS MAC is an invalid CNI_ARGS", env: map[string]string{"CNI_ARGS": "IgnoreUnknown=1;MAC=01:00:5e:00:00:01"}, code: types.ErrInvalidEnvironmentVariables, want: "CNI_ARGS"},
	{name: "an unknown CNI_COMMAND is rejected", env: map[string]string{"CNI_COMMAND": "ATTACH"}, code: types.ErrInvalidEnvironmentVariables, want: "unknown CNI_COMMAND"},
	{name: "a missing CNI_PATH is rejected", env: map[string]string{"CNI_PATH": ""}, code: types.ErrInvalidEnvironmentVariables, want: "required env variables [CNI_PATH] missing"},
}

// TestBadInputFailsCleanly runs every bad input through ADD.
func TestBadInputFailsCleanly(t *testing.T) {
	seen := map[string]bool{}
	for _, tc := range badInputs {
		if seen[tc.name] {
			t.Fatalf("two cases are called %q", tc.name)
		}
		seen[tc.name] = true
		t.Run(tc.name, func(t *testing.T) {
			f := newBadInputFixture(t)
			before := f.snapshot()

			var stdout []byte
			var err error
			if tc.env != nil {
				stdout, err = f.execWithEnv(f.conf(tc), tc.env, tc.standalone)
			} else {
				err = f.e.ExecNapitap("ADD", f.conf(tc), f.ifName(tc))
			}

			var problems []string
			if tc.env != nil {
				problems = append(problems, checkStdoutIsOneError(stdout, err)...)
			}
			if err == nil {
				problems = append(problems, "ADD succeeded")
			} else if cniErr := cnitest.CNIError(err); cniErr.Code != tc.code || !strings.HasPrefix(cniErr.Msg, tc.want) {
				problems = append(problems, fmt.Sprintf("error code %d %q, want code %d starting %q", cniErr.Code, cniErr.Msg, tc.code, tc.want))
			}
			if gone, added := diffLines(before, f.snapshot()); len(gone)+len(added) > 0 {
				problems = append(problems, fmt.Sprintf("the node changed:\n  gone:  %s\n  added: %s",
					strings.Join(gone, "\n         "), strings.Join(added, "\n         ")))
			}

			if len(problems) > 0 {
				t.Error(strings.Join(problems, "\n"))
			}
		})
	}
}

// badInputFixture is one pod netns with eth0 in it, the host netns that
// holds eth0's peer and runs the plugin, an in-process napitapd, a kataDan
// dir and a regular file to point paths at.
type badInputFixture struct {
	t       *testing.T
	e       *cnitest.Env
	d       *napitapd
	danDir  string
	file    string
	peerMAC string
}

func newBadInputFixture(t *testing.T) *badInputFixture {
	t.Helper()
	f := &badInputFixture{t: t, e: cnitest.NewEnv(t, binDir), d: startNapitapd(t, ""), danDir: t.TempDir(), peerMAC: "02:4e:41:00:00:02"}
	f.file = filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(f.file, []byte("not a socket, not a netns\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(f.peerMAC)
	f.e.Pod.Run(t, func() error {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: "eth0", HardwareAddr: mac},
			PeerName:      "napi" + f.e.Suffix,
			PeerNamespace: netlink.NsFd(int(f.e.Host.Fd())),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		eth0, err := netlinksafe.LinkByName("eth0")
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.199.0.2/24")
		if err := netlink.AddrAdd(eth0, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(eth0)
	})
	f.e.Host.Run(t, func() error {
		peer, err := netlinksafe.LinkByName("napi" + f.e.Suffix)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(peer)
	})
	return f
}

// expand fills in the placeholders a case may use.
func (f *badInputFixture) expand(s string) string {
	return strings.NewReplacer(
		"$POD", f.e.Pod.Path(),
		"$HOST", f.e.Host.Path(),
		"$CONTAINER", f.e.ContainerID,
		"$PEERMAC", f.peerMAC,
		"$SOCKET", f.d.socket,
		"$DANDIR", f.danDir,
		"$DATADIR", f.e.DataDir,
		"$FILE", f.file,
	).Replace(s)
}

func (f *badInputFixture) ifName(tc badInput) string {
	if tc.standalone {
		return "tap0"
	}
	return "eth0"
}

// conf is the case's network config: raw as it is, or the base config with
// the case's fields put over it.
func (f *badInputFixture) conf(tc badInput) string {
	f.t.Helper()
	if tc.raw != nil {
		return f.expand(*tc.raw)
	}
	base := `"cniVersion":"1.0.0","name":"napitap-test","type":"napitap","queues":2,` +
		`"handoff":{"socket":"$SOCKET","required":true}`
	if !tc.standalone {
		base += `,"prevResult":{"cniVersion":"1.0.0",` +
			`"interfaces":[{"name":"eth0","mac":"$PEERMAC","sandbox":"$POD"}],` +
			`"ips":[{"address":"10.199.0.2/24","gateway":"10.199.0.1","interface":0}],` +
			`"routes":[{"dst":"0.0.0.0/0"}]}`
	}
	conf := decodeMembers(f.t, f.expand(base))
	maps.Copy(conf, decodeMembers(f.t, f.expand(tc.fields)))
	for _, key := range tc.omit {
		delete(conf, key)
	}
	b, err := json.Marshal(conf)
	if err != nil {
		f.t.Fatal(err)
	}
	return string(b)
}

// decodeMembers parses "a":1,"b":2 keeping numbers as written.
func decodeMembers(t *testing.T, members string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader("{" + members + "}"))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("case fields {%s}: %v", members, err)
	}
	return m
}

// execWithEnv runs napitap in the host netns with the CNI_ variables of a
// good ADD, overridden by env, and returns its stdout and how it exited.
func (f *badInputFixture) execWithEnv(conf string, env map[string]string, standalone bool) ([]byte, error) {
	f.t.Helper()
	vars := map[string]string{
		"CNI_COMMAND":     "ADD",
		"CNI_CONTAINERID": f.e.ContainerID,
		"CNI_NETNS":       f.e.Pod.Path(),
		"CNI_IFNAME":      f.ifName(badInput{standalone: standalone}),
		"CNI_PATH":        binDir,
	}
	for k, v := range env {
		vars[k] = f.expand(v)
	}
	cmd := exec.Command(filepath.Join(binDir, "napitap"))
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(vars)) {
		if vars[k] != "" {
			cmd.Env = append(cmd.Env, k+"="+vars[k])
		}
	}
	cmd.Stdin = strings.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := f.e.InHost(cmd.Run)
	if stderr.Len() > 0 {
		f.t.Logf("napitap stderr: %s", stderr.Bytes())
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		f.t.Fatalf("exec napitap: %v", err)
	}
	if err == nil {
		return stdout.Bytes(), nil
	}
	var cniErr types.Error
	if jerr := json.Unmarshal(stdout.Bytes(), &cniErr); jerr != nil {
		return stdout.Bytes(), &types.Error{Msg: fmt.Sprintf("%v, stdout %q is not a CNI error: %v", err, stdout.Bytes(), jerr)}
	}
	return stdout.Bytes(), &cniErr
}

// checkStdoutIsOneError: a failing plugin prints one CNI error and nothing
// else.
func checkStdoutIsOneError(stdout []byte, err error) []string {
	if err == nil {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(stdout))
	var docs []json.RawMessage
	for {
		var doc json.RawMessage
		if dec.Decode(&doc) != nil {
			break
		}
		docs = append(docs, doc)
	}
	if len(docs) != 1 {
		return []string{fmt.Sprintf("stdout holds %d JSON documents, want exactly the error: %s", len(docs), stdout)}
	}
	return nil
}

// snapshot describes what a failed ADD must not change, one fact a line,
// sorted: every link of the host and pod netns with its qdiscs and tc
// filters, every file under napitapd's state dir, the kataDan dir and the
// env's data dir (host-local's included), and what napitapd holds.
func (f *badInputFixture) snapshot() []string {
	f.t.Helper()
	var lines []string
	for _, n := range []struct {
		role string
		ns   *nstest.NetNS
	}{{"host", f.e.Host}, {"pod", f.e.Pod}} {
		n.ns.Run(f.t, func() error {
			links, err := linkFacts()
			for _, l := range links {
				lines = append(lines, n.role+" "+l)
			}
			if err != nil {
				return err
			}
			routes, err := routeFacts()
			for _, r := range routes {
				lines = append(lines, n.role+" "+r)
			}
			return err
		})
	}
	for _, d := range []struct{ role, dir string }{
		{"napitapd state", f.d.stateDir}, {"kataDan", f.danDir}, {"data", f.e.DataDir},
	} {
		files, err := fileFacts(d.dir)
		if err != nil {
			f.t.Fatalf("%s dir: %v", d.role, err)
		}
		for _, l := range files {
			lines = append(lines, d.role+" "+l)
		}
	}
	lines = append(lines, fmt.Sprintf("napitapd holds %d fds", f.d.srv.HeldFDs()))
	atts, err := f.d.client().List()
	if err != nil {
		f.t.Fatalf("napitapd list: %v", err)
	}
	for _, a := range atts {
		lines = append(lines, fmt.Sprintf("napitapd lists %s tap=%s netns=%s held=%d", a.Key, a.TapName, a.Netns, a.Held))
	}
	slices.Sort(lines)
	return lines
}

// routeFacts describes the routes of the current netns but link-local ones.
func routeFacts() ([]string, error) {
	routes, err := netlinksafe.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	var facts []string
	for _, r := range routes {
		if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() {
			continue // the kernel's own, and they come when IPv6 is ready
		}
		facts = append(facts, "route "+r.String())
	}
	return facts, nil
}

// linkFacts describes the links of the current netns: name, type, MAC,
// master, up, MTU, ifalias and global addresses, then each qdisc and tc
// filter.
func linkFacts() ([]string, error) {
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, err
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var facts []string
	for _, l := range links {
		a := l.Attrs()
		master := "-"
		if a.MasterIndex != 0 {
			master = names[a.MasterIndex]
		}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", a.Name, err)
		}
		var global []string
		for _, addr := range addrs {
			if !addr.IP.IsLinkLocalUnicast() { // the kernel's own, and they follow the MAC
				global = append(global, addr.IPNet.String())
			}
		}
		slices.Sort(global)
		facts = append(facts, fmt.Sprintf("link %s type=%s mac=%s master=%s up=%v mtu=%d alias=%q addrs=%v",
			a.Name, l.Type(), a.HardwareAddr, master, a.Flags&net.FlagUp != 0, a.MTU, a.Alias, global))

		qdiscs, err := netlinksafe.QdiscList(l)
		if err != nil {
			return nil, fmt.Errorf("qdiscs of %s: %w", a.Name, err)
		}
		parents := []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS}
		for _, q := range qdiscs {
			qa := q.Attrs()
			facts = append(facts, fmt.Sprintf("link %s qdisc %s handle=%s parent=%s", a.Name, q.Type(), netlink.HandleStr(qa.Handle), netlink.HandleStr(qa.Parent)))
			parents = append(parents, qa.Handle)
		}
		slices.Sort(parents)
		for _, parent := range slices.Compact(parents) {
			filters, err := netlinksafe.FilterList(l, parent)
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no such qdisc, so no filters either
			}
			if err != nil {
				return nil, fmt.Errorf("filters of %s under %s: %w", a.Name, netlink.HandleStr(parent), err)
			}
			for _, flt := range filters {
				facts = append(facts, fmt.Sprintf("link %s %s", a.Name, filterFact(flt, names)))
			}
		}
	}
	return facts, nil
}

func filterFact(flt netlink.Filter, names map[int]string) string {
	fa := flt.Attrs()
	s := fmt.Sprintf("filter %s parent=%s prio=%d proto=%#x handle=%s", flt.Type(), netlink.HandleStr(fa.Parent), fa.Priority, fa.Protocol, netlink.HandleStr(fa.Handle))
	var actions []netlink.Action
	switch flt := flt.(type) {
	case *netlink.U32:
		actions = flt.Actions
	case *netlink.MatchAll:
		actions = flt.Actions
	case *netlink.BpfFilter:
		s += " bpf=" + flt.Name
	}
	for _, act := range actions {
		if m, ok := act.(*netlink.MirredAction); ok {
			s += fmt.Sprintf(" mirred(%d to %s)", m.MirredAction, names[m.Ifindex])
		} else {
			s += " " + act.Type()
		}
	}
	return s
}

// fileFacts lists what is under dir: every directory, and every file with
// its size and a hash of its content.
func fileFacts(dir string) ([]string, error) {
	var facts []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			facts = append(facts, fmt.Sprintf("%s/ %v", rel, info.Mode()))
		case d.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			facts = append(facts, fmt.Sprintf("%s %v %d bytes sha256:%x", rel, info.Mode(), len(b), sha256.Sum256(b)))
		default:
			facts = append(facts, fmt.Sprintf("%s %v", rel, info.Mode()))
		}
		return nil
	})
	return facts, err
}

// diffLines returns the lines only in before and the lines only in after.
func diffLines(before, after []string) (gone, added []string) {
	for _, l := range before {
		if !slices.Contains(after, l) {
			gone = append(gone, l)
		}
	}
	for _, l := range after {
		if !slices.Contains(before, l) {
			added = append(added, l)
		}
	}
	return gone, added
}
