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

// The KubeVirt test: KubeVirt v1.7.0 as run.sh installs it (unless KUBEVIRT=0)
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
	name, nad  string // nad "": no napitap NIC
	multiqueue bool
	napi       bool
	vcpus      int
	ip, mac    string
	// podNetwork: also the pod network, bound with masquerade, as most
	// VMs have it; KubeVirt migrates only a VMI that has it.
	podNetwork bool
}

// TestKubeVirtVMsOnNapitapNetworks runs a VirtualMachine on a napitap
// network with and without networkInterfaceMultiqueue, and the same VM on
// a network with napi false (the control): each boots, its guest pings
// the gateway on the worker's napitap0, and napitapctl queues, in the
// worker's napitap pod, shows virt-launcher's QEMU holding the tap's
// queues with NAPI (without, for the control).
func TestKubeVirtVMsOnNapitapNetworks(t *testing.T) {
	k := cluster
	start := time.Now()
	k.kubeVirtReady(t)

	// The shipped NAD (4 queues, NAPI) and copies of it: one queue, for a
	// VM without multiqueue (the modes must match, the counts need not);
	// and each with napi false, the control.
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

	cases := []kvCase{
		{name: "kv-napi-1q", nad: "napitap-kubevirt-1q", napi: true, vcpus: 2},
		{name: "kv-nonapi-1q", nad: "napitap-kubevirt-1q-nonapi", napi: false, vcpus: 2},
		{name: "kv-napi-mq", nad: "napitap-kubevirt", multiqueue: true, napi: true, vcpus: 2},
		{name: "kv-nonapi-mq", nad: "napitap-kubevirt-nonapi", multiqueue: true, napi: false, vcpus: 2},
	}
	// The VMs boot side by side, spread over both workers: most of a
	// VM's minutes are KubeVirt's and the TCG guest's waits.
	t.Run("VMs", func(t *testing.T) {
		for i := range cases {
			c := &cases[i]
			c.ip, c.mac = fmt.Sprintf("10.198.0.%d/24", 230+i), fmt.Sprintf("02:00:0a:c6:00:%02x", 230+i)
			w := k.workers[i%len(k.workers)]
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				k.runKubeVirtVM(t, w, c)
			})
		}
	})
	t.Logf("KubeVirt test in %v", time.Since(start).Round(time.Second))
}

