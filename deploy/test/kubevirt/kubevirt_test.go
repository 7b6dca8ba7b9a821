package kubevirttest

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kubevirtv1 "kubevirt.io/api/core/v1"
	sigsjson "sigs.k8s.io/json"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/seccompprofile"
)

// repoRoot is the napitap checkout this module sits in (deploy/test/kubevirt).
var repoRoot = func() string {
	abs, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

// kubevirtKinds are the kubevirt.io/v1 kinds the manifests may hold, as
// KubeVirt's API server would decode them.
var kubevirtKinds = map[string]func() any{
	"KubeVirt":       func() any { return &kubevirtv1.KubeVirt{} },
	"VirtualMachine": func() any { return &kubevirtv1.VirtualMachine{} },
}

// object is one YAML document of deploy/.
type object struct {
	source     string // file#document, for messages
	apiVersion string
	kind       string
	name       string
	obj        any // a kubevirtKinds type, *nad or *appsv1.DaemonSet; nil for the rest
}

// nad is a NetworkAttachmentDefinition's config. deploy/test decodes NADs
// strictly; here only the config matters.
type nad struct {
	Spec struct {
		Config string `json:"config"`
	} `json:"spec"`
}

// unmarshalStrict decodes YAML as the API server's strict field validation
// does: field names match case-sensitively, and unknown or duplicate fields
// fail. KubeVirt's VirtualMachineInstanceSpec, PodNetwork and DHCPOptions
// decode themselves with encoding/json (their UnmarshalJSON, kubevirt.io/api
// core/v1), which drops unknown fields and matches names in any case, so
// the object must also marshal back to everything the document said.
func unmarshalStrict(doc []byte, v any) error {
	j, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	if err := errors.Join(strictErrs...); err != nil {
		return err
	}
	back, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var in, out any
	if err := json.Unmarshal(j, &in); err != nil {
		return err
	}
	if err := json.Unmarshal(back, &out); err != nil {
		return err
	}
	return errors.Join(lost("", in, out)...)
}

// lost lists what of in is not in out: a field the type dropped, or a value
// it changed.
func lost(at string, in, out any) []error {
	inMap, ok := in.(map[string]any)
	if !ok {
		if fmt.Sprint(in) != fmt.Sprint(out) {
			return []error{fmt.Errorf("field %q: %v decodes as %v", at, in, out)}
		}
		return nil
	}
	outMap, _ := out.(map[string]any)
	var errs []error
	for k, v := range inMap {
		w, ok := outMap[k]
		if !ok {
			errs = append(errs, fmt.Errorf("unknown field %q", strings.TrimPrefix(at+"."+k, ".")))
			continue
		}
		errs = append(errs, lost(strings.TrimPrefix(at+"."+k, "."), v, w)...)
	}
	return errs
}

// decode decodes one document: a kubevirt.io object strictly into
// kubevirt.io/api's type, a NAD or DaemonSet loosely (kubevirt.io/api pins
// an older k8s.io/api than the DaemonSet may be written for; deploy/test
// decodes both strictly), anything else not at all.
func decode(source string, doc []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := sigsyaml.Unmarshal(doc, &head); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	o := object{source: source, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name}
	switch {
	case strings.HasPrefix(head.APIVersion, "kubevirt.io/"):
		newObj, ok := kubevirtKinds[head.Kind]
		if head.APIVersion != "kubevirt.io/v1" || !ok {
			return o, fmt.Errorf("%s: %s %s is not a kind this suite decodes: add it to kubevirtKinds", source, head.APIVersion, head.Kind)
		}
		o.obj = newObj()
		if err := unmarshalStrict(doc, o.obj); err != nil {
			return o, fmt.Errorf("%s: %s %s: %w", source, head.Kind, head.Metadata.Name, err)
		}
		return o, nil
	case head.APIVersion == "k8s.cni.cncf.io/v1" && head.Kind == "NetworkAttachmentDefinition":
		o.obj = &nad{}
	case head.APIVersion == "apps/v1" && head.Kind == "DaemonSet":
		o.obj = &appsv1.DaemonSet{}
	default:
		return o, nil
	}
	if err := sigsyaml.Unmarshal(doc, o.obj); err != nil {
		return o, fmt.Errorf("%s: %s %s: %w", source, head.Kind, head.Metadata.Name, err)
	}
	return o, nil
}

// splitYAML splits a multi-document file, dropping documents of comments
// only.
func splitYAML(b []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := sigsyaml.Unmarshal(d, &v); err == nil && v == nil {
			continue
		}
		docs = append(docs, d)
	}
}

