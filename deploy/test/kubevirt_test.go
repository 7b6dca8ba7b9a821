package deploytest

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/seccompprofile"
)

// The KubeVirt example fits together: the VMI's binding is registered with
// domainAttachmentType tap, its network is a napitap network whose tap
// KubeVirt finds by name and libvirt can open as uid/gid 107, and the tap's
// multiqueue mode is what the VMI asks for; virt-launcher runs under the
// profile the DaemonSet installs, so libvirt's by-name open gets NAPI.
func TestKubeVirtExample(t *testing.T) {
	objs := manifestFiles(t)
	confs, _ := napitapConfs(t, objs)
	kv := find[*KubeVirt](t, objs, "KubeVirt", "kubevirt")
	ds, _ := daemonSet(t, "deploy")
	profiles := container(t, ds.Spec.Template.Spec.InitContainers, "install-seccomp-profiles")
	dir, _ := flagValue(profiles.Command, "install")
	want := path.Join(path.Base(dir), seccompprofile.VirtLauncher+".json")
	if sc := kv.Spec.Configuration.SeccompConfiguration; sc == nil || sc.VirtualMachineInstanceProfile == nil ||
		sc.VirtualMachineInstanceProfile.CustomProfile == nil || sc.VirtualMachineInstanceProfile.CustomProfile.LocalhostProfile == nil ||
		*sc.VirtualMachineInstanceProfile.CustomProfile.LocalhostProfile != want {
		t.Errorf("the KubeVirt CR does not select the virt-launcher profile the DaemonSet installs (%s)", want)
	}
	vmi := find[*VirtualMachineInstance](t, objs, "VirtualMachineInstance", "napitap-vmi")

	networks := map[string]string{}
	for _, n := range vmi.Spec.Networks {
		if n.Multus != nil {
			networks[n.Name] = n.Multus.NetworkName
		}
	}
	vcpus := uint32(1)
	if c := vmi.Spec.Domain.CPU; c != nil {
		vcpus = max(c.Cores, 1) * max(c.Sockets, 1) * max(c.Threads, 1)
	}
	multiqueue := vmi.Spec.Domain.Devices.NetworkInterfaceMultiQueue != nil && *vmi.Spec.Domain.Devices.NetworkInterfaceMultiQueue
	bound := 0
	for _, iface := range vmi.Spec.Domain.Devices.Interfaces {
		if iface.Binding == nil {
			continue
		}
		bound++
		plugin, ok := kv.Spec.Configuration.Network.Binding[iface.Binding.Name]
		if !ok {
			t.Errorf("interface %s: binding %q is not registered in the KubeVirt CR", iface.Name, iface.Binding.Name)
		} else if plugin.DomainAttachmentType != "tap" {
			t.Errorf("binding %q: domainAttachmentType %q, want tap", iface.Binding.Name, plugin.DomainAttachmentType)
		}
		nad, ok := networks[iface.Name]
		if !ok {
			t.Errorf("interface %s has no multus network", iface.Name)
			continue
		}
		if len(confs[nad]) != 1 {
			t.Errorf("network %s: %d napitap configs", nad, len(confs[nad]))
			continue
		}
		conf := checkNapitapConf(t, confs[nad][0])
		if conf == nil {
			continue
		}
		c := confs[nad][0]
		if _, named := c.keys["tapName"]; named {
			t.Errorf("%s names its tap: KubeVirt's name depends on the pod interface, which napitap's default follows", nad)
		}
		if conf.Owner == nil || *conf.Owner != 107 || conf.Group == nil || *conf.Group != 107 {
			t.Errorf("%s: owner %v group %v, want 107 for virt-launcher's non-root libvirt", nad, conf.Owner, conf.Group)
		}
		if conf.Wiring != "tc-redirect" {
			t.Errorf("%s: wiring %s: KubeVirt copies the pod interface's MAC, which only tc-redirect keeps", nad, conf.Wiring)
		}
		if conf.HandoffMode != config.HandoffIntercept || !conf.HandoffRequired {
			t.Errorf("%s: handoff mode %q required %v: libvirt opens the tap by name, so intercept (required: no NAPI-less VM starts silently)", nad, conf.HandoffMode, conf.HandoffRequired)
		}
		if wantMQ := multiqueue && vcpus > 1; (conf.Queues > 1) != wantMQ {
			t.Errorf("%s: %d queues, but the VMI has multiqueue %v with %d vCPUs", nad, conf.Queues, multiqueue, vcpus)
		}
		if multiqueue && uint32(conf.Queues) != vcpus {
			t.Errorf("%s: %d queues for %d vCPUs", nad, conf.Queues, vcpus)
		}
	}
	if bound == 0 {
		t.Error("the VMI has no interface with a binding plugin")
	}
}