// kubeVirtReady fails the test unless run.sh installed KubeVirt with
// napitap's patch; it leaves no VM of an earlier run, the guest's image
// loaded and deploy/kubevirt/nad.yaml applied.
func (k *kind) kubeVirtReady(t *testing.T) {
	t.Helper()
	if os.Getenv("NAPITAP_KIND_KUBEVIRT") != "1" {
		// Not asked for: run.sh sets it unless KUBEVIRT=0, which installs no
		// KubeVirt. Asked for, nothing below skips.
		t.Skip("KubeVirt is installed by test/e2e/kind/run.sh (make e2e-kind), unless KUBEVIRT=0")
	}
	k.kubectlMust(t, "delete", "vm", "-n", podNamespace, "-l", "app.kubernetes.io/name="+kubeVirtLabel, "--wait=true", "--timeout=180s", "--ignore-not-found")
	out := k.kubectlMust(t, "get", "kubevirt", "-n", "kubevirt", "kubevirt", "-o",
		`jsonpath={.status.phase} {.status.observedKubeVirtVersion} {.spec.configuration.developerConfiguration.useEmulation} {.spec.configuration.network.binding.napitap.domainAttachmentType} {.spec.configuration.seccompConfiguration.virtualMachineInstanceProfile.customProfile.localhostProfile}`)
	if f := strings.Fields(out); len(f) != 5 || f[0] != "Deployed" || f[2] != "true" || f[3] != "tap" || f[4] != "napitap/virt-launcher.json" {
		t.Fatalf("KubeVirt CR: phase, version, useEmulation, napitap binding, profile = %q; want Deployed, useEmulation true, napitap's patch", out)
	}
	if k.kubeVirtGuestLoaded {
		return
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
	k.kubectlMust(t, "apply", "-n", podNamespace, "-f", filepath.Join(k.repo, "deploy", "kubevirt", "nad.yaml"))
	k.kubeVirtGuestLoaded = true
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
	for _, w := range k.workers {
		if err := nameByDigest(w, kubeVirtGuestRef); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("image %s: guest kernel %s (CRC32 %d) and its initramfs with KubeVirt's /init (%d bytes, CRC32 %d); loaded into the nodes",
		kubeVirtGuestRef, filepath.Base(kernel), crc32.ChecksumIEEE(kernelData), len(initrdData), crc32.ChecksumIEEE(initrdData))
}

// nameByDigest gives a side-loaded image on node the name a pull from a
// registry records beside its tag, REPO@DIGEST. KubeVirt starts a
// migration's target pod with the kernel-boot image the source's kubelet
// reported, by that name; without it the target pod fails with
// ErrImageNeverPull and the migration stays Scheduling (first seen on
// hosts whose CPU model KubeVirt can migrate to, where it does not refuse
// the migration).
func nameByDigest(node, ref string) error {
	out, err := onNode(node, "ctr", "-n", "k8s.io", "images", "ls", "name=="+ref)
	if err != nil {
		return err
	}
	var digest string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[0] == ref && strings.HasPrefix(f[2], "sha256:") {
			digest = f[2]
		}
	}
	// The tag follows the last colon; an earlier one may be a port.
	i := strings.LastIndex(ref, ":")
	if digest == "" || i < 0 {
		return fmt.Errorf("image %s on %s: no digest in ctr images ls:\n%s", ref, node, out)
	}
	_, err = onNode(node, "ctr", "-n", "k8s.io", "images", "tag", "--force", ref, ref[:i]+"@"+digest)
	return err
}

func (k *kind) kubeVirtVM(node string, c *kvCase) map[string]any {
	args := vm.KernelCmdline(vm.Guest{IP: c.ip, Gateway: gateway, MAC: c.mac})
	args = strings.Replace(args, "rdinit=/init", "rdinit=/kubevirt/init", 1)
	var interfaces, networks []any
	if c.nad != "" {
		interfaces = append(interfaces, map[string]any{"name": kubeVirtNetwork,
			"binding": map[string]any{"name": "napitap"}, "macAddress": c.mac})
		networks = append(networks, map[string]any{"name": kubeVirtNetwork,
			"multus": map[string]any{"networkName": c.nad}})
	}
	if c.podNetwork {
		pod := map[string]any{"name": "default", "masquerade": map[string]any{}}
		if c.nad == "" {
			// The guest's NIC, found by its MAC, else its /init gives up
			// and the VM stops.
			pod["macAddress"] = c.mac
		}
		interfaces = append(interfaces, pod)
		networks = append(networks, map[string]any{"name": "default", "pod": map[string]any{}})
	}
	var nodeSelector map[string]any
	if node != "" {
		nodeSelector = map[string]any{"kubernetes.io/hostname": node}
	}
	return map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
		"metadata": map[string]any{"name": c.name, "namespace": podNamespace,
			"labels": map[string]any{"app.kubernetes.io/name": kubeVirtLabel}},
		"spec": map[string]any{
			"runStrategy": "Always",
			"template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app.kubernetes.io/name": kubeVirtLabel}},
				"spec": map[string]any{
					"nodeSelector":                  nodeSelector,
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
							"interfaces":                 interfaces,
						},
					},
					"networks": networks,
				},
			},
		},
	}
}

// kvRun is where a VMI of a case runs: its node, virt-launcher pod and
// that pod's sandbox.
type kvRun struct {
	node, launcher, sandbox string
}

// runKubeVirtVM starts the case's VM on node, waits for its VMI to run,
// its guest to ping the gateway and its queues to be QEMU's (NAPI or
// not, as the network says), then deletes it.
func (k *kind) runKubeVirtVM(t *testing.T, node string, c *kvCase) {
	start := time.Now()
	k.startKubeVirtVM(t, node, c)
	r := k.waitKubeVirtVMI(t, c, "")
	k.waitGuestPings(t, c, r, 2)
	k.checkKubeVirtQueues(t, c, r, kubeVirtNetwork)
	k.logTUNSETIFFCallers(t, c, r)
	t.Logf("VM %s: Running, pinging, queues checked in %v", c.name, time.Since(start).Round(time.Second))

	// Deleted, the VM leaves napitapd nothing of its attachment.
	k.kubectlMust(t, "delete", "vm", "-n", podNamespace, c.name, "--wait=true", "--timeout=180s")
	k.waitAttachmentGone(t, r)
	t.Logf("VM %s deleted: napitapd on %s holds nothing of sandbox %.12s", c.name, r.node, r.sandbox)
}

