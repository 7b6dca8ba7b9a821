package suite

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// hotPlugNetwork is the interface the day's VM is given while it runs.
const hotPlugNetwork = "hotplug"

// TestKubeVirtVMThroughAnOperatorsDay takes one KubeVirt VM (a NAPI
// multiqueue NIC on napitap's network, and the pod network with
// masquerade, as most VMs have) through what an operator does while it
// runs: a rollout of napitap's DaemonSet, a NIC hot-plugged, a restart,
// and a live migration to the other worker. What KubeVirt itself refuses
// is logged with its words; what napitap owes (the queues, the pings, no
// attachment left behind) is checked at every step.
func TestKubeVirtVMThroughAnOperatorsDay(t *testing.T) {
	k := cluster
	k.kubeVirtReady(t)
	c := &kvCase{name: "kv-day", nad: "napitap-kubevirt", multiqueue: true, napi: true, vcpus: 2,
		ip: "10.198.0.240/24", mac: "02:00:0a:c6:00:f0", podNetwork: true}
	domain := kubeVirtDomain(c)
	k.startKubeVirtVM(t, "", c)
	r := k.waitKubeVirtVMI(t, c, "")
	k.waitGuestPings(t, c, r, 2)
	k.checkKubeVirtQueues(t, c, r, kubeVirtNetwork)
	var summary []string
	t.Cleanup(func() {
		t.Logf("KubeVirt v1.7.0, VM %s through an operator's day:\n  %s", c.name, strings.Join(summary, "\n  "))
	})
	steps := []struct {
		name string
		run  func(t *testing.T) string
	}{
		{"a rollout of napitap's DaemonSet keeps the VM's QEMU, its NAPI queues and its pings", func(t *testing.T) string {
			qemu, err := kubeVirtQEMU(domain)
			if err != nil {
				t.Fatal(err)
			}
			before, _, _ := k.guestPings(r)
			start := time.Now()
			k.kubectlMust(t, "rollout", "restart", "-n", dsNamespace, "daemonset/napitap")
			k.kubectlMust(t, "rollout", "status", "-n", dsNamespace, "daemonset/napitap", "--timeout=300s")
			took := time.Since(start)
			if now, err := kubeVirtQEMU(domain); err != nil || now != qemu {
				t.Fatalf("after the rollout, VM %s's QEMU is %d (%v), was %d", c.name, now, err, qemu)
			}
			after := k.waitGuestPings(t, c, r, before+2)
			k.checkKubeVirtQueues(t, c, r, kubeVirtNetwork)
			return fmt.Sprintf("rollout (%v): same QEMU (pid %d), NAPI queues kept, pings %d then %d", took.Round(time.Second), qemu, before, after)
		}},
		{"a NIC hot-plugged into the running VM", func(t *testing.T) string {
			return k.kubeVirtHotPlug(t, c, r)
		}},
		{"the VM restarted gets NAPI queues on every napitap NIC and leaves nothing of its old pod", func(t *testing.T) string {
			var s string
			r, s = k.kubeVirtRestart(t, c, r)
			return s
		}},
		{"a live migration to the other worker, or KubeVirt refusing it, leaves the VM its NAPI queues and napitap nothing stray", func(t *testing.T) string {
			var s string
			r, s = k.kubeVirtMigrate(t, c, r)
			return s
		}},
	}
	for _, s := range steps {
		var got string
		ok := t.Run(s.name, func(t *testing.T) { got = s.run(t) })
		summary = append(summary, fmt.Sprintf("%s: %s", s.name, got))
		if !ok {
			t.Fatalf("%s failed: the later steps need what it left", s.name)
		}
	}
	k.kubectlMust(t, "delete", "vm", "-n", podNamespace, c.name, "--wait=true", "--timeout=180s")
	k.waitAttachmentGone(t, r)
}

