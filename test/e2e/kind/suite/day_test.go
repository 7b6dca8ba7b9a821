package suite

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// row is one line of the operations table: an event on a node, how long
// no napitapd served there, and what happened to what was started then.
type row struct {
	event, node string
	unserved    string // how long no napitapd served on the node
	created     int    // pods started during the event
	failed      int
	hotPlugs    string // hot-plugs during the event: "ok/done" or a note
	note        string
}

// TestVMsOnTwoWorkersThroughAnOperatorsDay runs VM pods on both workers,
// in both modes, and then what an operator does to a cluster, one event
// after another, with the VMs running:
//
//   - a DaemonSet rollout (kubectl rollout restart) across both workers
//     while each intercept VM hot-plugs NICs and new pods start;
//   - kubectl delete -k and then apply -k;
//   - a worker lost (docker stop) and back (docker start);
//   - a drain of the other worker.
//
// The guests ping their gateway all along; each event's row goes into the
// operations table logged at the end (deploy/README.md, "Operations").
func TestVMsOnTwoWorkersThroughAnOperatorsDay(t *testing.T) {
	k := cluster
	// What a kept cluster (KEEP_CLUSTER=1) has left of a previous run.
	k.kubectlMust(t, "delete", "pods", "-n", podNamespace, "--wait=true", "--timeout=120s", "--ignore-not-found",
		"-l", "app.kubernetes.io/name in (napitap-kind-vm,napitap-kind-probe,napitap-kind-keeper)")
	k.buildVMMImage(t)
	k.kubectlMust(t, "apply", "-n", podNamespace, "-f", filepath.Join(k.repo, "deploy", "kubevirt", "nad.yaml"),
		"-f", filepath.Join(k.repo, "deploy", "examples", "napitap-bridge.yaml"))
	var vms []*vmPod
	byNode := map[string][]*vmPod{}
	for i, w := range k.workers {
		if err := prepareWorker(w); err != nil {
			t.Fatal(err)
		}
		for _, mode := range []string{intercept, fds} {
			p := newVMPod(fmt.Sprintf("vm-%s-%d", mode, i), w, mode)
			vms = append(vms, p)
			byNode[w] = append(byNode[w], p)
		}
	}
	var rows []row
	t.Cleanup(func() {
		t.Logf("operations on the kind cluster (3 nodes, VMs in both modes on both workers):\n%s", table(rows))
	})

	steps := []struct {
		name string
		run  func(t *testing.T) []row
	}{
		{"VM pods on both workers get NAPI queues and reach the gateway", func(t *testing.T) []row {
			k.startVMs(t, vms...)
			return nil
		}},
		{"a DaemonSet rollout across both workers with NICs hot-plugged during it fails nothing", func(t *testing.T) []row {
			return k.rollout(t, vms)
		}},
		{"kubectl delete -k and apply -k with VMs running on both workers", func(t *testing.T) []row {
			return k.removeAndReapply(t, vms)
		}},
		{"a worker lost and back leaves the other worker's VMs untouched and nothing behind", func(t *testing.T) []row {
			return k.nodeLoss(t, k.workers[1], byNode)
		}},
		{"a drained worker's VM pods go and leave nothing behind", func(t *testing.T) []row {
			return k.drain(t, k.workers[0], byNode[k.workers[0]])
		}},
	}
	for _, s := range steps {
		var got []row
		if !t.Run(s.name, func(t *testing.T) { got = s.run(t) }) {
			rows = append(rows, got...)
			t.Fatalf("%s failed: the later events need what it left", s.name)
		}
		rows = append(rows, got...)
	}
}

// roundMs rounds a Go duration string to milliseconds.
func roundMs(d string) string {
	if v, err := time.ParseDuration(d); err == nil {
		return v.Round(time.Millisecond).String()
	}
	return d
}

// qemuError is QEMU's own words in a QMP error.
func qemuError(err string) string {
	if i := strings.Index(err, "could not"); i >= 0 {
		return err[i:]
	}
	return err
}

