package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapqueues"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
	"github.com/napitap/napitap/test/e2e/vm"
)

// vmmRef is the VM pods' image: mount points for the host's /usr (QEMU,
// its libraries and firmware, bash), the guest kernel and the output dir.
const vmmRef = "napinode.local/vmm:test"

// vmmProfile is the Localhost profile a VM pod names: relative to the
// kubelet's seccomp dir, where the DaemonSet installs it.
const vmmProfile = "napitap/vmm.json"

// What the guest's TCP streams to and from a peer on the node move.
const (
	guestSend = 8 << 20
	guestRecv = 1 << 20
)

// TestVMPodsGetNAPIQueuesThroughTheSeccompAgent applies, with kubectl, a
// VM pod as KubeVirt's virt-launcher is, minus KubeVirt: its secondary
// network is the shipped KubeVirt NAD (deploy/kubevirt/nad.yaml,
// intercept mode), which Multus attaches as the pod interface KubeVirt
// names pod<hash>; its pod securityContext names the Localhost seccomp
// profile napitap/vmm.json, installed into the kubelet's seccomp dir by the
// shipped DaemonSet's init container; and its container runs QEMU
// opening the tap KubeVirt looks for by name (-netdev
// tap,ifname=tap<hash>,queues=2). kubelet passes the profile through
// containerd to runc, runc hands the container's seccomp listener to the
// DaemonSet pod's napitapd (no other runs), and napitapd's agent performs
// QEMU's TUNSETIFFs with IFF_NAPI: the guest's
// TCP segments are GRO-merged on the tap (DESIGN.md fact 10). The same pod
// under RuntimeDefault gets plain queues and nothing merges. kubectl
// delete leaves no tap, no attachment and no listener in napitapd.
func TestVMPodsGetNAPIQueuesThroughTheSeccompAgent(t *testing.T) {
	testStart := time.Now()
	repo, kernel, initrd := vmArtifacts(t)
	c := startDaemonSetCluster(t, crihelp.Config{Name: "napinodevm", Subnet: podSubnet})
	n := c.node
	// The DaemonSet installs the profiles and serves the agent's socket:
	// no napitapd of the test's runs.
	_, ds := c.deployDaemonSet(repo)
	if err := listensOn(ds.pid, n.Napitapd.SeccompSocket); err != nil {
		t.Fatalf("the DaemonSet pod's napitapd, pid %d: %v", ds.pid, err)
	}
	c.kubectlMust("apply", "-n", podNamespace, "-f", filepath.Join(repo, "deploy", "kubevirt", "nad.yaml"))
	crihelp.WriteVMMImage(t, n, vmmRef, "guest", "out")
	podIf := kubeVirtPodIfName(vmNetwork)
	tap := kubeVirtTapName(podIf)
	// The pod's network selection as KubeVirt writes it, plus cni-args: 2
	// queues for QEMU's 2 vCPUs, and a gro_flush_timeout that lets GRO
	// merge the segments of a TCG guest, which arrive one write at a time
	// (DESIGN.md fact 10).
	networks := fmt.Sprintf(`[{"name":"napitap-kubevirt","interface":%q,"cni-args":{"queues":2,"groFlushTimeout":%d}}]`, podIf, groFlushTimeout)

	cases := []struct {
		name       string
		pod        string
		seccomp    map[string]any // the pod's securityContext.seccompProfile
		wantMerged bool
	}{
		{"a pod under the Localhost profile napitap/vmm.json gets NAPI queues for QEMU's by-name open", "vm-napi",
			map[string]any{"type": "Localhost", "localhostProfile": vmmProfile}, true},
		{"the same pod under RuntimeDefault gets plain queues", "vm-plain",
			map[string]any{"type": "RuntimeDefault"}, false},
	}
	throughput := map[bool]float64{}
	t.Cleanup(func() {
		if throughput[true] > 0 && throughput[false] > 0 {
			t.Logf("guest -> node peer, %d MiB, guest TSO off, TCG: Localhost vmm profile (NAPI) %.0f Mbit/s, RuntimeDefault (plain) %.0f Mbit/s: %.2fx",
				guestSend>>20, throughput[true], throughput[false], throughput[true]/throughput[false])
		}
	})
	for _, tc := range cases {
		ok := t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			p := &vmPod{pod: pod{name: tc.pod, queues: 2}, outDir: filepath.Join(c.root, tc.pod)}
			if err := os.MkdirAll(p.outDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p.outDir, 0o777); err != nil { // for the non-root QEMU
				t.Fatal(err)
			}
			script := fmt.Sprintf(`ping -c 3 %[1]s && echo PING-OK
dd if=/dev/zero bs=65536 count=%[2]d 2>/dev/null | nc %[1]s 5001 && echo SENT-OK
echo "RECEIVED $(nc %[1]s 5002 | wc -c)"
`, vmPeer, guestSend/65536)
			// The pod interface's MAC, which the guest takes over
			// (tc-redirect wiring), exists only once CNI ADD has run: the
			// container fills it in (vmmWrapper). The NAD has no IPAM:
			// the guest's address is its own, as on a KubeVirt L2 network.
			guest := vm.Guest{IP: vmGuestIP, Gateway: vmPeer, MAC: macPlaceholder, Script: script}
			netdev := "tap,id=n0,ifname=" + tap + ",script=no,downscript=no,vhost=off,queues=2"
			argv := vm.QEMUArgs("/guest/"+filepath.Base(kernel), "/guest/"+filepath.Base(initrd), netdev, 2, guest, "/out/serial.log", true)
			c.apply(c.vmManifest(p.name, networks, podIf, tc.seccomp, filepath.Dir(kernel), p.outDir, argv))
			c.waitVMPodRunning(p, podIf)
			t.Logf("pod %s: Running in %v, sandbox %.12s, pod IP %s, %s MAC %s, netns %s",
				p.name, time.Since(start).Round(time.Millisecond), p.sandbox, p.ip, podIf, p.mac, p.netns)
			c.addVMPeer()

			want := nodecheck.Expect{ContainerID: p.sandbox, IfName: podIf, TapName: tap, Queues: 2, NAPI: true,
				Wiring: "tc-redirect", Socket: n.Socket, Held: 0}
			if err := nodecheck.Present(p.netns, want); err != nil {
				t.Fatalf("pod %s: %v", p.name, err)
			}
			c.checkSeccomp(p, tc.wantMerged)
			att := attachmentOf(t, n, p.sandbox, podIf)
			st, err := c.getPod(p.name)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("pod %s: NAD napitap-kubevirt (%s): tap %s, %d queues, NAPI %v, wiring %s, %d held, guest MAC %s; network-status %s",
				p.name, networks, att.TapName, att.Queues, att.NAPI, att.Wiring, att.Held, att.MAC, st.Metadata.Annotations[networkStatusAnnotation])
			attrs, err := tapsetup.ReadSysfs(p.netns, att.TapName)
			if err != nil || attrs.GROFlushTimeout != groFlushTimeout {
				t.Fatalf("pod %s: %s gro_flush_timeout %+v (%v), want %d", p.name, att.TapName, attrs, err, groFlushTimeout)
			}

			// The peers and the capture first, then QEMU.
			sink := crihelp.ListenIn(t, n.NetNS, vmPeer+":5001", func(c net.Conn) (int64, error) { return io.CopyN(io.Discard, c, guestSend) })
			source := crihelp.ListenIn(t, n.NetNS, vmPeer+":5002", func(c net.Conn) (int64, error) { return io.CopyN(c, crihelp.ZeroReader{}, guestRecv) })
			capture := crihelp.StartCapture(t, p.netns, att.TapName)
			if err := os.WriteFile(filepath.Join(p.outDir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			qemuStart := time.Now()
			// While QEMU runs: napitapctl queues, as an operator checks a
			// running VM, asking the DaemonSet's napitapd for the tap.
			queuesSeen := make(chan queuesResult, 1)
			go func() { queuesSeen <- c.qemuQueues(p.sandbox, podIf) }()
			if err := c.waitQEMUExited(p, 5*time.Minute); err != nil {
				t.Fatalf("pod %s: %v\nserial:\n%s\nQEMU's output:\n%s", p.name, err,
					tailFile(filepath.Join(p.outDir, "serial.log"), 3000), tailFile(filepath.Join(p.outDir, "qemu.log"), 3000))
			}
			out := readFile(filepath.Join(p.outDir, "serial.log"))
			for _, w := range []string{vm.MarkerUp, "PING-OK", "SENT-OK", fmt.Sprintf("RECEIVED %d", guestRecv), vm.MarkerDone + "0"} {
				if !strings.Contains(out, w) {
					t.Errorf("guest output lacks %q:\n%s", w, crihelp.Tail(out, 2000))
				}
			}
			seen := capture.Stop()
			throughput[tc.wantMerged] = sink.Mbits()
			t.Logf("pod %s: QEMU ran %v; guest -> peer %.0f Mbit/s (%d bytes), peer -> guest %d bytes",
				p.name, time.Since(qemuStart).Round(time.Millisecond), sink.Mbits(), sink.Bytes(), source.Bytes())
			t.Logf("pod %s: tap %s (%d queues, gro_flush_timeout %d ns), guest's frames in: %v",
				p.name, att.TapName, att.Queues, attrs.GROFlushTimeout, seen)
			if got := sink.Bytes(); got != guestSend {
				t.Errorf("peer received %d bytes from the guest, want %d", got, guestSend)
			}
			if merged := seen.MaxLen > crihelp.MaxFrame; merged != tc.wantMerged {
				t.Errorf("GRO merged the guest's segments: %v (%v), want %v", merged, seen, tc.wantMerged)
			}
			listeners := c.checkAgentLog(p, want, tc.wantMerged)
			qs := <-queuesSeen
			t.Logf("pod %s: napitapctl queues --container %.12s --ifname %s -o json, QEMU's:\n%s", p.name, p.sandbox, podIf, qs.out)
			if qs.err != nil || len(qs.qemu) != 2 {
				t.Errorf("pod %s: napitapctl queues found %d queues of QEMU's (%v), want 2", p.name, len(qs.qemu), qs.err)
			}
			for _, q := range qs.qemu {
				if q.Tap.NAPI != tc.wantMerged {
					t.Errorf("pod %s: napitapctl queues: QEMU's fd %d tap napi %v, want %v", p.name, q.FD, q.Tap.NAPI, tc.wantMerged)
				}
			}

			del := time.Now()
			c.kubectlMust("delete", "pod", "-n", podNamespace, p.name, "--wait", "--timeout=120s")
			t.Logf("pod %s: kubectl delete took %v", p.name, time.Since(del).Round(time.Millisecond))
			c.checkGone(p, want, listeners)
			t.Logf("case took %v", time.Since(start).Round(time.Millisecond))
		})
		if !ok {
			return // cleanup removes what is left
		}
	}
	for _, line := range strings.Split(n.Napitapd.ReadLog(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("napitapd: %s", line)
		}
	}
	if links := crihelp.LinkNames(t, n.NetNS); strings.Join(links, " ") != "lo napinodevm0 "+vmBridge {
		t.Errorf("node netns links after the pods went: %v, want lo, napinodevm0 and %s (bridges stay, as on a node)", links, vmBridge)
	}
	if left := crihelp.AttachmentStates(n.StateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", n.StateDir, left)
	}
	if left := ipamEntries(t, n); len(left) > 0 {
		t.Errorf("host-local still holds %v", left)
	}
	t.Logf("whole run: %v", time.Since(testStart).Round(time.Second))
}

