package suite

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

// The guests' network: napitap0 on each worker, the bridge both shipped
// NADs name, whose host-local range (napitap-bridge) is 10.198.0.0/24.
// The suite gives the bridge the range's gateway address on each worker:
// the guests ping it all along. Guests take addresses from .200 up, which
// host-local hands out last.
const (
	gateway   = "10.198.0.1"
	vmProfile = "napitap/vmm.json" // the Localhost profile the DaemonSet installs
	// tunDev is a tun device node on each worker that a non-root QEMU may
	// open, as KubeVirt's device plugin gives virt-launcher one; the
	// node's own stays as it is.
	tunDev = "/var/lib/napitap-e2e/tun"
	// groFlushTimeout lets GRO merge the probe's segments (DESIGN.md
	// fact 10).
	groFlushTimeout = 200000
)

// Modes of a VM pod.
const (
	// intercept: the shipped KubeVirt NAD, the pod under the shipped
	// Localhost profile, QEMU opening its tap by name as libvirt does in
	// virt-launcher; napitapd's seccomp agent makes each queue NAPI.
	intercept = "intercept"
	// fds: napitap-bridge (napitapd holds the queues), QEMU run by
	// napitapctl exec with the queues as fds.
	fds = "fds"
)

// kubeVirtPodIf is the pod interface KubeVirt names for a network, and
// kubeVirtTap the tap it looks for on it (kubevirt pkg/network/link).
func kubeVirtPodIf(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "pod" + hex.EncodeToString(sum[:])[:11]
}

func kubeVirtTap(podIf string) string { return "tap" + podIf[3:] }

// vmPod is one VM pod: QEMU (TCG) with a guest that pings the gateway
// every 2 s for as long as it runs.
type vmPod struct {
	name, node, mode string
	ip, mac          string // the guest's
	podIf, tap       string // the NIC's pod interface and tap
	hpIf, hpTap      string // intercept: the second attachment, for hot-plugs
	sandbox, netns   string
	qemuPid          int // on this machine
}

var vmSeq = 0

func newVMPod(name, node, mode string) *vmPod {
	vmSeq++
	p := &vmPod{name: name, node: node, mode: mode,
		ip: fmt.Sprintf("10.198.0.%d/24", 200+vmSeq), mac: fmt.Sprintf("02:00:0a:c6:00:%02x", 200+vmSeq)}
	if mode == intercept {
		p.podIf, p.hpIf = kubeVirtPodIf("napitap"), kubeVirtPodIf("napitap-hotplug")
		p.tap, p.hpTap = kubeVirtTap(p.podIf), kubeVirtTap(p.hpIf)
	} else {
		p.podIf, p.tap = "net1", "tap1"
	}
	return p
}

// guestScript pings the gateway every 2 s and says how it went.
var guestScript = fmt.Sprintf("while :; do if ping -c 1 -W 2 %s >/dev/null 2>&1; then echo PING-OK; else echo PING-FAIL; fi; sleep 2; done\n", gateway)

