package suite

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/answertimes"
)

// TestKubeVirtVMWithoutNapitapRunsBesideOneWithIt: a VM chooses napitap
// per interface (binding napitap), but napitap's virt-launcher profile is
// cluster-wide, so the TUNSETIFF of a VM with no napitap NIC goes through
// napitapd too, which passes it to the kernel. Beside a VM on napitap's
// binding, on one worker: a VM with only the pod network (masquerade)
// runs; its queues are passed through (napitapd_tunsetiff_total), and
// what it waited on napitapd is napitapd_tunsetiff_answer_seconds; then
// the same VM started during a rollout of napitap's DaemonSet.
func TestKubeVirtVMWithoutNapitapRunsBesideOneWithIt(t *testing.T) {
	k := cluster
	k.kubeVirtReady(t)
	w := k.workers[0]
	on := &kvCase{name: "kv-on", nad: "napitap-kubevirt", multiqueue: true, napi: true, vcpus: 2,
		ip: "10.198.0.241/24", mac: "02:00:0a:c6:00:f1"}
	// Its guest pings 10.198.0.1, which its pod network does not reach:
	// it only has to run.
	off := &kvCase{name: "kv-off", multiqueue: true, vcpus: 2, podNetwork: true,
		ip: "10.198.0.242/24", mac: "02:00:0a:c6:00:f2"}
	before := k.answers(t, w)
	start := time.Now()
	k.startKubeVirtVM(t, w, on)
	k.startKubeVirtVM(t, w, off)
	r := k.waitKubeVirtVMI(t, on, "")
	k.waitGuestPings(t, on, r, 2)
	k.checkKubeVirtQueues(t, on, r, kubeVirtNetwork)
	offRun := k.waitKubeVirtVMI(t, off, "")
	took := time.Since(start)
	after := k.answers(t, w)
	passed := after.Since(before, "passed_through")
	// kv-off's pod tap, multiqueue with 2 vCPUs: 2 TUNSETIFFs, each left to
	// the kernel.
	if passed.Count < 2 {
		t.Errorf("napitapd on %s passed %v TUNSETIFFs through while kv-off started, want at least its 2 queues", w, passed.Count)
	}
	t.Logf("kv-on (napitap binding) and kv-off (pod network only) on %s, Running within %v; napitapd's answers meanwhile:\n  napi: %s\n  passed_through: %s",
		w, took.Round(time.Second), after.Since(before, "napi"), passed)

	// kv-off again, started while napitap's DaemonSet rolls out.
	k.kubectlMust(t, "delete", "vm", "-n", podNamespace, off.name, "--wait=true", "--timeout=180s")
	k.waitAttachmentGone(t, offRun)
	k.kubectlMust(t, "rollout", "restart", "-n", dsNamespace, "daemonset/napitap")
	start = time.Now()
	k.startKubeVirtVM(t, w, off)
	k.waitKubeVirtVMI(t, off, "")
	during := time.Since(start)
	k.kubectlMust(t, "rollout", "status", "-n", dsNamespace, "daemonset/napitap", "--timeout=300s")
	k.checkKubeVirtQueues(t, on, r, kubeVirtNetwork)
	t.Logf("kv-off started during a rollout of napitap's DaemonSet: Running %v after its apply; kv-on kept its NAPI queues",
		during.Round(time.Second))
}

// answers scrapes napitapd's /metrics on node, where the DaemonSet
// serves them (the node's address, port 9695).
func (k *kind) answers(t *testing.T, node string) answertimes.Times {
	t.Helper()
	ip := strings.TrimSpace(k.kubectlMust(t, "get", "node", node, "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`))
	var body string
	err := poll(time.Minute, func() error {
		resp, err := http.Get("http://" + ip + ":9695/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("napitapd's /metrics on %s (%s:9695): %v", node, ip, err)
	}
	h, err := answertimes.Parse(strings.NewReader(body))
	if err != nil {
		t.Fatalf("node %s: %v", node, err)
	}
	return h
}