// The VM's secondary network: the VMI's network name (KubeVirt hashes it
// into the pod interface's), the bridge of the KubeVirt NAD, and the
// addresses of the guest and of its peer on that bridge in the node netns.
const (
	vmNetwork = "napitap"
	vmBridge  = "napitap0"
	vmPeer    = "10.193.0.1"
	vmGuestIP = "10.193.0.2/24"
)

// vmPod is one VM pod as the test made it and the node runs it.
type vmPod struct {
	pod
	outDir string // the container's /out: serial console, QEMU's output
	mac    string // the pod interface's, the guest's
}

// macPlaceholder is in QEMU's argv for vmmWrapper to replace (QEMUArgs
// lowercases MACs).
const macPlaceholder = "@guest-mac@"

// vmmWrapper is the container's command (bash -c, QEMU's argv as its
// arguments). It fills in the MAC of the pod interface $GUEST_NIC (the
// pod netns' sysfs), waits until the test has its peers and capture ready
// (/out/go), runs QEMU and then stays until kubectl delete, so that it is
// kubelet, not QEMU's exit, that ends the pod and runs CNI DEL. As PID 1 it
// must trap SIGTERM to stop on it.
const vmmWrapper = `trap 'exit 0' TERM
mac=$(cat /sys/class/net/$GUEST_NIC/address)
until [ -e /out/go ]; do sleep 0.2; done
set -- "${@//` + macPlaceholder + `/$mac}"
"$@" >/out/qemu.log 2>&1
echo "qemu exited $?" >/out/qemu.exit
sleep 86400 & wait
`

