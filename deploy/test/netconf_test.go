package deploytest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	sigsjson "sigs.k8s.io/json"

	"github.com/napitap/napitap/pkg/config"
)

// napitapFields are the keys a napitap plugin config may have in a network
// attachment definition: what napitap reads, less what only a runtime
// injects (runtimeConfig, prevResult, cni.dev/valid-attachments).
var napitapFields = []string{
	"queues", "napi", "napiFrags", "threadedNapi", "groFlushTimeout", "napiDeferHardIrqs",
	"vnetHdr", "vnetHdrSize", "mtu", "mac", "txQueueLen", "rootQdisc", "owner", "group", "tapName",
	"wiring", "bridge", "ipam", "handoff", "kataDan", "args", "capabilities",
	"type", "cniVersion", "name",
}

// runtimeOnlyFields are config fields a runtime injects, or that napitap
// has from the CNI library without using them.
var runtimeOnlyFields = []string{"runtimeConfig", "prevResult", "cni.dev/valid-attachments", "dns"}

// jsonNames lists the JSON names of a struct's fields, embedded ones too.
func jsonNames(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			names = append(names, jsonNames(f.Type)...)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
	}
	return names
}

// The list above must be napitap's: neither a field napitap does not read,
// nor one it reads that the list forgot.
func TestNapitapFieldsAreConfigFields(t *testing.T) {
	have := jsonNames(reflect.TypeFor[config.NetConf]())
	for _, f := range napitapFields {
		if !slices.Contains(have, f) {
			t.Errorf("napitapFields has %q, which config.NetConf does not read", f)
		}
	}
	for _, f := range have {
		if !slices.Contains(napitapFields, f) && !slices.Contains(runtimeOnlyFields, f) {
			t.Errorf("config.NetConf reads %q: add it to napitapFields (or runtimeOnlyFields)", f)
		}
	}
}

// napitapConf is one napitap plugin config of a network.
type napitapConf struct {
	source string // the NetworkAttachmentDefinition
	nad    string
	keys   map[string]json.RawMessage
	raw    []byte // as the runtime would pass it: cniVersion and name set
}

func (c napitapConf) get(key string, v any) bool {
	raw, ok := c.keys[key]
	if !ok {
		return false
	}
	if err := json.Unmarshal(raw, v); err != nil {
		panic(fmt.Sprintf("%s: %s: %v", c.source, key, err))
	}
	return true
}