// startKubeVirtVM applies the case's VM, on node or (node "") where the
// scheduler puts it, and deletes it when the test ends.
func (k *kind) startKubeVirtVM(t *testing.T, node string, c *kvCase) {
	t.Helper()
	k.apply(t, k.kubeVirtVM(node, c))
	t.Cleanup(func() {
		k.kubectl("delete", "vm", "-n", podNamespace, c.name, "--wait=true", "--timeout=180s")
	})
}

// kubeVirtDomain is the case's libvirt domain: KubeVirt names it
// NAMESPACE_VMI.
func kubeVirtDomain(c *kvCase) string { return podNamespace + "_" + c.name }

// waitKubeVirtVMI waits for the case's VMI to run (and, given notOn, on
// another node than that), and gives the node's napitap0 the gateway.
func (k *kind) waitKubeVirtVMI(t *testing.T, c *kvCase, notOn string) kvRun {
	t.Helper()
	start := time.Now()
	var phase string
	err := poll(6*time.Minute, func() error {
		out, err := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o",
			`jsonpath={.status.phase} {.status.nodeName}`)
		if err != nil {
			return err
		}
		phase = out
		switch f := strings.Fields(out); {
		case len(f) > 1 && f[0] == "Running" && f[1] != notOn:
			return nil
		case len(f) > 0 && (f[0] == "Failed" || f[0] == "Succeeded"):
			return permanent{fmt.Errorf("VMI %s: %s", c.name, out)}
		}
		return fmt.Errorf("VMI %s: phase and node %q", c.name, out)
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, k.kubeVirtDiagnostics(c.name))
	}
	var r kvRun
	r.node = strings.Fields(phase)[1]
	if r.launcher, err = k.launcherOf(c.name); err != nil {
		t.Fatal(err)
	}
	t.Logf("VMI %s Running on %s in %v; virt-launcher pod %s", c.name, r.node, time.Since(start).Round(time.Second), r.launcher)
	domIf, _ := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", `jsonpath={.status.interfaces}`)
	t.Logf("VMI %s status.interfaces: %s", c.name, domIf)
	k.logDomainNIC(t, c, r.launcher)
	if r.sandbox, err = sandboxOf(r.node, r.launcher); err != nil || r.sandbox == "" {
		t.Fatalf("virt-launcher pod %s: sandbox %q on %s: %v", r.launcher, r.sandbox, r.node, err)
	}
	if err := addGateway(r.node); err != nil {
		t.Fatal(err)
	}
	return r
}

// guestPings counts the answers the guest logged on its console, from
// virt-launcher's guest-console-log container.
func (k *kind) guestPings(r kvRun) (int, string, error) {
	log, err := k.kubectl("logs", "-n", podNamespace, r.launcher, "-c", "guest-console-log")
	if err != nil {
		return 0, log, err
	}
	if strings.Contains(log, vm.MarkerError) {
		return 0, log, permanent{fmt.Errorf("the guest failed")}
	}
	return strings.Count(log, "PING-OK"), log, nil
}

