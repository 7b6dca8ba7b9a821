package suite

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

// The KubeVirt test: KubeVirt v1.7.0 as run.sh installs it with KUBEVIRT=1
// (make kubevirt-images, its operator and CR, useEmulation, napitap's
// patch deploy/kubevirt/kubevirt-patch.yaml), and VirtualMachines whose
// one NIC is on a napitap network through Multus, bound with napitap's
// binding (domainAttachmentType: tap). The guest is the suite's kernel and
// initramfs booted by KubeVirt itself (spec.domain.firmware.kernelBoot)
// from an image built here; its address comes from the kernel's command
// line, as KubeVirt runs no DHCP for a tap binding.

const (
	// kubeVirtGuestRef holds the guest's kernel and initramfs, for
	// kernelBoot.container.
	kubeVirtGuestRef = "napitap.local/kubevirt-guest:e2e"
	// kubeVirtNetwork is the VMI's network (and interface) name:
	// KubeVirt's pod interface and tap are named from it.
	kubeVirtNetwork = "napitap"
	kubeVirtLabel   = "napitap-kind-kubevirt"
)

// kubeVirtInit is the guest's first process: the suite's /init with the
// script read from the initramfs, as KubeVirt gives a guest no fw_cfg
// entry for it.
const kubeVirtInit = `#!/bin/busybox sh
/bin/busybox sed 's|^S=/sys/firmware/qemu_fw_cfg/.*|S=/kubevirt/script|' /init >/kubevirt/init.sh
if ! /bin/busybox grep -q '^S=/kubevirt/script$' /kubevirt/init.sh; then
	echo "` + vm.MarkerError + ` the suite's /init reads no S= line"
	exec /bin/busybox sleep 1000000
fi
exec /bin/busybox sh /kubevirt/init.sh
`

// kvCase is one VirtualMachine: its NAD, multiqueue or not, and whether
// the network gives NAPI.
type kvCase struct {
	name, nad  string
	multiqueue bool
	napi       bool
	vcpus      int
	ip, mac    string
}

// TestKubeVirtVMsOnNapitapNetworks runs a VirtualMachine on a napitap
// network with and without networkInterfaceMultiqueue, and the same VM on
// a network with napi false (the control): each boots, its guest pings
// the gateway on the worker's napitap0, and napitapctl queues, in the
// worker's napitap pod, shows virt-launcher's QEMU holding the tap's
// queues with NAPI (without, for the control).
func TestKubeVirtVMsOnNapitapNetworks(t *testing.T) {
	if os.Getenv("NAPITAP_KIND_KUBEVIRT") != "1" {
		// Not asked for: run.sh sets it with KUBEVIRT=1, which installs
		// KubeVirt. Asked for, nothing below skips.
		t.Skip("KubeVirt is installed only by KUBEVIRT=1 test/e2e/kind/run.sh (KUBEVIRT=1 make e2e-kind)")
	}
	k := cluster
	start := time.Now()
	k.kubectlMust(t, "delete", "vm", "-n", podNamespace, "-l", "app.kubernetes.io/name="+kubeVirtLabel, "--wait=true", "--timeout=180s", "--ignore-not-found")
	out := k.kubectlMust(t, "get", "kubevirt", "-n", "kubevirt", "kubevirt", "-o",
		`jsonpath={.status.phase} {.status.observedKubeVirtVersion} {.spec.configuration.developerConfiguration.useEmulation} {.spec.configuration.network.binding.napitap.domainAttachmentType} {.spec.configuration.seccompConfiguration.virtualMachineInstanceProfile.customProfile.localhostProfile}`)
	if f := strings.Fields(out); len(f) != 5 || f[0] != "Deployed" || f[2] != "true" || f[3] != "tap" || f[4] != "napitap/virt-launcher.json" {
		t.Fatalf("KubeVirt CR: phase, version, useEmulation, napitap binding, profile = %q; want Deployed, useEmulation true, napitap's patch", out)
	}
	t.Logf("KubeVirt CR: phase, version, useEmulation, binding napitap, virt-launcher profile: %s", out)
	for _, w := range k.workers {
		if _, err := onNode(w, "test", "-e", "/dev/vhost-net"); err == nil {
			t.Logf("worker %s has /dev/vhost-net", w)
		} else {
			t.Logf("worker %s has no /dev/vhost-net", w)
		}
	}
	k.buildKubeVirtGuestImage(t)

	// The shipped NAD (4 queues, NAPI) and copies of it: one queue, for a
	// VM without multiqueue (the modes must match, the counts need not);
	// and each with napi false, the control.
	k.kubectlMust(t, "apply", "-n", podNamespace, "-f", filepath.Join(k.repo, "deploy", "kubevirt", "nad.yaml"))
	nads := map[string]func(map[string]any){
		"napitap-kubevirt-1q":        func(p map[string]any) { p["queues"] = 1 },
		"napitap-kubevirt-nonapi":    func(p map[string]any) { p["napi"] = false },
		"napitap-kubevirt-1q-nonapi": func(p map[string]any) { p["queues"], p["napi"] = 1, false },
	}
	for name, edit := range nads {
		k.apply(t, k.kubeVirtNAD(t, name, edit))
		t.Cleanup(func() {
			k.kubectl("delete", "net-attach-def", "-n", podNamespace, name, "--ignore-not-found")
		})
	}

	w := k.workers[0]
	cases := []kvCase{
		{name: "kv-napi-1q", nad: "napitap-kubevirt-1q", napi: true, vcpus: 2},
		{name: "kv-nonapi-1q", nad: "napitap-kubevirt-1q-nonapi", napi: false, vcpus: 2},
		{name: "kv-napi-mq", nad: "napitap-kubevirt", multiqueue: true, napi: true, vcpus: 2},
		{name: "kv-nonapi-mq", nad: "napitap-kubevirt-nonapi", multiqueue: true, napi: false, vcpus: 2},
	}
	for i := range cases {
		c := &cases[i]
		c.ip, c.mac = fmt.Sprintf("10.198.0.%d/24", 230+i), fmt.Sprintf("02:00:0a:c6:00:%02x", 230+i)
		t.Run(c.name, func(t *testing.T) { k.runKubeVirtVM(t, w, c) })
	}
	t.Logf("KubeVirt test in %v", time.Since(start).Round(time.Second))
}