func (k *kind) vmManifest(p *vmPod) map[string]any {
	guest := vm.Guest{IP: p.ip, Gateway: gateway, MAC: p.mac, Script: guestScript}
	cniArgs := map[string]any{"queues": 2, "groFlushTimeout": groFlushTimeout}
	var networks []any
	var argv []string
	var podSec, ctrSec map[string]any
	var mounts, volumes []any
	mount := func(name, path string, ro bool, source map[string]any) {
		mounts = append(mounts, map[string]any{"name": name, "mountPath": path, "readOnly": ro})
		volumes = append(volumes, map[string]any{"name": name}) // filled below
		for key, v := range source {
			volumes[len(volumes)-1].(map[string]any)[key] = v
		}
	}
	mount("out", "/out", false, map[string]any{"emptyDir": map[string]any{}})
	switch p.mode {
	case intercept:
		networks = []any{
			map[string]any{"name": "napitap-kubevirt", "interface": p.podIf, "mac": p.mac, "cni-args": cniArgs},
			map[string]any{"name": "napitap-kubevirt", "interface": p.hpIf, "cni-args": cniArgs},
		}
		netdev := "tap,id=n0,ifname=" + p.tap + ",script=no,downscript=no,vhost=off,queues=2"
		argv = vm.QEMUArgs("/guest/"+k.kernel, "/guest/"+k.initrd, netdev, 2, guest, "/dev/stdout", false)
		argv = append(argv, "-qmp", "unix:/out/qmp.sock,server=on,wait=off")
		// Non-root QEMU as KubeVirt runs it, as the owner the NAD gives
		// the tap, under the profile the DaemonSet installed.
		podSec = map[string]any{"runAsUser": 107, "runAsGroup": 107, "fsGroup": 107,
			"seccompProfile": map[string]any{"type": "Localhost", "localhostProfile": vmProfile}}
		mount("tun", "/dev/net/tun", false, map[string]any{"hostPath": map[string]any{"path": tunDev, "type": "CharDevice"}})
	case fds:
		args := map[string]any{"ips": []string{p.ip}}
		for key, v := range cniArgs {
			args[key] = v
		}
		networks = []any{map[string]any{"name": "napitap-bridge", "interface": p.podIf, "mac": p.mac, "cni-args": args}}
		guest.MAC = "{mac}"
		netdev := "tap,id=n0,fds={fds},vhost=off"
		argv = append([]string{"napitapctl", "--socket", napitapdSocket, "exec", "--"}, // the netns' one attachment
			vm.QEMUArgs("/guest/"+k.kernel, "/guest/"+k.initrd, netdev, 2, guest, "/dev/stdout", false)...)
		// QEMU as 107, the tap's owner: napitapd hands a tap's queues
		// only to who may attach it, and the nonroot-vmm overlay lets
		// group 107 connect.
		podSec = map[string]any{"runAsUser": 107, "runAsGroup": 107, "runAsNonRoot": true,
			"seccompProfile": map[string]any{"type": "RuntimeDefault"}}
		ctrSec = map[string]any{"allowPrivilegeEscalation": false, "capabilities": map[string]any{"drop": []string{"ALL"}}}
		mount("napitap", "/run/napitap", true, map[string]any{"hostPath": map[string]any{"path": "/run/napitap", "type": "Directory"}})
	}
	argv = append(argv, "-name", p.name)
	annotation, _ := jsonString(networks)
	container := map[string]any{
		"name": "vmm", "image": vmmRef, "imagePullPolicy": "Never",
		"command": argv, "volumeMounts": mounts,
	}
	if ctrSec != nil {
		container["securityContext"] = ctrSec
	}
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": p.name, "namespace": podNamespace,
			"labels":      map[string]any{"app.kubernetes.io/name": "napitap-kind-vm", "napitap.e2e/mode": p.mode},
			"annotations": map[string]any{"k8s.v1.cni.cncf.io/networks": annotation}},
		"spec": map[string]any{
			"nodeName":                      p.node,
			"restartPolicy":                 "Never", // as virt-launcher's
			"terminationGracePeriodSeconds": 5,
			"automountServiceAccountToken":  false,
			"enableServiceLinks":            false,
			"securityContext":               podSec,
			"containers":                    []any{container},
			"volumes":                       volumes,
		},
	}
}

// prepareWorker makes the tun device node VM pods mount.
func prepareWorker(node string) error {
	_, err := onNode(node, "sh", "-c", fmt.Sprintf("mkdir -p %s && { [ -c %s ] || mknod -m 0666 %s c 10 200; }", filepath.Dir(tunDev), tunDev, tunDev))
	return err
}

// addGateway gives the worker's napitap0, which the first ADD there made,
// the gateway address the guests ping.
func addGateway(node string) error {
	_, err := onNode(node, "ip", "addr", "replace", gateway+"/24", "dev", "napitap0")
	return err
}