// kubeVirtHotPlug adds a second napitap NIC to the running VM's spec, as
// an operator hot-plugs one, and says what KubeVirt did with it. v1.7.0
// hot-plugs only bridge and SR-IOV interfaces
// (pkg/network/controllers/vm.go, applyDynamicIfaceRequestOnVMI), and an
// added interface does not make a VM RestartRequired
// (pkg/network/vmliveupdate, which counts only removed or changed ones):
// a NIC with a binding plugin waits, unsaid, for the next restart, which
// gives it napitap's queues (kubeVirtRestart checks).
func (k *kind) kubeVirtHotPlug(t *testing.T, c *kvCase, r kvRun) string {
	patch := fmt.Sprintf(`[{"op":"add","path":"/spec/template/spec/domain/devices/interfaces/-","value":{"name":%q,"binding":{"name":"napitap"}}},`+
		`{"op":"add","path":"/spec/template/spec/networks/-","value":{"name":%q,"multus":{"networkName":%q}}}]`,
		hotPlugNetwork, hotPlugNetwork, c.nad)
	k.kubectlMust(t, "patch", "vm", "-n", podNamespace, c.name, "--type", "json", "-p", patch)
	var how, last string
	err := poll(time.Minute, func() error {
		ifaces, err := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", `jsonpath={.spec.domain.devices.interfaces[*].name}`)
		if err != nil {
			return err
		}
		if strings.Contains(" "+ifaces+" ", " "+hotPlugNetwork+" ") {
			how = "hot-plugged into the running VMI"
			return nil
		}
		cond, err := k.kubectl("get", "vm", "-n", podNamespace, c.name, "-o",
			`jsonpath={.status.conditions[?(@.type=="RestartRequired")].status}: {.status.conditions[?(@.type=="RestartRequired")].message}`)
		if err != nil {
			return err
		}
		if strings.HasPrefix(cond, "True") {
			how = "not hot-plugged: the VM's condition RestartRequired " + strings.TrimSpace(cond)
			return nil
		}
		last = fmt.Sprintf("the VMI's interfaces are still %q, and the VM has no RestartRequired condition", ifaces)
		return fmt.Errorf("VM %s: %s", c.name, last)
	})
	if err != nil {
		events, _ := k.kubectl("get", "events", "-n", podNamespace, "--field-selector", "involvedObject.name="+c.name,
			"-o", `jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}`)
		how = "neither hot-plugged nor flagged: a minute later " + last + "; it waits for the next restart"
		t.Logf("VM %s: its events:\n%s", c.name, events)
	}
	t.Logf("VM %s: a napitap NIC added to the running VM's spec: %s", c.name, how)
	if strings.HasPrefix(how, "hot-plugged") {
		k.checkKubeVirtQueues(t, c, r, hotPlugNetwork)
	}
	return how
}