func table(rows []row) string {
	var b strings.Builder
	b.WriteString("| event | node | no napitapd served | pods created / failed | hot-plugs ok | what the VMs saw |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %d / %d | %s | %s |\n", r.event, r.node, r.unserved, r.created, r.failed, r.hotPlugs, r.note)
	}
	return b.String()
}

// hotPlugLoop hot-plugs NICs into the intercept VMs one after another
// until stop is closed.
type hotPlugLoop struct {
	stop chan struct{}
	wg   sync.WaitGroup
	mu   sync.Mutex
	done map[string]int     // node: hot-plugs that gave NAPI queues
	errs map[string][]error // node: those that did not
}

func startHotPlugs(vms []*vmPod, event string) *hotPlugLoop {
	l := &hotPlugLoop{stop: make(chan struct{}), done: map[string]int{}, errs: map[string][]error{}}
	for _, p := range vms {
		if p.mode != intercept {
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				_, err := p.hotPlug(fmt.Sprintf("hp-%s-%d", event, i))
				l.mu.Lock()
				if err != nil {
					l.errs[p.node] = append(l.errs[p.node], fmt.Errorf("pod %s, hot-plug %d: %w", p.name, i, err))
				} else {
					l.done[p.node]++
				}
				l.mu.Unlock()
				time.Sleep(time.Second)
			}
		}()
	}
	return l
}

func (l *hotPlugLoop) halt(t testing.TB) {
	close(l.stop)
	l.wg.Wait()
	for _, errs := range l.errs {
		for _, err := range errs {
			t.Error(err)
		}
	}
}

func (l *hotPlugLoop) summary(node string) string {
	return fmt.Sprintf("%d/%d", l.done[node], l.done[node]+len(l.errs[node]))
}

// startProbePods creates one pod per node on napitap-bridge (its queues
// held by napitapd, so its ADD needs a serving napitapd) while an event
// happens.
func (k *kind) startProbePods(t testing.TB, event string, nodes ...string) map[string]string {
	t.Helper()
	names := map[string]string{} // pod: node
	for i, node := range nodes {
		name := fmt.Sprintf("probe-%s-%d", event, i)
		k.apply(t, waitingPod(name, node, "napitap-kind-probe"))
		names[name] = node
	}
	return names
}