// deployObjects decodes every YAML document under deploy/, kustomizations
// and the test suites aside.
func deployObjects(t *testing.T) []object {
	t.Helper()
	var objs []object
	err := filepath.WalkDir(filepath.Join(repoRoot, "deploy"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == filepath.Join(repoRoot, "deploy", "test") {
			return filepath.SkipDir
		}
		ext := filepath.Ext(p)
		if d.IsDir() || (ext != ".yaml" && ext != ".yml") || d.Name() == "kustomization.yaml" || d.Name() == "kustomization.yml" {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repoRoot, p)
		docs, err := splitYAML(b)
		if err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		for i, doc := range docs {
			o, err := decode(fmt.Sprintf("%s#%d", rel, i), doc)
			if err != nil {
				t.Error(err)
				continue
			}
			objs = append(objs, o)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find[T any](t *testing.T, objs []object, kind, name string) T {
	t.Helper()
	for _, o := range objs {
		if o.kind == kind && o.name == name {
			if v, ok := o.obj.(T); ok {
				return v
			}
		}
	}
	t.Fatalf("deploy/ has no %s %q", kind, name)
	panic("unreachable")
}

func TestEveryKubeVirtManifestDecodesIntoKubeVirtsTypes(t *testing.T) {
	n := 0
	for _, o := range deployObjects(t) {
		if strings.HasPrefix(o.apiVersion, "kubevirt.io/") {
			t.Logf("%s %s/%s (%s)", o.apiVersion, o.kind, o.name, o.source)
			n++
		}
	}
	if n < 2 {
		t.Errorf("%d kubevirt.io objects under deploy/, want the KubeVirt patch and the VM", n)
	}
}

// The strict decoding is what the other tests rely on: prove it bites.
func TestStrictDecodingRejectsWhatKubeVirtsAPIDoesNot(t *testing.T) {
	for _, tc := range []struct{ name, doc string }{
		{"a VM field spelt in the wrong case", "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      domain:\n        devices: {networkInterfaceMultiQueue: true}\n"},
		{"a binding field KubeVirt does not have", "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: x}\nspec:\n  configuration:\n    network:\n      binding:\n        napitap: {domainAttachment: tap}\n"},
		{"a seccomp profile in the wrong place", "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: x}\nspec:\n  configuration:\n    seccompConfiguration:\n      customProfile: {localhostProfile: napitap/virt-launcher.json}\n"},
		{"a duplicate field", "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata: {name: x}\nspec: {}\nspec: {}\n"},
		{"a kubevirt.io kind this suite does not know", "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstanceReplicaSet\nmetadata: {name: x}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decode(tc.name, []byte(tc.doc)); err == nil {
				t.Error("decoded")
			} else {
				t.Log(err)
			}
		})
	}
}

// hashedPodIfaceName is KubeVirt's name for a secondary network's pod
// interface: "pod" + the first 11 hex digits of sha256(network name)
// (kubevirt pkg/network/namescheme GenerateHashedInterfaceName, v1.1.1 to
// v1.9.0). Older pods, and migration targets of such pods, use net1, net2...
func hashedPodIfaceName(network string) string {
	return fmt.Sprintf("pod%x", sha256.Sum256([]byte(network)))[:14]
}

// napitapConf is the napitap plugin config of a NAD's config list, as the
// runtime passes it (the list's name and cniVersion set).
func napitapConf(nadConfig string) (keys map[string]json.RawMessage, raw []byte, err error) {
	var list struct {
		CNIVersion string                       `json:"cniVersion"`
		Name       string                       `json:"name"`
		Plugins    []map[string]json.RawMessage `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(nadConfig), &list); err != nil {
		return nil, nil, fmt.Errorf("config list: %w", err)
	}
	for _, p := range list.Plugins {
		if string(p["type"]) != `"napitap"` {
			continue
		}
		p["name"], _ = json.Marshal(list.Name)
		p["cniVersion"], _ = json.Marshal(list.CNIVersion)
		raw, err := json.Marshal(p)
		return p, raw, err
	}
	return nil, nil, errors.New("no napitap plugin in the config list")
}

// exampleVMSpec is the spec of the VM deploy/kubevirt/vm.yaml runs.
func exampleVMSpec(t *testing.T, objs []object) kubevirtv1.VirtualMachineInstanceSpec {
	t.Helper()
	vm := find[*kubevirtv1.VirtualMachine](t, objs, "VirtualMachine", "napitap-vm1")
	if vm.Spec.Template == nil {
		t.Fatal("the VM has no template")
	}
	return vm.Spec.Template.Spec
}

// networksByName is spec's networks, by the name its interfaces use.
func networksByName(spec kubevirtv1.VirtualMachineInstanceSpec) map[string]kubevirtv1.Network {
	networks := map[string]kubevirtv1.Network{}
	for _, n := range spec.Networks {
		networks[n.Name] = n
	}
	return networks
}

// The KubeVirt example fits together: the VM's binding is registered with
// domainAttachmentType tap, its network is a napitap network whose tap
// KubeVirt finds by name and a non-root VMI's libvirt (uid/gid 107) can
// open, the tap's multiqueue mode is what the VMI asks for, and
// virt-launcher runs under the profile the DaemonSet installs, so that
// libvirt's by-name open gets NAPI.
func TestTheKubeVirtExampleFitsTogether(t *testing.T) {
	objs := deployObjects(t)
	kv := find[*kubevirtv1.KubeVirt](t, objs, "KubeVirt", "kubevirt")
	spec := exampleVMSpec(t, objs)
	ds := find[*appsv1.DaemonSet](t, objs, "DaemonSet", "napitap")

	var installDir string
	for _, c := range ds.Spec.Template.Spec.InitContainers {
		for _, a := range c.Command {
			if v, ok := strings.CutPrefix(a, "--install="); ok && c.Name == "install-seccomp-profiles" {
				installDir = v
			}
		}
	}
	if installDir == "" {
		t.Fatal("the DaemonSet has no install-seccomp-profiles init container with --install=")
	}
	// localhostProfile is relative to the kubelet's seccomp dir, where the
	// DaemonSet installs napitap's profiles in a directory of their own.
	want := path.Join(path.Base(installDir), seccompprofile.VirtLauncher+".json")
	if sc := kv.Spec.Configuration.SeccompConfiguration; sc == nil || sc.VirtualMachineInstanceProfile == nil ||
		sc.VirtualMachineInstanceProfile.CustomProfile == nil || sc.VirtualMachineInstanceProfile.CustomProfile.LocalhostProfile == nil ||
		*sc.VirtualMachineInstanceProfile.CustomProfile.LocalhostProfile != want {
		t.Errorf("the KubeVirt CR does not select the virt-launcher profile the DaemonSet installs (%s)", want)
	}
	if kv.Spec.Configuration.NetworkConfiguration == nil {
		t.Fatal("the KubeVirt CR registers no network binding")
	}

	nads := map[string]*nad{}
	for _, o := range objs {
		if n, ok := o.obj.(*nad); ok && strings.HasPrefix(o.source, filepath.Join("deploy", "kubevirt")+"/") {
			nads[o.name] = n
		}
	}
	networks := networksByName(spec)
	vcpus := uint32(1)
	if c := spec.Domain.CPU; c != nil {
		vcpus = max(c.Cores, 1) * max(c.Sockets, 1) * max(c.Threads, 1)
	}
	multiqueue := spec.Domain.Devices.NetworkInterfaceMultiQueue != nil && *spec.Domain.Devices.NetworkInterfaceMultiQueue

	bound := 0
	for _, iface := range spec.Domain.Devices.Interfaces {
		if iface.Binding == nil {
			continue
		}
		bound++
		plugin, ok := kv.Spec.Configuration.NetworkConfiguration.Binding[iface.Binding.Name]
		if !ok {
			t.Errorf("interface %s: binding %q is not registered in the KubeVirt CR", iface.Name, iface.Binding.Name)
		} else if plugin.DomainAttachmentType != kubevirtv1.Tap {
			t.Errorf("binding %q: domainAttachmentType %q, want %q", iface.Binding.Name, plugin.DomainAttachmentType, kubevirtv1.Tap)
		}
		network, ok := networks[iface.Name]
		if !ok || network.Multus == nil {
			t.Errorf("interface %s has no multus network", iface.Name)
			continue
		}
		n, ok := nads[network.Multus.NetworkName]
		if !ok {
			t.Errorf("interface %s: network %s is not a NAD of deploy/kubevirt", iface.Name, network.Multus.NetworkName)
			continue
		}
		keys, raw, err := napitapConf(n.Spec.Config)
		if err != nil {
			t.Errorf("NAD %s: %v", network.Multus.NetworkName, err)
			continue
		}
		if _, named := keys["tapName"]; named {
			t.Errorf("NAD %s names its tap: KubeVirt's name follows the pod interface's, and so does napitap's default", network.Multus.NetworkName)
		}
		// KubeVirt's tap: "tap" + the pod interface's name less its first
		// three letters (kubevirt pkg/network/link GenerateTapDeviceName).
		for _, podIface := range []string{hashedPodIfaceName(iface.Name), "net1"} {
			conf, err := config.Load(raw, config.Attachment{ContainerID: "kubevirttest", IfName: podIface})
			if err != nil {
				t.Errorf("NAD %s: napitap rejects its config: %v", network.Multus.NetworkName, err)
				break
			}
			if want := "tap" + podIface[3:]; conf.TapName != want {
				t.Errorf("NAD %s, pod interface %s: napitap's tap is %s, KubeVirt's domain points at %s", network.Multus.NetworkName, podIface, conf.TapName, want)
			}
		}
		conf, err := config.Load(raw, config.Attachment{ContainerID: "kubevirttest", IfName: hashedPodIfaceName(iface.Name)})
		if err != nil {
			continue
		}
		if conf.Owner == nil || *conf.Owner != 107 || conf.Group == nil || *conf.Group != 107 {
			t.Errorf("NAD %s: owner %v group %v, want 107 for a non-root VMI's libvirt", network.Multus.NetworkName, conf.Owner, conf.Group)
		}
		if conf.Wiring != config.WiringTCRedirect {
			t.Errorf("NAD %s: wiring %s: KubeVirt copies the pod interface's MAC to the domain, which only tc-redirect keeps", network.Multus.NetworkName, conf.Wiring)
		}
		if conf.HandoffMode != config.HandoffIntercept || !conf.HandoffRequired {
			t.Errorf("NAD %s: handoff mode %q required %v: libvirt opens the tap by name, so intercept, required so that no VM starts without NAPI", network.Multus.NetworkName, conf.HandoffMode, conf.HandoffRequired)
		}
		if wantMQ := multiqueue && vcpus > 1; (conf.Queues > 1) != wantMQ {
			t.Errorf("NAD %s: %d queues, but the VM has networkInterfaceMultiqueue %v with %d vCPUs", network.Multus.NetworkName, conf.Queues, multiqueue, vcpus)
		}
		if multiqueue && uint32(conf.Queues) != vcpus {
			t.Errorf("NAD %s: %d queues for %d vCPUs", network.Multus.NetworkName, conf.Queues, vcpus)
		}
	}
	if bound == 0 {
		t.Error("the VM has no interface with a binding plugin")
	}
}

// With a tap binding KubeVirt runs no DHCP server for the guest, so the
// example VM's cloud-init must give each NIC what the network gives its
// pod interface: the napitap NIC the NAD's static address, matched by the
// MAC the VM fixes, and the pod network's NIC DHCP (cloud-init's network
// config replaces the image's whole one).
func TestTheKubeVirtVMsCloudInitGivesEachNICItsNetworksAddress(t *testing.T) {
	objs := deployObjects(t)
	spec := exampleVMSpec(t, objs)
	var networkData string
	for _, v := range spec.Volumes {
		if v.CloudInitNoCloud != nil {
			networkData = v.CloudInitNoCloud.NetworkData
		}
	}
	var nd struct {
		Version   int `json:"version"`
		Ethernets map[string]struct {
			Match struct {
				MACAddress string `json:"macaddress"`
			} `json:"match"`
			DHCP4     bool     `json:"dhcp4"`
			Addresses []string `json:"addresses"`
		} `json:"ethernets"`
	}
	if err := sigsyaml.UnmarshalStrict([]byte(networkData), &nd); err != nil || nd.Version != 2 {
		t.Fatalf("the VM's cloud-init networkData is not a version 2 network config this test reads (%v):\n%s", err, networkData)
	}
	byMAC := map[string][]string{}
	dhcp := map[string]bool{}
	for name, e := range nd.Ethernets {
		if e.Match.MACAddress == "" {
			t.Errorf("networkData ethernets %s matches no MAC: which NIC it is depends on the guest's device order", name)
		}
		byMAC[strings.ToLower(e.Match.MACAddress)] = e.Addresses
		dhcp[strings.ToLower(e.Match.MACAddress)] = e.DHCP4
	}

	networks := networksByName(spec)
	nads := map[string]*nad{}
	for _, o := range objs {
		if n, ok := o.obj.(*nad); ok {
			nads[o.name] = n
		}
	}
	for _, iface := range spec.Domain.Devices.Interfaces {
		mac := strings.ToLower(iface.MacAddress)
		if mac == "" {
			t.Errorf("interface %s has no fixed MAC for cloud-init to match", iface.Name)
			continue
		}
		if _, ok := byMAC[mac]; !ok {
			t.Errorf("interface %s (MAC %s): no networkData entry matches it", iface.Name, mac)
			continue
		}
		network := networks[iface.Name]
		if network.Pod != nil {
			if !dhcp[mac] {
				t.Errorf("interface %s is the pod network's: its networkData entry must use DHCP (KubeVirt's masquerade binding serves it)", iface.Name)
			}
			continue
		}
		if network.Multus == nil || nads[network.Multus.NetworkName] == nil {
			t.Errorf("interface %s: its network is not a NAD under deploy/", iface.Name)
			continue
		}
		var list struct {
			Plugins []struct {
				IPAM struct {
					Type      string `json:"type"`
					Addresses []struct {
						Address string `json:"address"`
					} `json:"addresses"`
				} `json:"ipam"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal([]byte(nads[network.Multus.NetworkName].Spec.Config), &list); err != nil || len(list.Plugins) == 0 {
			t.Errorf("NAD %s: %v", network.Multus.NetworkName, err)
			continue
		}
		ipam := list.Plugins[0].IPAM
		if ipam.Type != "static" {
			t.Errorf("NAD %s: IPAM %q: only a static address can be the one cloud-init gives the guest", network.Multus.NetworkName, ipam.Type)
			continue
		}
		var want []string
		for _, a := range ipam.Addresses {
			want = append(want, a.Address)
		}
		if got := byMAC[mac]; strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("interface %s: cloud-init gives the guest %v, the NAD's IPAM gives its pod interface %v", iface.Name, got, want)
		}
	}
}