func TestKataExample(t *testing.T) {
	confs, _ := napitapConfs(t, manifestFiles(t))
	if len(confs["napitap-kata"]) != 1 {
		t.Fatal("no napitap-kata network")
	}
	c := confs["napitap-kata"][0]
	conf := checkNapitapConf(t, c)
	if conf == nil {
		return
	}
	if conf.KataDanDir == "" || conf.HandoffMode != config.HandoffIntercept {
		t.Errorf("napitap-kata: DAN dir %q, handoff mode %q: want kataDan on and intercept", conf.KataDanDir, conf.HandoffMode)
	}
}

// The Kata README's pod runs under the RuntimeClass it defines, whose
// handler is the containerd runtime of containerd-config.toml, whose shim is
// the wrapper (containerd derives the binary's name from runtime_type), and
// the wrapper execs runtime-rs, the runtime that reads DAN files. A break
// anywhere in that chain leaves the pod running with plain queues.
func TestKataPodRunsRuntimeRsUnderTheAgent(t *testing.T) {
	dir := filepath.Join(repoRoot, "deploy", "kata")
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("deploy/kata/README.md has no yaml block")
	}
	docs, err := splitYAML(block[1])
	if err != nil {
		t.Fatal(err)
	}
	var rc *nodev1.RuntimeClass
	var pod *corev1.Pod
	for i, doc := range docs {
		o, err := decodeStrict(fmt.Sprintf("deploy/kata/README.md#%d", i), doc)
		if err != nil {
			t.Fatal(err)
		}
		switch v := o.obj.(type) {
		case *nodev1.RuntimeClass:
			rc = v
		case *corev1.Pod:
			pod = v
		}
	}
	if rc == nil || pod == nil {
		t.Fatal("the README's yaml block lacks the RuntimeClass or the pod")
	}
	if got := pod.Spec.RuntimeClassName; got == nil || *got != rc.Name {
		t.Errorf("the pod's runtimeClassName is not the README's RuntimeClass %q", rc.Name)
	}
	toml, err := os.ReadFile(filepath.Join(dir, "containerd-config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	runtimeType := regexp.MustCompile(`(?m)^\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\.runtimes\.` +
		regexp.QuoteMeta(rc.Handler) + `\]\n\s*runtime_type = "io\.containerd\.([a-z0-9-]+)\.v2"`).FindSubmatch(toml)
	if runtimeType == nil {
		t.Fatalf("containerd-config.toml has no runtime %q with a runtime_type", rc.Handler)
	}
	wrapper, err := os.ReadFile(filepath.Join(dir, "containerd-shim-"+string(runtimeType[1])+"-v2"))
	if err != nil {
		t.Fatalf("runtime_type io.containerd.%s.v2 needs a shim of that name: %v", runtimeType[1], err)
	}
	if !strings.Contains(string(wrapper), "napitapctl launch") || !strings.Contains(string(wrapper), "/opt/kata/runtime-rs/bin/containerd-shim-kata-v2") {
		t.Error("the shim wrapper does not exec runtime-rs's shim through napitapctl launch")
	}
	if !strings.Contains(string(toml), "runtime-rs/configuration-") {
		t.Error("containerd-config.toml does not point ConfigPath at a runtime-rs configuration")
	}
}