// startVMs applies the VM pods and waits until each runs, its guest pings
// the gateway and its queues are NAPI queues.
func (k *kind) startVMs(t *testing.T, pods ...*vmPod) {
	t.Helper()
	start := time.Now()
	names := make([]string, len(pods))
	for i, p := range pods {
		k.apply(t, k.vmManifest(p))
		names[i] = p.name
	}
	k.waitReady(t, 3*time.Minute, names...)
	for _, p := range pods {
		var err error
		if p.sandbox, err = sandboxOf(p.node, p.name); err != nil || p.sandbox == "" {
			t.Fatalf("pod %s: sandbox %q on %s: %v", p.name, p.sandbox, p.node, err)
		}
		if p.netns, err = netnsOf(p.node, p.sandbox); err != nil {
			t.Fatal(err)
		}
		if err := addGateway(p.node); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pods {
		k.waitPings(t, p, 1, 5*time.Minute)
		if err := poll(time.Minute, func() error {
			var err error
			p.qemuPid, err = qemuPidOf(p.name)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		k.checkNAPIQueues(t, p)
	}
	t.Logf("VM pods %v running, their guests pinging %s, in %v", names, gateway, time.Since(start).Round(time.Second))
}

// pings counts the guest's pings that got an answer, from its serial
// console (the container's log).
func (k *kind) pings(p *vmPod) (ok, failed int, log string, err error) {
	log, err = k.kubectl("logs", "-n", podNamespace, p.name)
	return strings.Count(log, "PING-OK"), strings.Count(log, "PING-FAIL"), log, err
}

// waitPings waits until the guest has had more than n answers.
func (k *kind) waitPings(t testing.TB, p *vmPod, n int, timeout time.Duration) int {
	t.Helper()
	var got int
	err := poll(timeout, func() error {
		ok, _, log, err := k.pings(p)
		if err != nil {
			return err
		}
		if strings.Contains(log, vm.MarkerError) {
			return fmt.Errorf("the guest failed: %s", crihelp.Tail(log, 2000))
		}
		if got = ok; ok < n {
			return fmt.Errorf("the guest had %d answers from %s, want %d:\n%s", ok, gateway, n, crihelp.Tail(log, 2000))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod %s on %s: %v", p.name, p.node, err)
	}
	return got
}

// checkNAPIQueues asks napitapctl queues, in the node's DaemonSet pod,
// for the NIC's queues: QEMU holds both, and the tap is NAPI.
func (k *kind) checkNAPIQueues(t testing.TB, p *vmPod) {
	t.Helper()
	var out string
	err := poll(time.Minute, func() error {
		qs, raw, err := k.queuesOf(p.node, p.sandbox, p.podIf)
		out = raw
		if err != nil {
			return err
		}
		var rows []string
		for _, q := range qs {
			rows = append(rows, fmt.Sprintf("  pid %d %s fd %d: tap NAPI %v", q.PID, q.Command, q.FD, q.Tap.NAPI))
		}
		out = strings.Join(rows, "\n")
		n := 0
		for _, q := range qs {
			if strings.HasPrefix(q.Command, "qemu-system") {
				n++
			}
			if !q.Tap.NAPI {
				return fmt.Errorf("queue fd %d of %s (pid %d) is not NAPI", q.FD, q.Command, q.PID)
			}
		}
		if n != 2 {
			return fmt.Errorf("QEMU holds %d queues of %s, want 2", n, p.tap)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod %s (%s mode) on %s: napitapctl queues --container %s --ifname %s: %v\n%s", p.name, p.mode, p.node, p.sandbox, p.podIf, err, out)
	}
	t.Logf("pod %s (%s mode) on %s: napitapctl queues --container %.12s --ifname %s -o json, in the node's napitap pod:\n%s", p.name, p.mode, p.node, p.sandbox, p.podIf, out)
}

// qemuPidOf finds, on this machine, the QEMU whose -name is name: kind's
// nodes are containers, their processes this kernel's.
func qemuPidOf(name string) (int, error) {
	return theQEMU("named "+name, func(args []string) bool {
		i := slices.Index(args, "-name")
		return i >= 0 && i+1 < len(args) && args[i+1] == name
	})
}

// theQEMU is the one qemu-system-x86_64 on this machine whose arguments
// match; what names it in the error.
func theQEMU(what string, match func(args []string) bool) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if filepath.Base(args[0]) == "qemu-system-x86_64" && match(args) {
			pids = append(pids, pid)
		}
	}
	if len(pids) != 1 {
		return 0, fmt.Errorf("QEMUs %s on this machine: %v", what, pids)
	}
	return pids[0], nil
}

// hotPlug is a QMP netdev_add of the intercept VM's second tap, as
// KubeVirt's NIC hot-plug has libvirt do: QEMU opens its 2 queues by name,
// and each must come out a NAPI queue (a GRO probe on a copy of QEMU's
// fd); then netdev_del. It returns the error QEMU or the probe gave.
func (p *vmPod) hotPlug(id string) (time.Duration, error) {
	before, err := vm.TapQueuesOf(p.qemuPid, p.hpTap)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	qmp := fmt.Sprintf("/proc/%d/root/out/qmp.sock", p.qemuPid)
	err = vm.QMPExecute(qmp, 3*time.Minute, "netdev_add", map[string]any{
		"type": "tap", "id": id, "ifname": p.hpTap, "script": "no", "downscript": "no", "vhost": false, "queues": 2})
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	defer func() { _ = vm.QMPExecute(qmp, time.Minute, "netdev_del", map[string]any{"id": id}) }()
	after, err := vm.TapQueuesOf(p.qemuPid, p.hpTap)
	if err != nil {
		return took, err
	}
	var added []int
	for _, fd := range after {
		if !slices.Contains(before, fd) {
			added = append(added, fd)
		}
	}
	if len(added) != 2 {
		return took, fmt.Errorf("QEMU opened queues %v of %s, want 2", added, p.hpTap)
	}
	pidfd, err := unix.PidfdOpen(p.qemuPid, 0)
	if err != nil {
		return took, fmt.Errorf("pidfd_open of QEMU, pid %d: %w", p.qemuPid, err)
	}
	defer unix.Close(pidfd)
	var errs []error
	for _, fd := range added {
		errs = append(errs, probeQueue(pidfd, fd))
	}
	return took, errors.Join(errs...)
}

// probeQueue takes a copy of QEMU's fd and proves it a NAPI queue.
func probeQueue(pidfd, fd int) error {
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return fmt.Errorf("pidfd_getfd of QEMU's fd %d: %w", fd, err)
	}
	q := os.NewFile(uintptr(dup), fmt.Sprintf("QEMU's fd %d", fd))
	defer q.Close()
	if flags, err := tapsetup.QueueFlagsOf(q); err != nil || flags&unix.IFF_NAPI == 0 {
		return fmt.Errorf("QEMU's fd %d: TUNGETIFF flags %#x (%v), want IFF_NAPI", fd, flags, err)
	}
	res, err := napiprobe.RunQueue(q, 16, 1000)
	if err != nil {
		return fmt.Errorf("QEMU's fd %d: %w", fd, err)
	}
	if !res.Merged() {
		return fmt.Errorf("QEMU's fd %d is no NAPI queue: %v", fd, res)
	}
	return nil
}

// stillRunning: the same QEMU runs and its guest got answers since.
func (k *kind) stillRunning(t testing.TB, p *vmPod, answersBefore int, event string) int {
	t.Helper()
	if pid, err := qemuPidOf(p.name); err != nil || pid != p.qemuPid {
		t.Errorf("after %s: pod %s's QEMU is %d (%v), was %d", event, p.name, pid, err, p.qemuPid)
	}
	return k.waitPings(t, p, answersBefore+2, 2*time.Minute)
}