// withArgs is the config with a pod's cni-args as Multus adds them.
func (c napitapConf) withArgs(t *testing.T, cniArgs map[string]json.RawMessage) []byte {
	t.Helper()
	keys := maps.Clone(c.keys)
	b, err := json.Marshal(map[string]any{"cni": cniArgs})
	if err != nil {
		t.Fatal(err)
	}
	keys["args"] = b
	out, err := json.Marshal(keys)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decodeJSONStrict decodes one JSON value with unknown, duplicate and
// wrongly cased fields rejected.
func decodeJSONStrict(b []byte, v any) error {
	strictErrs, err := sigsjson.UnmarshalStrict(b, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// napitapConfs finds the napitap plugin configs of every network
// attachment definition in objs; the definitions' own JSON must be well
// formed and of the CNI spec's shape.
func napitapConfs(t *testing.T, objs []object) (map[string][]napitapConf, map[string]bool) {
	t.Helper()
	confs := map[string][]napitapConf{}
	nads := map[string]bool{}
	for _, o := range objs {
		nad, ok := o.obj.(*NetworkAttachmentDefinition)
		if !ok {
			continue
		}
		nads[o.name] = true
		cfg := []byte(nad.Spec.Config)
		var top map[string]json.RawMessage
		if err := json.Unmarshal(cfg, &top); err != nil {
			t.Errorf("%s: spec.config is not a JSON object: %v", o, err)
			continue
		}
		var name, version string
		_ = json.Unmarshal(top["name"], &name)
		_ = json.Unmarshal(top["cniVersion"], &version)
		if name != o.name {
			t.Errorf("%s: config name %q differs from the definition's", o, name)
		}
		if !slices.Contains(config.SupportedVersions, version) {
			t.Errorf("%s: cniVersion %q is not one napitap speaks", o, version)
		}
		plugins := []json.RawMessage{cfg}
		if _, isList := top["plugins"]; isList {
			var list confList
			if err := decodeJSONStrict(cfg, &list); err != nil {
				t.Errorf("%s: config list: %v", o, err)
				continue
			}
			plugins = list.Plugins
		}
		for _, p := range plugins {
			var keys map[string]json.RawMessage
			if err := json.Unmarshal(p, &keys); err != nil {
				t.Errorf("%s: plugin config: %v", o, err)
				continue
			}
			var typ string
			_ = json.Unmarshal(keys["type"], &typ)
			if typ == "" {
				t.Errorf("%s: a plugin without type", o)
			}
			if typ != "napitap" {
				continue
			}
			// A list gives its plugins its name and version.
			for k, v := range map[string]string{"name": name, "cniVersion": version} {
				if _, ok := keys[k]; !ok {
					keys[k], _ = json.Marshal(v)
				}
			}
			raw, _ := json.Marshal(keys)
			confs[o.name] = append(confs[o.name], napitapConf{source: o.String(), nad: o.name, keys: keys, raw: raw})
		}
	}
	return confs, nads
}

// podArgsHolder is a config's "args": napitap reads only "cni" there.
type podArgsHolder struct {
	CNI json.RawMessage `json:"cni,omitempty"`
}

// checkNapitapConf: only fields napitap reads, sub-objects of napitap's
// shape, and napitap's own validation passes.
func checkNapitapConf(t reporter, c napitapConf) *config.Config {
	t.Helper()
	for k := range c.keys {
		if !slices.Contains(napitapFields, k) {
			t.Errorf("%s: napitap has no field %q (it has %s)", c.source, k, strings.Join(napitapFields, ", "))
		}
	}
	strict := map[string]any{
		"handoff": &config.HandoffConf{},
		"kataDan": &config.KataDanConf{},
		"args":    &podArgsHolder{},
	}
	for k, v := range strict {
		if raw, ok := c.keys[k]; ok {
			if err := decodeJSONStrict(raw, v); err != nil {
				t.Errorf("%s: %s: %v", c.source, k, err)
			}
		}
	}
	if args := strict["args"].(*podArgsHolder); args.CNI != nil {
		if err := decodeJSONStrict(args.CNI, &config.PodArgs{}); err != nil {
			t.Errorf("%s: args.cni: %v", c.source, err)
		}
	}
	var caps map[string]bool
	if c.get("capabilities", &caps) {
		for k := range caps {
			if k != "mac" {
				t.Errorf("%s: napitap has no capability %q (only mac)", c.source, k)
			}
		}
	}
	// Queues napitapd holds while a runtime opens the tap by name would
	// take traffic nobody reads (DESIGN.md fact 7): Kata runtime-rs does.
	conf, err := config.Load(c.raw, config.Attachment{ContainerID: "deploytest", IfName: "net1"})
	if err != nil {
		t.Errorf("%s: napitap rejects its config: %v", c.source, err)
		return nil
	}
	if conf.KataDanDir != "" && !conf.RuntimeOpensByName() {
		t.Errorf("%s: kataDan with handoff mode %q", c.source, conf.HandoffMode)
	}
	return conf
}

func TestNetworkConfigs(t *testing.T) {
	objs := manifestFiles(t)
	confs, nads := napitapConfs(t, objs)
	for _, want := range []string{"napitap-bridge", "napitap-standalone", "napitap-kubevirt", "napitap-kata"} {
		if len(confs[want]) != 1 {
			t.Errorf("network %s: %d napitap configs, want 1", want, len(confs[want]))
		}
	}
	if len(nads) < 4 {
		t.Errorf("only %d networks", len(nads))
	}
	for _, cs := range confs {
		for _, c := range cs {
			t.Run(c.nad, func(t *testing.T) {
				conf := checkNapitapConf(t, c)
				if conf != nil {
					t.Logf("%s: tap %q, %d queues, napi %v, wiring %s, hand-off socket %q required %v",
						c.nad, conf.TapName, conf.Queues, conf.NAPI, conf.Wiring, conf.HandoffSocket, conf.HandoffRequired)
				}
			})
		}
	}

	bridge := checkNapitapConf(t, confs["napitap-bridge"][0])
	if bridge != nil && (bridge.Wiring != config.WiringTCRedirect || bridge.Queues != 4 || !bridge.HandoffRequired || bridge.TapName != "tap1") {
		t.Errorf("napitap-bridge: %+v, want tc-redirect, 4 queues, hand-off required, tap1 for net1", bridge)
	}
	standalone := checkNapitapConf(t, confs["napitap-standalone"][0])
	if standalone != nil && (standalone.Wiring != config.WiringNone || standalone.IPAM.Type != "host-local" || standalone.TapName != "net1") {
		t.Errorf("napitap-standalone: %+v, want wiring none, host-local, the tap as net1", standalone)
	}
}

// The config checks must bite too.
func TestNetworkConfigChecksRejectMistakes(t *testing.T) {
	for name, plugin := range map[string]string{
		"misspelt field":   `{"type":"napitap","queue":4}`,
		"misspelt handoff": `{"type":"napitap","handoff":{"require":true}}`,
		"bad queues":       `{"type":"napitap","queues":300}`,
		"kata + hand-off":  `{"type":"napitap","kataDan":{"enabled":true}}`,
		"pod arg":          `{"type":"napitap","args":{"cni":{"queue":2}}}`,
		"capability":       `{"type":"napitap","capabilities":{"ips":true}}`,
		"wrong case":       `{"type":"napitap","handoff":{"Required":true}}`,
	} {
		nad := &NetworkAttachmentDefinition{}
		nad.Spec.Config = `{"cniVersion":"1.0.0","name":"x","plugins":[` + plugin + `]}`
		confs, _ := napitapConfs(t, []object{{name: "x", kind: "NetworkAttachmentDefinition", obj: nad}})
		rec := &recorder{}
		checkNapitapConf(rec, confs["x"][0])
		if len(rec.errs) == 0 {
			t.Errorf("%s: %s passed", name, plugin)
		} else {
			t.Logf("%s: %s", name, rec.errs[0])
		}
	}
}

// reporter is the part of testing.T the config checks use.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// recorder collects what the checks report, for testing the checks.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// Pods name networks that exist, with cni-args napitap takes.
func TestPodNetworkSelections(t *testing.T) {
	objs := manifestFiles(t)
	confs, nads := napitapConfs(t, objs)
	pods := 0
	for _, o := range objs {
		pod, ok := o.obj.(interface{ GetAnnotations() map[string]string })
		if !ok || o.kind != "Pod" {
			continue
		}
		ann, ok := pod.GetAnnotations()["k8s.v1.cni.cncf.io/networks"]
		if !ok {
			continue
		}
		pods++
		var sels []NetworkSelection
		if err := decodeJSONStrict([]byte(ann), &sels); err != nil {
			t.Errorf("%s: networks annotation: %v", o, err)
			continue
		}
		for _, sel := range sels {
			if !nads[sel.Name] {
				t.Errorf("%s: network %q is defined nowhere here", o, sel.Name)
				continue
			}
			ifName := sel.Interface
			if ifName == "" {
				ifName = "net1"
			}
			for _, c := range confs[sel.Name] {
				for k := range sel.CNIArgs {
					if !slices.Contains(jsonNames(reflect.TypeFor[config.PodArgs]()), k) {
						t.Errorf("%s: cni-args %q: napitap takes only %v", o, k, jsonNames(reflect.TypeFor[config.PodArgs]()))
					}
				}
				conf, err := config.Load(c.withArgs(t, sel.CNIArgs), config.Attachment{ContainerID: "deploytest", IfName: ifName})
				if err != nil {
					t.Errorf("%s: napitap rejects network %s with its cni-args: %v", o, sel.Name, err)
					continue
				}
				t.Logf("%s: %s on %s: tap %s, %d queues, threaded %v", o, ifName, sel.Name, conf.TapName, conf.Queues, conf.ThreadedNAPI)
			}
		}
	}
	if pods < 3 {
		t.Errorf("only %d pods with networks (the example and two e2e pods expected)", pods)
	}
}