// vmManifest is a VM pod bound to the node: QEMU in a container of
// vmmRef with the host's /usr, the guest's dir and outDir mounted
// (hostPath), a tun device as a hostPath device at /dev/net/tun (what
// KubeVirt's device plugin gives virt-launcher; runc's default device
// rules allow it), and
// seccomp as the pod's seccompProfile, and networks as its Multus network
// selection, whose interface guestNIC is. JSON is YAML to kubectl.
func (c *cluster) vmManifest(name, networks, guestNIC string, seccomp map[string]any, guestDir, outDir string, argv []string) string {
	hostPath := func(name, path, typ string) map[string]any {
		return map[string]any{"name": name, "hostPath": map[string]any{"path": path, "type": typ}}
	}
	mount := func(name, path string, ro bool) map[string]any {
		return map[string]any{"name": name, "mountPath": path, "readOnly": ro}
	}
	manifest := c.vmPod(name, map[string]any{"app": "napitap-vm"}, networks, seccomp, 10, map[string]any{
		"name":            "vmm",
		"image":           vmmRef,
		"imagePullPolicy": "Never",
		"command":         []string{"/bin/bash", "-c", vmmWrapper, "vmm"},
		"args":            argv,
		"env":             []any{map[string]any{"name": "GUEST_NIC", "value": guestNIC}},
		"volumeMounts": []any{
			mount("host-usr", "/usr", true),
			mount("ld-so-cache", "/etc/ld.so.cache", true),
			mount("guest", "/guest", true),
			mount("out", "/out", false),
			mount("tun", "/dev/net/tun", false),
		},
	}, []any{
		hostPath("host-usr", "/usr", "Directory"),
		hostPath("ld-so-cache", "/etc/ld.so.cache", "File"),
		hostPath("guest", guestDir, "Directory"),
		hostPath("out", outDir, "Directory"),
		hostPath("tun", c.tunDevice(), "CharDevice"),
	})
	b, err := json.MarshalIndent(manifest, "", "  ")
	if err != nil {
		c.t.Fatal(err)
	}
	return string(b)
}