// kubeVirtRestart restarts the VM as `virtctl restart` does (the restart
// subresource), and waits for the new VMI to run and ping, each of its
// napitap NICs to have NAPI queues, and the old pod's attachment to be
// gone.
func (k *kind) kubeVirtRestart(t *testing.T, c *kvCase, old kvRun) (kvRun, string) {
	uid := k.kubectlMust(t, "get", "vmi", "-n", podNamespace, c.name, "-o", "jsonpath={.metadata.uid}")
	body := filepath.Join(t.TempDir(), "restart.json")
	if err := os.WriteFile(body, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	k.kubectlMust(t, "replace", "--raw",
		fmt.Sprintf("/apis/subresources.kubevirt.io/v1/namespaces/%s/virtualmachines/%s/restart", podNamespace, c.name), "-f", body)
	err := poll(3*time.Minute, func() error {
		now, err := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", "jsonpath={.metadata.uid}")
		if err != nil || now == "" || now == uid {
			return fmt.Errorf("VMI %s: uid %q (was %s): %v", c.name, now, uid, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := k.waitKubeVirtVMI(t, c, "")
	took := time.Since(start)
	k.waitGuestPings(t, c, r, 2)
	nics := []string{kubeVirtNetwork}
	if ifaces, _ := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", `jsonpath={.spec.domain.devices.interfaces[*].name}`); strings.Contains(" "+ifaces+" ", " "+hotPlugNetwork+" ") {
		nics = append(nics, hotPlugNetwork)
	}
	for _, n := range nics {
		k.checkKubeVirtQueues(t, c, r, n)
	}
	k.waitAttachmentGone(t, old)
	return r, fmt.Sprintf("restarted (%v to Running) on %s: NAPI queues on %s; the old pod's attachment gone from %s",
		took.Round(time.Second), r.node, strings.Join(nics, " and "), old.node)
}

// kubeVirtMigrate live-migrates the VMI, if KubeVirt can, and checks the
// target's queues and pings and that the source's attachment is gone.
// What KubeVirt refuses is named with its words, not failed: that is
// KubeVirt's to decide. Under emulation v1.7.0 refuses at scheduling: the
// source's host-model CPU is QEMU's kvm64 under TCG, the target pod needs
// a node labelled cpu-model-migration.node.kubevirt.io/kvm64, and the
// node-labeller labels none so. Then the migration is cancelled, and the
// VM must run on as before, napitap's attachment untouched, the target
// pod having left nothing.
func (k *kind) kubeVirtMigrate(t *testing.T, c *kvCase, src kvRun) (kvRun, string) {
	cond := k.kubectlMust(t, "get", "vmi", "-n", podNamespace, c.name, "-o",
		`jsonpath={.status.conditions[?(@.type=="LiveMigratable")].status} {.status.conditions[?(@.type=="LiveMigratable")].reason}: {.status.conditions[?(@.type=="LiveMigratable")].message}`)
	if !strings.HasPrefix(cond, "True") {
		t.Logf("VMI %s is not live-migratable, KubeVirt says: %s", c.name, cond)
		return src, "not migrated: KubeVirt's LiveMigratable condition is " + cond
	}
	qemu, err := kubeVirtQEMU(kubeVirtDomain(c))
	if err != nil {
		t.Fatal(err)
	}
	before, _, _ := k.guestPings(src)
	name := c.name + "-migration"
	k.kubectl("delete", "vmim", "-n", podNamespace, name, "--ignore-not-found", "--wait=true")
	start := time.Now()
	k.apply(t, map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
		"metadata": map[string]any{"name": name, "namespace": podNamespace},
		"spec":     map[string]any{"vmiName": c.name},
	})
	t.Cleanup(func() { k.kubectl("delete", "vmim", "-n", podNamespace, name, "--ignore-not-found") })
	const refusal = "NoSuitableNodesForHostModelMigration"
	var phase, refused, failed string
	err = poll(6*time.Minute, func() error {
		out, err := k.kubectl("get", "vmim", "-n", podNamespace, name, "-o", "jsonpath={.status.phase}")
		if err != nil {
			return err
		}
		phase = strings.TrimSpace(out)
		switch phase {
		case "Succeeded":
			return nil
		case "Failed":
			failed, _ = k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", "jsonpath={.status.migrationState.failureReason}")
			if failed = strings.TrimSpace(failed); failed == "" {
				failed = "no failureReason given"
			}
			return nil
		}
		ev, _ := k.kubectl("get", "events", "-n", podNamespace, "--field-selector", "involvedObject.name="+c.name+",reason="+refusal,
			"-o", "jsonpath={.items[0].message}")
		if ev != "" {
			refused = ev
			return nil
		}
		return fmt.Errorf("migration %s: phase %q", name, phase)
	})
	if err != nil {
		state, _ := k.kubectl("get", "vmi", "-n", podNamespace, c.name, "-o", "jsonpath={.status.migrationState}")
		t.Fatalf("%v; the VMI's migrationState: %s\n%s", err, state, k.kubeVirtDiagnostics(c.name))
	}
	if refused != "" || failed != "" {
		var why string
		if refused != "" {
			// The label the target pod waits for, and which worker has it.
			if i := strings.Index(refused, ": map["); i > 0 {
				refused = refused[:i]
			}
			sel, _ := k.kubectl("get", "pods", "-n", podNamespace, "-l", "kubevirt.io=virt-launcher,vm.kubevirt.io/name="+c.name,
				"--field-selector", "status.phase=Pending", "-o", `jsonpath={.items[0].spec.nodeSelector}`)
			var want string
			if m := regexp.MustCompile(`"(cpu-model-migration\.node\.kubevirt\.io/[^"]+)"`).FindStringSubmatch(sel); m != nil {
				want = m[1]
			}
			t.Logf("VMI %s: migration %s refused by KubeVirt (event %s): %s; the target pod's nodeSelector asks for %q, which no worker has",
				c.name, name, refusal, refused, want)
			why = fmt.Sprintf("KubeVirt refused under emulation (%s: %q; the target pod needs node label %s)", refusal, refused, want)
		} else {
			// KubeVirt's own failure: where seen (kind, v1.7.0), its
			// virt-handler could not mount the kernel-boot artifacts
			// into the target pod ("failed making the directory ...
			// container-disks: file exists").
			t.Logf("VMI %s: migration %s failed in KubeVirt: %s", c.name, name, failed)
			why = fmt.Sprintf("KubeVirt's migration failed (%s)", failed)
		}
		k.kubectlMust(t, "delete", "vmim", "-n", podNamespace, name, "--wait=true", "--timeout=120s")
		err := poll(2*time.Minute, func() error {
			// A failed migration's target pod is left Succeeded or
			// Failed, its sandbox stopped; a refused one's is deleted.
			out, err := k.kubectl("get", "pods", "-n", podNamespace, "-l", "kubevirt.io=virt-launcher,vm.kubevirt.io/name="+c.name,
				"--field-selector", "status.phase!=Succeeded,status.phase!=Failed", "-o", "jsonpath={.items[*].metadata.name}")
			if err != nil || len(strings.Fields(out)) != 1 {
				return fmt.Errorf("virt-launcher pods of %s not ended: %q (%v), want only %s", c.name, out, err, src.launcher)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if now, err := kubeVirtQEMU(kubeVirtDomain(c)); err != nil || now != qemu {
			t.Fatalf("after the refused migration, VM %s's QEMU is %d (%v), was %d", c.name, now, err, qemu)
		}
		after := k.waitGuestPings(t, c, src, before+2)
		k.checkKubeVirtQueues(t, c, src, kubeVirtNetwork)
		for _, w := range k.workers {
			if w == src.node {
				continue
			}
			// A failed migration's target pod had a sandbox, whose DEL
			// may still be running when the pod object is gone.
			var list string
			err := poll(time.Minute, func() error {
				var err error
				if list, err = k.attachments(w); err == nil && strings.Contains(list, "pod9107fdbb351") && strings.Contains(list, "02:00:0a:c6:00:f0") {
					err = errors.New("the target pod's attachment is still held")
				}
				return err
			})
			if err != nil {
				t.Errorf("napitapd on %s after the cancelled migration (%v):\n%s", w, err, list)
			}
		}
		return src, fmt.Sprintf("not migrated: %s; cancelled, the VM ran on: same QEMU, NAPI queues, pings %d then %d", why, before, after)
	}
	took := time.Since(start)
	r := k.waitKubeVirtVMI(t, c, src.node)
	k.waitGuestPings(t, c, r, 2)
	k.checkKubeVirtQueues(t, c, r, kubeVirtNetwork)
	k.waitAttachmentGone(t, src)
	return r, fmt.Sprintf("migrated from %s to %s in %v: the target's QEMU holds NAPI queues, the guest pings, the source's attachment gone",
		src.node, r.node, took.Round(time.Second))
}