// probeOutcome waits for the probe pods and counts, per node, those
// created and those that never got Ready or had a sandbox fail on the
// way; then it deletes them.
func (k *kind) probeOutcome(t testing.TB, pods map[string]string) (created, failed map[string]int) {
	t.Helper()
	created, failed = map[string]int{}, map[string]int{}
	var names []string
	for name, node := range pods {
		names = append(names, name)
		created[node]++
		_, err := k.kubectl("wait", "-n", podNamespace, "--for=condition=Ready", "--timeout=180s", "pod/"+name)
		events, _ := k.kubectl("get", "events", "-n", podNamespace, "--field-selector", "involvedObject.name="+name+",type=Warning",
			"-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
		if err != nil || strings.TrimSpace(events) != "" {
			failed[node]++
			t.Errorf("pod %s: %v; warnings:\n%s", name, err, events)
		}
	}
	k.kubectlMust(t, append([]string{"delete", "-n", podNamespace, "--wait=true", "--timeout=120s"}, prefixed("pod/", names)...)...)
	return created, failed
}

// rollout: kubectl rollout restart of the DaemonSet, as an upgrade does,
// while the intercept VMs hot-plug NICs and a pod starts on each worker.
// Each worker's new napitapd must take everything over from the old one.
func (k *kind) rollout(t *testing.T, vms []*vmPod) []row {
	answers := map[*vmPod]int{}
	for _, p := range vms {
		answers[p], _, _, _ = k.pings(p)
	}
	old := map[string]dsPod{}
	for _, w := range k.workers {
		ds, err := k.dsPodOn(w)
		if err != nil {
			t.Fatal(err)
		}
		old[w] = ds
	}
	start := time.Now()
	loop := startHotPlugs(vms, "rollout")
	k.kubectlMust(t, "rollout", "restart", "-n", dsNamespace, "daemonset/napitap")
	probes := k.startProbePods(t, "rollout", k.workers...)
	k.kubectlMust(t, "rollout", "status", "-n", dsNamespace, "daemonset/napitap", "--timeout=300s")
	took := time.Since(start)
	loop.halt(t)
	created, failed := k.probeOutcome(t, probes)
	var rows []row
	for _, w := range k.workers {
		ds, s, err := k.waitServing(w, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if ds.name == old[w].name || !s.tookOver {
			t.Errorf("%s: napitap pod %s (was %s) serves with tookOver=%v, want a new pod that took over", w, ds.name, old[w].name, s.tookOver)
		}
		t.Logf("%s: pod %s's napitapd took everything over from %s's in %s", w, ds.name, old[w].name, s.took)
		rows = append(rows, row{event: "`kubectl rollout restart ds/napitap`", node: w,
			unserved: roundMs(s.took) + " (takeover)", created: created[w], failed: failed[w],
			hotPlugs: loop.summary(w), note: "same QEMU, pings answered"})
	}
	for _, p := range vms {
		k.stillRunning(t, p, answers[p], "the rollout")
	}
	t.Logf("rollout across %d workers complete in %v", len(k.workers), took.Round(time.Second))
	return rows
}

// removeAndReapply: kubectl delete -k (napitap removed, the VMs running),
// then apply -k. What the VMs get: the fds VMs keep their queues; an
// intercept VM's next TUNSETIFF (a hot-plug) gets ENOSYS once no process
// holds its seccomp listener, and still after the re-apply
// (DESIGN.md fact 12); its running NIC keeps working.
func (k *kind) removeAndReapply(t *testing.T, vms []*vmPod) []row {
	dir := filepath.Join(k.repo, "test", "e2e", "kind")
	answers := map[*vmPod]int{}
	for _, p := range vms {
		answers[p], _, _, _ = k.pings(p)
	}
	// What an operator asks first ("Removal" in deploy/README.md): which
	// containers are under the filter, and so lose their TUNSETIFF.
	for _, w := range k.workers {
		ds, err := k.dsPodOn(w)
		if err != nil {
			t.Fatal(err)
		}
		out := k.kubectlMust(t, "exec", "-n", dsNamespace, ds.name, "-c", "napitapd", "--", "napitapctl", "filtered")
		t.Logf("%s: napitapctl filtered:\n%s", w, out)
		for _, p := range vms {
			if p.node == w && p.mode == intercept && !strings.Contains(out, p.name) {
				t.Errorf("%s: napitapctl filtered does not name VM pod %s, which is under the filter", w, p.name)
			}
		}
	}
	start := time.Now()
	k.kubectlMust(t, "delete", "-k", dir, "--wait=false")
	err := poll(3*time.Minute, func() error {
		if _, err := k.kubectl("get", "namespace", dsNamespace); err == nil {
			return fmt.Errorf("namespace %s is still there", dsNamespace)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gone := time.Since(start)
	refused := map[string]string{}
	for _, p := range vms {
		if p.mode == intercept {
			_, err := p.hotPlug("hp-removed")
			if err == nil || !strings.Contains(err.Error(), "Function not implemented") {
				t.Errorf("pod %s: a hot-plug with napitap removed gave %v, want ENOSYS (Function not implemented)", p.name, err)
			}
			refused[p.node] = fmt.Sprint(err)
		}
	}
	k.kubectlMust(t, "apply", "-k", dir)
	k.kubectlMust(t, "rollout", "status", "-n", dsNamespace, "daemonset/napitap", "--timeout=300s")
	probes := k.startProbePods(t, "reapply", k.workers...)
	created, failed := k.probeOutcome(t, probes)
	var rows []row
	for _, w := range k.workers {
		_, s, err := k.waitServing(w, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if s.tookOver {
			t.Errorf("%s: the re-applied napitapd took over; want it serving afresh", w)
		}
		rows = append(rows, row{event: "`kubectl delete -k`, then `apply -k`", node: w,
			unserved: fmt.Sprintf("%v (from the delete; it served on for --successor-wait)", s.at.Sub(start).Round(time.Second)),
			created:  created[w], failed: failed[w],
			hotPlugs: "0/1", note: "running NICs kept working; a hot-plug, before and after the re-apply: `" + qemuError(refused[w]) + "`"})
	}
	for _, p := range vms {
		if p.mode == intercept {
			if _, err := p.hotPlug("hp-reapplied"); err == nil || !strings.Contains(err.Error(), "Function not implemented") {
				t.Errorf("pod %s: a hot-plug after the re-apply gave %v, want ENOSYS: its listener went with the removed napitapd", p.name, err)
			}
		}
		k.stillRunning(t, p, answers[p], "kubectl delete -k and apply -k")
	}
	t.Logf("kubectl delete -k: namespace gone %v after; apply -k serving afresh on both workers", gone.Round(time.Second))
	return rows
}

// nodeLoss stops a worker's container (the node, its kubelet and every
// process of its pods gone at once) and starts it again. The other
// worker's VMs must not notice. On the lost node, the kubelet recreates
// the sandbox of a restartPolicy Always pod (ADD again), and once the VM
// pods there are deleted nothing of theirs is left.
func (k *kind) nodeLoss(t *testing.T, lost string, byNode map[string][]*vmPod) []row {
	var other string
	for _, w := range k.workers {
		if w != lost {
			other = w
		}
	}
	keeper := k.startKeeper(t, lost)
	oldKeeper, err := sandboxOf(lost, keeper)
	if err != nil || oldKeeper == "" {
		t.Fatalf("pod %s: sandbox %q: %v", keeper, oldKeeper, err)
	}
	answers := map[*vmPod]int{}
	for _, p := range byNode[other] {
		answers[p], _, _, _ = k.pings(p)
	}
	start := time.Now()
	if out, err := exec.Command("docker", "stop", lost).CombinedOutput(); err != nil {
		t.Fatalf("docker stop %s: %v: %s", lost, err, out)
	}
	stopped := time.Since(start)
	// Long enough for the control plane to see the node NotReady.
	notReady := poll(2*time.Minute, func() error {
		out, err := k.kubectl("get", "node", lost, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil || strings.TrimSpace(out) == "True" {
			return fmt.Errorf("node %s Ready=%q (%v)", lost, out, err)
		}
		return nil
	})
	for _, p := range byNode[other] {
		answers[p] = k.stillRunning(t, p, answers[p], "losing "+lost)
	}
	phasesWhileLost := k.podPhases(t, byNode[lost])
	if out, err := exec.Command("docker", "start", lost).CombinedOutput(); err != nil {
		t.Fatalf("docker start %s: %v: %s", lost, err, out)
	}
	k.kubectlMust(t, "wait", "--for=condition=Ready", "node/"+lost, "--timeout=300s")
	ds, s, err := k.waitServingSince(lost, start, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	unserved := s.at.Sub(start)
	if err := prepareWorker(lost); err != nil { // the node's /var/lib survives; its devices may not
		t.Fatal(err)
	}
	// The kubelet recreates the keeper's sandbox: a new ADD, the old
	// sandbox's attachment gone.
	var newKeeper string
	err = poll(5*time.Minute, func() error {
		var err error
		if newKeeper, err = sandboxOf(lost, keeper); err != nil || newKeeper == "" || newKeeper == oldKeeper {
			return fmt.Errorf("pod %s: ready sandbox %q (was %q): %v", keeper, newKeeper, oldKeeper, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	k.waitReady(t, 3*time.Minute, keeper)
	phasesAfter := k.podPhases(t, byNode[lost])
	for _, p := range byNode[other] {
		k.stillRunning(t, p, answers[p], "the return of "+lost)
	}
	// The VM pods of the lost node: their owners see what podPhases
	// logged; deleting them must leave nothing of theirs.
	for _, p := range byNode[lost] {
		k.kubectlMust(t, "delete", "pod", "-n", podNamespace, p.name, "--wait=true", "--timeout=180s")
	}
	err = poll(2*time.Minute, func() error {
		list, err := k.attachments(lost)
		if err != nil {
			return err
		}
		for _, p := range byNode[lost] {
			if strings.Contains(list, p.sandbox) {
				return fmt.Errorf("napitapd on %s still lists pod %s's sandbox %.12s:\n%s", lost, p.name, p.sandbox, list)
			}
		}
		if strings.Contains(list, oldKeeper) {
			return fmt.Errorf("napitapd on %s still lists the keeper's old sandbox %.12s:\n%s", lost, oldKeeper, list)
		}
		if !strings.Contains(list, newKeeper) {
			return fmt.Errorf("napitapd on %s does not list the keeper's new sandbox %.12s:\n%s", lost, newKeeper, list)
		}
		return k.checkNodeClean(lost, 1)
	})
	if err != nil {
		t.Error(err)
	}
	k.kubectlMust(t, "delete", "pod", "-n", podNamespace, keeper, "--wait=true", "--timeout=120s")
	if err := poll(time.Minute, func() error { return k.checkNodeClean(lost, 0) }); err != nil {
		t.Error(err)
	}
	failed := 0
	if events, _ := k.kubectl("get", "events", "-n", podNamespace, "--field-selector", "involvedObject.name="+keeper+",reason=FailedCreatePodSandBox",
		"-o", "jsonpath={range .items[*]}{.count}x {.message}{\"\\n\"}{end}"); strings.TrimSpace(events) != "" {
		t.Logf("pod %s's sandbox attempts that failed while %s came back:\n%s", keeper, lost, events)
		failed = 1
	}
	t.Logf("%s: docker stop took %v; NotReady seen: %v; napitapd (pod %s) serving again %v after the stop; the VM pods there: %s while lost, %s after",
		lost, stopped.Round(time.Second), notReady == nil, ds.name, unserved.Round(time.Second), phasesWhileLost, phasesAfter)
	return []row{
		{event: "worker lost: `docker stop`, then `docker start`", node: lost, unserved: unserved.Round(time.Second).String(),
			created: 1, failed: failed, hotPlugs: "-", note: "its VMs gone with the node; their pods: " + phasesAfter + " (while it was lost: " + phasesWhileLost + "); the keeper pod's sandbox recreated"},
		{event: "the same, seen from the other worker", node: other, unserved: "0", hotPlugs: "-", note: "same QEMUs, pings answered throughout"},
	}
}

// waitingPod is a pod on napitap-bridge bound to node, which only waits
// (napitap's image; its queues held by napitapd, so its ADD needs a
// serving napitapd). Its restartPolicy is the default, Always.
func waitingPod(name, node, label string) map[string]any {
	return map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": podNamespace,
			"labels":      map[string]any{"app.kubernetes.io/name": label},
			"annotations": map[string]any{"k8s.v1.cni.cncf.io/networks": `[{"name":"napitap-bridge","interface":"net1"}]`}},
		"spec": map[string]any{
			"nodeName": node, "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
			"securityContext": map[string]any{"runAsUser": 107, "runAsGroup": 107, "runAsNonRoot": true},
			"containers": []any{map[string]any{"name": "wait", "image": "ghcr.io/napitap/napitap:e2e",
				"imagePullPolicy": "IfNotPresent", "command": []string{"/usr/local/bin/napitapctl", "wait"}}},
		},
	}
}

// startKeeper is a restartPolicy Always pod on napitap-bridge, whose
// sandbox the kubelet recreates after the node comes back.
func (k *kind) startKeeper(t *testing.T, node string) string {
	name := "keeper"
	k.apply(t, waitingPod(name, node, "napitap-kind-keeper"))
	k.waitReady(t, 3*time.Minute, name)
	return name
}

// podPhases says what the pods' owners see: phase and reason.
func (k *kind) podPhases(t testing.TB, pods []*vmPod) string {
	var out []string
	for _, p := range pods {
		s, err := k.kubectl("get", "pod", "-n", podNamespace, p.name, "-o",
			`jsonpath={.status.phase}{" "}{.status.containerStatuses[0].state.terminated.reason}{" "}{.status.containerStatuses[0].state.terminated.exitCode}`)
		if err != nil {
			s = err.Error()
		}
		f := strings.Fields(s)
		if len(f) == 3 {
			s = fmt.Sprintf("%s (container terminated: %s, exit %s)", f[0], f[1], f[2])
		}
		out = append(out, p.name+" "+strings.TrimSpace(s))
	}
	return strings.Join(out, "; ")
}

// checkNodeClean: on node, napitap0 has ports pods of its own
// bridge ports (veths of live pods) and host-local as many addresses
// reserved for napitap-bridge.
func (k *kind) checkNodeClean(node string, live int) error {
	ports, err := onNode(node, "sh", "-c", "ls /sys/class/net/napitap0/brif 2>/dev/null || true")
	if err != nil {
		return err
	}
	if n := len(strings.Fields(ports)); n != live {
		return fmt.Errorf("%s: napitap0 has ports %q, want %d", node, strings.Fields(ports), live)
	}
	ips, err := onNode(node, "sh", "-c", "ls /var/lib/cni/networks/napitap-bridge 2>/dev/null | grep -v -e '^lock$' -e '^last_reserved_ip' || true")
	if err != nil {
		return err
	}
	if n := len(strings.Fields(ips)); n != live {
		return fmt.Errorf("%s: host-local holds %q for napitap-bridge, want %d addresses", node, strings.Fields(ips), live)
	}
	return nil
}

// waitServingSince is waitServing for a serving line after since: a
// restarted container's.
func (k *kind) waitServingSince(node string, since time.Time, timeout time.Duration) (dsPod, serving, error) {
	var ds dsPod
	var s serving
	err := poll(timeout, func() error {
		var err error
		if ds, s, err = k.waitServing(node, 10*time.Second); err != nil {
			return err
		}
		if s.at.Before(since) {
			return fmt.Errorf("pod %s's napitapd served at %v, before %v", ds.name, s.at, since)
		}
		return nil
	})
	return ds, s, err
}

// drain: kubectl drain of a worker with VM pods; they go, DEL leaves no
// tap, bridge port, address or held queue, and the DaemonSet's pod stays.
func (k *kind) drain(t *testing.T, node string, vms []*vmPod) []row {
	ds, err := k.dsPodOn(node)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	k.kubectlMust(t, "drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--force", "--timeout=300s")
	took := time.Since(start)
	defer k.kubectlMust(t, "uncordon", node)
	for _, p := range vms {
		held := 2
		if p.mode == fds {
			held = 0 // fetched by napitapctl exec
		}
		err := poll(time.Minute, func() error {
			out, err := onNode(node, "napitap-verify", "gone", "--netns", p.netns, "--container", p.sandbox,
				"--ifname", p.podIf, "--tap", p.tap, "--queues", "2", "--wiring", "tc-redirect",
				"--socket", napitapdSocket, "--held", fmt.Sprint(held))
			if err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			return nil
		})
		if err != nil {
			t.Errorf("pod %s: %v", p.name, err)
		}
	}
	if err := poll(time.Minute, func() error { return k.checkNodeClean(node, 0) }); err != nil {
		t.Error(err)
	}
	after, err := k.dsPodOn(node)
	if err != nil || after.name != ds.name {
		t.Errorf("%s: the napitap pod after the drain is %q (%v), want %s, which a drain leaves", node, after.name, err, ds.name)
	}
	t.Logf("kubectl drain %s took %v; its VM pods gone, nothing left; napitap pod %s still serves", node, took.Round(time.Second), ds.name)
	return []row{{event: "`kubectl drain`", node: node, unserved: "0 (the DaemonSet pod stays)", hotPlugs: "-",
		note: fmt.Sprintf("%d VM pods deleted in %v, nothing left", len(vms), took.Round(time.Second))}}
}