// vmPod is a pod bound to the node with one container, whose Multus
// network selection is networks, under seccomp. It runs as uid/gid 107,
// as KubeVirt runs QEMU: the owner and group the KubeVirt NAD gives the
// tap (without CAP_NET_ADMIN only they may attach it).
func (c *cluster) vmPod(name string, labels map[string]any, networks string, seccomp map[string]any, grace int, container map[string]any, volumes []any) map[string]any {
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata": map[string]any{"name": name, "namespace": podNamespace, "labels": labels,
			"annotations": map[string]any{networksAnnotation: networks}},
		"spec": map[string]any{
			"nodeName":                      c.nodeName,
			"automountServiceAccountToken":  false,
			"enableServiceLinks":            false,
			"dnsPolicy":                     "Default",
			"restartPolicy":                 "Never",
			"terminationGracePeriodSeconds": grace,
			"securityContext":               map[string]any{"seccompProfile": seccomp, "runAsUser": 107, "runAsGroup": 107},
			"containers":                    []any{container},
			"volumes":                       volumes,
		},
	}
}

// waitVMPodRunning waits until the pod is Ready and fills in what the node
// made of it: sandbox, netns, IP, the MAC of the pod interface guestNIC.
func (c *cluster) waitVMPodRunning(p *vmPod, guestNIC string) {
	t := c.t
	t.Helper()
	c.waitReady(&p.pod, "180s")
	err := ns.WithNetNSPath(p.netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName(guestNIC)
		if err == nil {
			p.mac = l.Attrs().HardwareAddr.String()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// tunDevice is a tun device node (10:200) that the non-root QEMU may
// open, as KubeVirt's device plugin makes /dev/net/tun for virt-launcher:
// the machine's own may be root's only (0600), and stays as it is.
func (c *cluster) tunDevice() string {
	path := filepath.Join(c.root, "tun")
	if crihelp.Exists(path) {
		return path
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(10, 200))); err != nil {
		c.t.Fatalf("mknod %s: %v", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil { // past the umask
		c.t.Fatal(err)
	}
	return path
}

// addVMPeer puts the guest's peer address on the KubeVirt NAD's bridge in
// the node netns, once the bridge plugin has made it.
func (c *cluster) addVMPeer() {
	c.t.Helper()
	c.node.NetNS.Run(c.t, func() error {
		br, err := netlink.LinkByName(vmBridge)
		if err != nil {
			return err
		}
		addr, err := netlink.ParseAddr(vmPeer + "/24")
		if err != nil {
			return err
		}
		if err := netlink.AddrReplace(br, addr); err != nil {
			return fmt.Errorf("bridge %s: %w", vmBridge, err)
		}
		return nil
	})
}

// checkSeccomp: kubelet resolved the pod's profile and containerd put it,
// listenerPath included, into the OCI spec of the vmm container.
func (c *cluster) checkSeccomp(p *vmPod, localhost bool) {
	t := c.t
	t.Helper()
	st, err := c.getPod(p.name)
	if err != nil || len(st.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s: %+v (%v)", p.name, st, err)
	}
	c.node.CheckSeccomp(t, strings.TrimPrefix(st.Status.ContainerStatuses[0].ContainerID, "containerd://"), localhost)
}

// attachmentOf is napitapd's record of the sandbox's ifName.
func attachmentOf(t *testing.T, n *crihelp.Node, sandbox, ifName string) handoff.Attachment {
	t.Helper()
	atts, err := (&handoff.Client{Socket: n.Socket}).List()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range atts {
		if a.ContainerID == sandbox && a.IfName == ifName {
			return a
		}
	}
	t.Fatalf("napitapd has no attachment of %.12s/%s: %+v", sandbox, ifName, atts)
	return handoff.Attachment{}
}

// waitQEMUExited waits for vmmWrapper's word that QEMU exited (the guest
// powered off) with status 0, failing early should the container stop.
func (c *cluster) waitQEMUExited(p *vmPod, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	exitFile := filepath.Join(p.outDir, "qemu.exit")
	for i := 0; ; i++ {
		if b, err := os.ReadFile(exitFile); err == nil {
			if got := strings.TrimSpace(string(b)); got != "qemu exited 0" {
				return errors.New(got)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("QEMU still running after %v", timeout)
		}
		if i%20 == 19 { // every 10 s
			st, err := c.getPod(p.name)
			if err != nil {
				return err
			}
			if len(st.Status.ContainerStatuses) != 1 || !st.Status.ContainerStatuses[0].Ready {
				return fmt.Errorf("container stopped before QEMU exited: %+v", st.Status)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// checkAgentLog: under the profile, runc's listener for the vmm container
// reached napitapd with the pod's CRI annotations and both of QEMU's
// queues were attached with NAPI; without it, napitapd heard nothing from
// the pod. It returns the listeners napitapd served for the pod, by the
// name its log gives them.
func (c *cluster) checkAgentLog(p *vmPod, want nodecheck.Expect, napi bool) []string {
	t := c.t
	t.Helper()
	log := c.node.Napitapd.ReadLog()
	from := regexp.MustCompile(`msg="serving seccomp listener" from="(pod ` + regexp.QuoteMeta(podNamespace+"/"+p.name) + ` [^"\\]*(?:\\.[^"\\]*)*)"`)
	var served, vmm, attached []string
	for _, line := range strings.Split(log, "\n") {
		if m := from.FindStringSubmatch(line); m != nil {
			served = append(served, m[1])
			if strings.Contains(line, `container \"vmm\"`) {
				vmm = append(vmm, line)
			}
			t.Logf("napitapd: %s", line)
		}
		if strings.Contains(line, `msg="attached the caller's queue with NAPI"`) && strings.Contains(line, "attachment="+p.sandbox+"/"+want.IfName) {
			attached = append(attached, line)
			t.Logf("napitapd: %s", line)
		}
	}
	if !napi {
		if len(served)+len(attached) > 0 {
			t.Errorf("napitapd served a pod without the profile: %q", append(served, attached...))
		}
		return served
	}
	if len(vmm) != 1 {
		t.Errorf("napitapd logged %d listeners from runc for %s's vmm container, want 1:\n%s", len(vmm), p.name, crihelp.Tail(log, 3000))
	} else {
		for _, want := range []string{"sandbox_id=" + p.sandbox, "sandbox_uid=" + p.uid, "metadata=vmm", "status=creating"} {
			if !strings.Contains(vmm[0], want) {
				t.Errorf("listener line lacks %q: %s", want, vmm[0])
			}
		}
	}
	if len(attached) != 2 || !strings.Contains(strings.Join(attached, "\n"), "tap="+want.TapName) {
		t.Errorf("napitapd attached %d of QEMU's queues with NAPI, want 2:\n%s", len(attached), crihelp.Tail(log, 3000))
	}
	return served
}

// checkGone: after kubectl delete, no tap, no attachment, no address, and
// napitapd has let go of every listener it served for the pod, each with a
// log line saying so.
func (c *cluster) checkGone(p *vmPod, want nodecheck.Expect, listeners []string) {
	t := c.t
	t.Helper()
	n := c.node
	if err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(p.netns, want) }); err != nil {
		t.Errorf("pod %s after kubectl delete: %v", p.name, err)
	}
	if out, err := n.CrictlRun("pods", "--id", p.sandbox, "--state", "ready", "-q"); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Errorf("pod %s: sandbox %.12s still ready (%v)", p.name, p.sandbox, err)
	}
	if atts, err := (&handoff.Client{Socket: n.Socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("napitapd after kubectl delete holds %+v (%v), want nothing", atts, err)
	}
	for ip, id := range ipamEntries(t, n) {
		if id == p.sandbox {
			t.Errorf("host-local still holds %s for pod %s", ip, p.name)
		}
	}
	// A listener goes when the last process under its filter has been
	// reaped.
	var held int
	err := crihelp.Poll(30*time.Second, func() (err error) {
		if held, err = n.Napitapd.SeccompListeners(); err == nil && held > 0 {
			err = fmt.Errorf("napitapd holds %d seccomp listeners", held)
		}
		return err
	})
	if err != nil {
		t.Errorf("after kubectl delete of pod %s: %v", p.name, err)
	}
	log := n.Napitapd.ReadLog()
	for _, l := range listeners {
		done := `msg="seccomp listener done: every process under its filter has exited" listener="` + l + `"`
		var line string
		for _, s := range strings.Split(log, "\n") {
			if strings.Contains(s, done) {
				line = s
			}
		}
		if line == "" {
			t.Errorf("napitapd did not log that it let the listener of %s go:\n%s", l, crihelp.Tail(log, 3000))
		} else {
			t.Logf("napitapd: %s", line)
		}
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func tailFile(p string, n int) string { return crihelp.Tail(readFile(p), n) }

// vmArtifacts is the repository root and the guest's kernel and initramfs
// (cached in .cache/vm), once QEMU, bash and tools are found.
func vmArtifacts(t *testing.T, tools ...string) (repo, kernel, initrd string) {
	t.Helper()
	crihelp.RequireTools(t, append([]string{"qemu-system-x86_64", "bash"}, tools...)...)
	repo, err := crihelp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kernel, initrd, err = vm.Artifacts(filepath.Join(repo, ".cache", "vm"))
	if err != nil {
		t.Fatal(err)
	}
	return repo, kernel, initrd
}

// queuesResult is what qemuQueues saw.
type queuesResult struct {
	qemu []tapqueues.Queue // QEMU's queues
	out  string            // napitapctl's JSON
	err  error
}

// qemuQueues runs napitapctl queues on the node for the attachment, against
// the DaemonSet's napitapd, until it lists QEMU's 2 queues (QEMU opens them
// as it starts), for up to 2 minutes.
func (c *cluster) qemuQueues(sandbox, ifName string) queuesResult {
	var r queuesResult
	r.err = crihelp.Poll(2*time.Minute, func() error {
		out, err := exec.Command(filepath.Join(binDir, "napitapctl"), "--socket", c.node.Socket, "queues",
			"--container", sandbox, "--ifname", ifName, "-o", "json").CombinedOutput()
		r.out = string(out)
		if err != nil {
			return fmt.Errorf("napitapctl queues: %v: %s", err, out)
		}
		var all []tapqueues.Queue
		if err := json.Unmarshal(out, &all); err != nil {
			return err
		}
		r.qemu = nil
		for _, q := range all {
			if q.Command == "qemu-system-x86" {
				r.qemu = append(r.qemu, q)
			}
		}
		if len(r.qemu) < 2 {
			return fmt.Errorf("QEMU holds %d queues yet", len(r.qemu))
		}
		return nil
	})
	return r
}