// kubeVirtNAD is deploy/kubevirt/nad.yaml under another name, its napitap
// plugin changed by edit.
func (k *kind) kubeVirtNAD(t *testing.T, name string, edit func(map[string]any)) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(k.repo, "deploy", "kubevirt", "nad.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The config is the NAD's one JSON block.
	m := regexp.MustCompile(`(?s)config: \|\n(.*)`).FindSubmatch(raw)
	if m == nil {
		t.Fatal("deploy/kubevirt/nad.yaml: no config")
	}
	var conf map[string]any
	if err := json.Unmarshal(m[1], &conf); err != nil {
		t.Fatalf("deploy/kubevirt/nad.yaml's config: %v", err)
	}
	conf["name"] = name
	for _, p := range conf["plugins"].([]any) {
		if p := p.(map[string]any); p["type"] == "napitap" && edit != nil {
			edit(p)
		}
	}
	b, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{
		"apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{"name": name, "namespace": podNamespace},
		"spec":     map[string]any{"config": string(b)},
	}
}

// buildKubeVirtGuestImage packs the suite's guest kernel and an initramfs
// (the suite's, with kubeVirtInit and the ping script appended) into
// kubeVirtGuestRef, which KubeVirt's kernel boot copies them out of, and
// loads it into the nodes.
func (k *kind) buildKubeVirtGuestImage(t *testing.T) {
	t.Helper()
	kernel, initrd, err := vm.Artifacts(filepath.Join(k.repo, ".cache", "vm"))
	if err != nil {
		t.Fatal(err)
	}
	kernelData, err := os.ReadFile(kernel)
	if err != nil {
		t.Fatal(err)
	}
	// KubeVirt v1.7.0's virt-handler writes each file's CRC32 (a uint32)
	// into the VMI's status.kernelBootStatus, whose CRD schema says
	// "format: int32"; the apiserver checks that format from Kubernetes
	// 1.36 and refuses a value above MaxInt32 ("Checked value must be of
	// type integer with format int32 in
	// status.kernelBootStatus.kernelInfo.checksum"), so the VMI stays
	// Scheduled with its domain running (kubevirt/kubevirt#17858, fixed
	// for v1.9 by #17469). This kernel's CRC32 is above. So both files
	// are given a CRC32 below 2^31: the kernel 4 bytes after its end (the
	// bzImage's header says where its payload ends), the initramfs a
	// padding file.
	for i := uint32(0); crc32.ChecksumIEEE(kernelData) > math.MaxInt32; i++ {
		if i > 0 {
			kernelData = kernelData[:len(kernelData)-4]
		}
		kernelData = binary.LittleEndian.AppendUint32(kernelData, i)
	}
	var initrdData []byte
	for i := 0; initrdData == nil || crc32.ChecksumIEEE(initrdData) > math.MaxInt32; i++ {
		initrdData, err = vm.AppendToInitrd(initrd, []vm.InitrdFile{
			{Name: "kubevirt/init", Mode: 0o755, Data: []byte(kubeVirtInit)},
			{Name: "kubevirt/script", Mode: 0o644, Data: []byte(guestScript)},
			{Name: "kubevirt/crc32-pad", Mode: 0o644, Data: []byte(strconv.Itoa(i))},
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	archive := filepath.Join(t.TempDir(), "guest.tar")
	err = crihelp.WriteImage(archive, kubeVirtGuestRef, crihelp.ImageConfig{User: "107"}, []crihelp.ImageEntry{
		{Name: "boot", Dir: true, Mode: 0o755},
		{Name: "boot/vmlinuz", Data: kernelData, Mode: 0o644},
		{Name: "boot/initrd.gz", Data: initrdData, Mode: 0o644},
		{Name: "tmp", Dir: true, Mode: 0o1777},
		{Name: "usr", Dir: true, Mode: 0o755},
		{Name: "usr/bin", Dir: true, Mode: 0o755},
	})
	if err != nil {
		t.Fatal(err)
	}
	load := exec.Command(filepath.Join(k.repo, "test", "e2e", "kind", "cluster.sh"), "load", archive)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("cluster.sh load %s: %v\n%s", archive, err, out)
	}
	t.Logf("image %s: guest kernel %s (CRC32 %d) and its initramfs with KubeVirt's /init (%d bytes, CRC32 %d); loaded into the nodes",
		kubeVirtGuestRef, filepath.Base(kernel), crc32.ChecksumIEEE(kernelData), len(initrdData), crc32.ChecksumIEEE(initrdData))
}

func (k *kind) kubeVirtVM(node string, c *kvCase) map[string]any {
	args := vm.KernelCmdline(vm.Guest{IP: c.ip, Gateway: gateway, MAC: c.mac})
	args = strings.Replace(args, "rdinit=/init", "rdinit=/kubevirt/init", 1)
	return map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": c.name, "namespace": podNamespace,
			"labels": map[string]any{"app.kubernetes.io/name": kubeVirtLabel}},
		"spec": map[string]any{
			"runStrategy": "Always",
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app.kubernetes.io/name": kubeVirtLabel}},
				"spec": map[string]any{
					"nodeSelector":                  map[string]any{"kubernetes.io/hostname": node},
					"terminationGracePeriodSeconds": 5,
					"domain": map[string]any{
						"cpu":    map[string]any{"cores": c.vcpus},
						"memory": map[string]any{"guest": "256Mi"},
						"firmware": map[string]any{"kernelBoot": map[string]any{
							"kernelArgs": args,
							"container": map[string]any{"image": kubeVirtGuestRef, "imagePullPolicy": "Never",
								"kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initrd.gz"},
						}},
						"devices": map[string]any{
							"networkInterfaceMultiqueue": c.multiqueue,
							"logSerialConsole":           true,
							"autoattachGraphicsDevice":   false,
							"autoattachMemBalloon":       false,
							"interfaces": []any{map[string]any{"name": kubeVirtNetwork,
								"binding": map[string]any{"name": "napitap"}, "macAddress": c.mac}},
						},
					},
					"networks": []any{map[string]any{"name": kubeVirtNetwork,
						"multus": map[string]any{"networkName": c.nad}}},
				},
			},
		},
	}
}