// waitGuestPings waits for the guest on r to have logged at least n
// answers from the gateway, and returns how many it has.
func (k *kind) waitGuestPings(t *testing.T, c *kvCase, r kvRun, n int) int {
	t.Helper()
	var got int
	var log string
	err := poll(5*time.Minute, func() error {
		var err error
		if got, log, err = k.guestPings(r); err != nil {
			return err
		}
		if got < n {
			return fmt.Errorf("the guest has %d answers from %s, want %d", got, gateway, n)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("VM %s on %s: %v; its console:\n%s", c.name, r.node, err, crihelp.Tail(log, 3000))
	}
	lines := regexp.MustCompile(`(?m)^.*(NAPITAP-GUEST-UP|PING-OK).*$`).FindAllString(log, 3)
	t.Logf("VM %s: its console (kubectl logs %s -c guest-console-log): %d PING-OK from %s; first lines:\n  %s",
		c.name, r.launcher, got, gateway, strings.Join(lines, "\n  "))
	return got
}

// checkKubeVirtQueues runs napitapctl queues in the worker's napitap
// pod for the VMI's interface on network: every queue QEMU holds, NAPI
// as the case's network says.
func (k *kind) checkKubeVirtQueues(t *testing.T, c *kvCase, r kvRun, network string) {
	t.Helper()
	podIf := kubeVirtPodIf(network)
	want := 1
	if c.multiqueue {
		want = c.vcpus
	}
	var rows string
	err := poll(time.Minute, func() error {
		qs, _, err := k.queuesOf(r.node, r.sandbox, podIf)
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
		t.Fatalf("VM %s on %s: napitapctl queues --container %s --ifname %s: %v\n%s", c.name, r.node, r.sandbox, podIf, err, rows)
	}
	ds, _ := k.dsPodOn(r.node)
	table, _ := k.kubectl("exec", "-n", dsNamespace, ds.name, "-c", "napitapd", "--",
		"napitapctl", "queues", "--container", r.sandbox, "--ifname", podIf)
	t.Logf("VM %s (network %s, multiqueue %v): kubectl -n %s exec %s -c napitapd -- napitapctl queues --container %.12s --ifname %s:\n%s",
		c.name, network, c.multiqueue, dsNamespace, ds.name, r.sandbox, podIf, table)
}

// logTUNSETIFFCallers logs who called TUNSETIFF, as napitapd logged it:
// libvirt, which hands the queues to QEMU.
func (k *kind) logTUNSETIFFCallers(t *testing.T, c *kvCase, r kvRun) {
	ds, _ := k.dsPodOn(r.node)
	dlog, _ := k.kubectl("logs", "-n", dsNamespace, ds.name, "-c", "napitapd")
	for _, line := range strings.Split(dlog, "\n") {
		if !strings.Contains(line, r.sandbox) || !strings.Contains(line, "TUNSETIFF") && !strings.Contains(line, "attached") {
			continue
		}
		comm := ""
		if m := regexp.MustCompile(` pid=(\d+)`).FindStringSubmatch(line); m != nil {
			if out, err := onNode(r.node, "cat", "/proc/"+m[1]+"/comm"); err == nil {
				comm = " (pid " + m[1] + " is " + strings.TrimSpace(out) + ")"
			}
		}
		t.Logf("VM %s: napitapd: %s%s", c.name, line, comm)
	}
}

// waitAttachmentGone waits for napitapd on r's node to list nothing of
// r's sandbox.
func (k *kind) waitAttachmentGone(t *testing.T, r kvRun) {
	t.Helper()
	err := poll(2*time.Minute, func() error {
		list, err := k.attachments(r.node)
		if err != nil {
			return err
		}
		if strings.Contains(list, r.sandbox[:12]) {
			return fmt.Errorf("napitapctl list on %s still shows sandbox %.12s:\n%s", r.node, r.sandbox, list)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("virt-launcher pod %s gone: %v", r.launcher, err)
	}
}

// logDomainNIC logs what KubeVirt asked libvirt for and what QEMU got:
// the domain's interface as libvirt has it, QEMU's -netdev (this
// machine's process: kind's nodes are its containers), and what libvirt
// logged of vhost, which the nodes here lack (/dev/vhost-net).
func (k *kind) logDomainNIC(t *testing.T, c *kvCase, launcher string) {
	t.Helper()
	domain := kubeVirtDomain(c)
	xml, err := k.kubectl("exec", "-n", podNamespace, launcher, "-c", "compute", "--",
		"virsh", "-c", "qemu+unix:///session?socket=/var/run/libvirt/virtqemud-sock", "dumpxml", domain)
	if m := regexp.MustCompile(`(?s)<interface type='ethernet'>.*?</interface>`).FindString(xml); m != "" {
		t.Logf("VM %s: libvirt's domain %s, its NIC:\n%s", c.name, domain, m)
	} else {
		t.Logf("VM %s: virsh dumpxml %s: no ethernet interface (%v):\n%s", c.name, domain, err, crihelp.Tail(xml, 1500))
	}
	// One QEMU: a migration's source may take a moment to go.
	var pid int
	if err := poll(time.Minute, func() error {
		pid, err = kubeVirtQEMU(domain)
		return err
	}); err != nil {
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