// runKubeVirtVM starts the case's VM on node, waits for its VMI to run,
// its guest to ping the gateway and its queues to be QEMU's (NAPI or
// not, as the network says), then deletes it.
func (k *kind) runKubeVirtVM(t *testing.T, node string, c *kvCase) {
	start := time.Now()
	k.apply(t, k.kubeVirtVM(node, c))
	t.Cleanup(func() {
		k.kubectl("delete", "vm", "-n", podNamespace, c.name, "--wait=true", "--timeout=180s")
	})
	// The VMI Running, or what KubeVirt says instead.
	var phase string
	err := poll(6*time.Minute, func() error {
		out, err := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o",
			`jsonpath={.status.phase} {.status.nodeName}`)
		if err != nil {
			return err
		}
		phase = out
		switch f := strings.Fields(out); {
		case len(f) > 0 && f[0] == "Running":
			return nil
		case len(f) > 0 && (f[0] == "Failed" || f[0] == "Succeeded"):
			return permanent{fmt.Errorf("VMI %s: %s", c.name, out)}
		}
		return fmt.Errorf("VMI %s: phase %q", c.name, out)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, k.kubeVirtDiagnostics(c.name))
	}
	launcher, err := k.launcherOf(c.name)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("VMI %s Running (%s) in %v; virt-launcher pod %s", c.name, phase, time.Since(start).Round(time.Second), launcher)
	domIf, _ := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", `jsonpath={.status.interfaces}`)
	t.Logf("VMI %s status.interfaces: %s", c.name, domIf)

	k.logDomainNIC(t, c, launcher)

	sandbox, err := sandboxOf(node, launcher)
	if err != nil || sandbox == "" {
		t.Fatalf("virt-launcher pod %s: sandbox %q on %s: %v", launcher, sandbox, node, err)
	}
	if err := addGateway(node); err != nil {
		t.Fatal(err)
	}
	// The guest's console, from virt-launcher's guest-console-log
	// container.
	var log string
	err = poll(5*time.Minute, func() error {
		var err error
		log, err = k.kubectl("logs", "-n", podNamespace, launcher, "-c", "guest-console-log")
		if err != nil {
			return err
		}
		if strings.Contains(log, vm.MarkerError) {
			return permanent{fmt.Errorf("the guest failed")}
		}
		if strings.Count(log, "PING-OK") < 2 {
			return fmt.Errorf("the guest has %d answers from %s", strings.Count(log, "PING-OK"), gateway)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("VM %s on %s: %v; its console:\n%s", c.name, node, err, crihelp.Tail(log, 3000))
	}
	lines := regexp.MustCompile(`(?m)^.*(NAPITAP-GUEST-UP|PING-OK).*$`).FindAllString(log, 3)
	t.Logf("VM %s: its console (kubectl logs %s -c guest-console-log): %d PING-OK from %s; first lines:\n  %s",
		c.name, launcher, strings.Count(log, "PING-OK"), gateway, strings.Join(lines, "\n  "))

	// napitapctl queues in the worker's napitap pod: every queue QEMU
	// holds, NAPI as the network says.
	podIf := kubeVirtPodIf(kubeVirtNetwork)
	want := 1
	if c.multiqueue {
		want = c.vcpus
	}
	var rows string
	err = poll(time.Minute, func() error {
		qs, _, err := k.queuesOf(node, sandbox, podIf)
		if err != nil {
			return err
		}
		var b strings.Builder
		n := 0
		for _, q := range qs {
			fmt.Fprintf(&b, "  pid %d %s fd %d: tap NAPI %v\n", q.PID, q.Command, q.FD, q.Tap.NAPI)
			if strings.HasPrefix(q.Command, "qemu-system") {
				n++
			}
			if q.Tap.NAPI != c.napi {
				return permanent{fmt.Errorf("queue fd %d of %s (pid %d): NAPI %v, want %v", q.FD, q.Command, q.PID, q.Tap.NAPI, c.napi)}
			}
		}
		rows = b.String()
		if n != want {
			return fmt.Errorf("QEMU holds %d queues of %s, want %d", n, kubeVirtTap(podIf), want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("VM %s on %s: napitapctl queues --container %s --ifname %s: %v\n%s", c.name, node, sandbox, podIf, err, rows)
	}
	ds, _ := k.dsPodOn(node)
	table, _ := k.kubectl("exec", "-n", dsNamespace, ds.name, "-c", "napitapd", "--",
		"napitapctl", "queues", "--container", sandbox, "--ifname", podIf)
	t.Logf("VM %s (%s, multiqueue %v): kubectl -n %s exec %s -c napitapd -- napitapctl queues --container %.12s --ifname %s:\n%s",
		c.name, c.nad, c.multiqueue, dsNamespace, ds.name, sandbox, podIf, table)
	// Who called TUNSETIFF, as napitapd logged it: libvirt, which hands
	// the queues to QEMU.
	dlog, _ := k.kubectl("logs", "-n", dsNamespace, ds.name, "-c", "napitapd")
	for _, line := range strings.Split(dlog, "\n") {
		if !strings.Contains(line, sandbox) || !strings.Contains(line, "TUNSETIFF") && !strings.Contains(line, "attached") {
			continue
		}
		comm := ""
		if m := regexp.MustCompile(` pid=(\d+)`).FindStringSubmatch(line); m != nil {
			if out, err := onNode(node, "cat", "/proc/"+m[1]+"/comm"); err == nil {
				comm = " (pid " + m[1] + " is " + strings.TrimSpace(out) + ")"
			}
		}
		t.Logf("VM %s: napitapd: %s%s", c.name, line, comm)
	}
	t.Logf("VM %s: Running, pinging, queues checked in %v", c.name, time.Since(start).Round(time.Second))

	// Deleted, the VM leaves napitapd nothing of its attachment.
	k.kubectlMust(t, "delete", "vm", "-n", podNamespace, c.name, "--wait=true", "--timeout=180s")
	err = poll(2*time.Minute, func() error {
		list, err := k.attachments(node)
		if err != nil {
			return err
		}
		if strings.Contains(list, sandbox[:12]) {
			return fmt.Errorf("napitapctl list still shows sandbox %.12s:\n%s", sandbox, list)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("VM %s deleted: %v", c.name, err)
	}
	t.Logf("VM %s deleted: napitapd on %s holds nothing of sandbox %.12s", c.name, node, sandbox)
}

// logDomainNIC logs what KubeVirt asked libvirt for and what QEMU got:
// the domain's interface as libvirt has it, QEMU's -netdev (this
// machine's process: kind's nodes are its containers), and what libvirt
// logged of vhost, which the nodes here lack (/dev/vhost-net).
func (k *kind) logDomainNIC(t *testing.T, c *kvCase, launcher string) {
	t.Helper()
	domain := podNamespace + "_" + c.name
	xml, err := k.kubectl("exec", "-n", podNamespace, launcher, "-c", "compute", "--",
		"virsh", "-c", "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock", "dumpxml", domain)
	if m := regexp.MustCompile(`(?s)<interface type='ethernet'>.*?</interface>`).FindString(xml); m != "" {
		t.Logf("VM %s: libvirt's domain %s, its NIC:\n%s", c.name, domain, m)
	} else {
		t.Logf("VM %s: virsh dumpxml %s: no ethernet interface (%v):\n%s", c.name, domain, err, crihelp.Tail(xml, 1500))
	}
	pid, err := kubeVirtQEMU(domain)
	if err != nil {
		t.Fatal(err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(string(cmdline), "\x00")
	for i, a := range args {
		if a == "-netdev" && i+1 < len(args) {
			t.Logf("VM %s: QEMU (pid %d) -netdev %s", c.name, pid, args[i+1])
		}
	}
	log, _ := k.kubectl("logs", "-n", podNamespace, launcher, "-c", "compute")
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(line), "vhost") && !strings.Contains(line, "Base64 dump") {
			t.Logf("VM %s: virt-launcher's log: %s", c.name, line)
		}
	}
}

// kubeVirtQEMU finds, on this machine, the QEMU of a libvirt domain.
func kubeVirtQEMU(domain string) (int, error) {
	return theQEMU("of domain "+domain, func(args []string) bool {
		return slices.Contains(args, "guest="+domain+",debug-threads=on")
	})
}

// launcherOf is the running virt-launcher pod of the VMI.
func (k *kind) launcherOf(vmi string) (string, error) {
	var name string
	err := poll(time.Minute, func() error {
		out, err := k.kubectl("get", "pods", "-n", podNamespace, "-l", "kubevirt.io=virt-launcher,vm.kubevirt.io/name="+vmi,
			"--field-selector", "status.phase=Running", "-o", "jsonpath={.items[*].metadata.name}")
		if err != nil {
			return err
		}
		if f := strings.Fields(out); len(f) == 1 {
			name = f[0]
			return nil
		}
		return fmt.Errorf("running virt-launcher pods of %s: %q", vmi, out)
	})
	return name, err
}

// kubeVirtDiagnostics is what KubeVirt says of a VMI that did not run.
func (k *kind) kubeVirtDiagnostics(vmi string) string {
	var b strings.Builder
	out, _ := k.kubectl("get", "vmi", "-n", podNamespace, vmi, "-o", "jsonpath={.status}")
	fmt.Fprintf(&b, "--- VMI %s status: %s\n", vmi, out)
	out, _ = k.kubectl("get", "events", "-n", podNamespace, "--field-selector", "involvedObject.name="+vmi)
	fmt.Fprintf(&b, "--- events of %s:\n%s\n", vmi, out)
	pods, _ := k.kubectl("get", "pods", "-n", podNamespace, "-l", "vm.kubevirt.io/name="+vmi, "-o", "jsonpath={.items[*].metadata.name}")
	for _, p := range strings.Fields(pods) {
		out, _ = k.kubectl("describe", "pod", "-n", podNamespace, p)
		fmt.Fprintf(&b, "--- pod %s:\n%s\n", p, crihelp.Tail(out, 3000))
		out, _ = k.kubectl("logs", "-n", podNamespace, p, "-c", "compute", "--tail=40")
		fmt.Fprintf(&b, "--- its compute container's log:\n%s\n", out)
	}
	return b.String()
}
