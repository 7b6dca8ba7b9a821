package node

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
	"golang.org/x/sys/unix"
)

// TestVMsKeepNAPIQueuesThroughEveryOperatorEvent is issue 27's proof on
// the shipped DaemonSet: what an operator does to a node, one event after
// another, with a VM running in each mode, loses nothing:
//
//   - intercept mode: QEMU, running all along (its guest answering ping),
//     opens the queues of a new NIC's tap by name (QMP netdev_add, as
//     KubeVirt's NIC hot-plug does through libvirt) during events that
//     leave a moment to do so and after each, and each new queue is a
//     NAPI queue: GRO merges what is written into it;
//   - fds mode: the queues napitapd holds are still held, not reopened,
//     and fetch as NAPI queues (one pod's per event);
//   - pods created one every podLoopEvery while each event happens (runc
//     handing its seccomp listener to napitapd, CNI ADDs registering with
//     it) all start, with no failed or retried sandbox or container and
//     no restart; the fd holder keeps a copy of each of napitapd's files.
//
// It ends with a table, one row per event, which deploy/README.md
// ("Operations") carries.
func TestVMsKeepNAPIQueuesThroughEveryOperatorEvent(t *testing.T) {
	testStart := time.Now()
	repo, kernel, initrd := vmArtifacts(t, "busybox")
	c := startDaemonSetCluster(t, crihelp.Config{Name: "napinodeup", Subnet: podSubnet})
	kustomization, ds := c.deployDaemonSet(repo)
	c.checkServedBy(ds)
	c.kubectlMust("apply", "-n", podNamespace, "-f", filepath.Join(repo, "deploy", "kubevirt", "nad.yaml"),
		"-f", filepath.Join(repo, "deploy", "examples", "napitap-standalone.yaml"))
	crihelp.WriteVMMImage(t, c.node, vmmRef, "guest", "out")

	// Before: a VM whose QEMU opened its queues by name (intercept), and a
	// pod whose queues napitapd holds (fds) for each event, to fetch after
	// it: a fetch takes the held queues away.
	vmm := c.startLongRunningVM("vm-upgrade", kernel, initrd)
	events := c.operatorEvents(repo, vmm)
	held := make([]*multusPod, len(events))
	for i, ev := range events {
		held[i] = c.startHeldQueuesPod("vm-fds-" + ev.slug)
	}
	heldForRemoval := c.startHeldQueuesPod("vm-fds-removal")
	held = append(held, heldForRemoval)
	c.checkHolderKeepsCopies(ds)
	if t.Failed() {
		return
	}

	var rows []operationRow
	for i, ev := range events {
		t.Logf("=== %d. %s ===", i+1, ev.name)
		loop := c.startPodLoop(ev.slug)
		loop.excuse = ev.excuse
		loop.waitCreated(2) // ADDs and container creations in flight at the event
		next, out := ev.do(ds)
		pods := c.finishPodLoop(loop, out.down, out.up)
		c.checkAfterEvent(ev.name, next, vmm, held)
		vmm.hotPlugAndProbe(c, "hp-after-"+ev.slug, next)
		c.fetchHeldQueues(held[i])
		c.checkHolderKeepsCopies(next)
		rows = append(rows, operationRow{ev.name, out, pods})
		ds = next
		if t.Failed() {
			break
		}
	}
	t.Logf("operations on the node, each with a VM hot-plugging NICs and pods created one every %v (deploy/README.md, \"Operations\"):\n%s",
		podLoopEvery, operationsTable(rows))
	if t.Failed() {
		return
	}

	// Last, as it loses what the table's events keep: napitap removed
	// and applied again.
	t.Log("=== kubectl delete -k, then kubectl apply -k ===")
	ds = c.removeAndReapply(kustomization, ds, vmm, heldForRemoval)
	if t.Failed() {
		return
	}

	// And napitapd killed with its fd holder, under a VM started since.
	t.Log("=== kill -9 of napitapd and its fd holder together ===")
	last := c.startLongRunningVM("vm-last", kernel, initrd)
	heldForBoth := c.startHeldQueuesPod("vm-fds-both")
	held = append(held, heldForBoth)
	ds = c.killWithHolder(ds, last, heldForBoth)
	if t.Failed() {
		return
	}

	// Nothing leaks: kubectl delete of every pod leaves no tap, attachment,
	// state, lease or listener, in napitapd or in its fd holder.
	t.Log("=== kubectl delete of the VM pods ===")
	c.deleteAndCheckGone(ds, []*longRunningVM{vmm, last}, held)
	c.checkDaemonSetLog(ds)
	c.checkHolderLog(ds)
	t.Logf("whole run: %v", time.Since(testStart).Round(time.Second))
}

// operatorEvent is one thing an operator does to the node: do runs it on
// the DaemonSet pod ds and returns the pod serving after it, and what it
// measured.
type operatorEvent struct {
	name, slug string // slug names its pods
	do         func(ds *daemonSetPod) (*daemonSetPod, outcome)
	excuse     *regexp.Regexp // podLoop.excuse
}

// outcome is what an event measured.
type outcome struct {
	down, up time.Time     // no napitapd served from down to up; zero: one did throughout
	gap      time.Duration // how long no napitapd answered: a takeover's, or up-down
	vmmWait  time.Duration // how long a hot-plug's TUNSETIFFs made during the event took; 0: none made
	note     string
}

type operationRow struct {
	event string
	out   outcome
	pods  loopResult
}

// operatorEvents are the events, in the order the test runs them: each
// ends with napitapd serving everything, which the next starts from.
func (c *cluster) operatorEvents(repo string, v *longRunningVM) []operatorEvent {
	events := []operatorEvent{
		{"kubectl rollout restart", "rollout", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			next := c.rolloutRestart(ds)
			return next, outcome{gap: next.took, note: "the new pod's napitapd took everything over"}
		}, nil},
	}
	for i := 1; i <= 3; i++ {
		events = append(events, operatorEvent{fmt.Sprintf("kill -9 of napitapd, %d of 3 in a row", i), fmt.Sprintf("kill%d", i),
			func(ds *daemonSetPod) (*daemonSetPod, outcome) {
				killed := c.killNapitapd(ds)
				whileDead := v.hotPlugAsync(fmt.Sprintf("hp-kill%d", i))
				next := c.waitRestartedNapitapd(ds, killed)
				out := outcome{down: killed, up: next.servingAt, gap: next.servingAt.Sub(killed),
					note: "its supervisor started it again, and it took everything back from the fd holder"}
				if h := v.awaitHotPlug(c, whileDead); h != nil {
					v.probeHotPlug(c, h, next, waitedThrough(h, next, killed))
					out.vmmWait = h.took
				}
				return next, out
			}, nil})
	}
	// The kubelet restarts a container at once the first time, then
	// after 10 s, then 20 s: from the second kill, the fd holder lets a
	// waiting TUNSETIFF go on (pkg/plainqueue).
	for i := 1; i <= 3; i++ {
		events = append(events, operatorEvent{fmt.Sprintf("kill -9 of napitapd's container (its supervisor), %d of 3 in a row", i), fmt.Sprintf("container%d", i),
			func(ds *daemonSetPod) (*daemonSetPod, outcome) { return c.killSupervisor(ds, v) }, backOff})
	}
	events = append(events,
		operatorEvent{"kill -9 of the fd holder", "holder", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			back := c.killHolder(ds)
			return ds, outcome{note: fmt.Sprintf("napitapd served on; the kubelet restarted the holder, which held everything again %v after the kill", back.Round(time.Millisecond))}
		}, nil},
		operatorEvent{"kubectl delete pod", "delete", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			next, took := c.deletePod(ds, v)
			return next, outcome{gap: next.took, vmmWait: took,
				note: "the old napitapd served on after SIGTERM until the replacement took everything over"}
		}, nil},
		operatorEvent{"kubelet restart", "kubelet", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			took, down := c.restartKubelet(ds, v)
			return ds, outcome{vmmWait: took, note: fmt.Sprintf("kubelet gone %v; napitapd served on, untouched", down.Round(time.Millisecond))}
		}, nil},
		operatorEvent{"containerd restart", "containerd", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			down := c.restartContainerd(ds)
			return ds, outcome{note: fmt.Sprintf("containerd gone %v; napitapd served on, untouched", down.Round(time.Millisecond))}
		}, criDown},
		operatorEvent{"rollout to an image that cannot be pulled, then kubectl rollout undo", "broken", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			took, stuck := c.brokenRolloutUndone(ds, v, "*", brokenImage)
			return ds, outcome{vmmWait: took, note: fmt.Sprintf("the new pod never started (%s); the old pod served on, untouched, and stayed after the undo", stuck)}
		}, nil},
		operatorEvent{"rollout to an image whose napitapd cannot start, then kubectl rollout undo", "crashing", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			// The pause image has no /usr/local/bin/napitapd: the
			// container fails at each start, as a crashing build does.
			took, stuck := c.brokenRolloutUndone(ds, v, "napitapd", crihelp.PauseRef)
			return ds, outcome{vmmWait: took, note: fmt.Sprintf("the new pod's napitapd failed at each start (%s) and the pod was never Ready; the old pod served on, untouched, and stayed after the undo", stuck)}
		}, nil},
		operatorEvent{"kubectl set image (an upgrade)", "upgrade", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			c.importImage(repo, faultsImage, "-tags="+faultsTag)
			next := c.setImage(ds, faultsImage)
			return next, outcome{gap: next.took, note: "to a build with the takeover fault hook, for the next event"}
		}, nil},
		operatorEvent{"a rollout whose takeover is refused, then allowed", "refused", func(ds *daemonSetPod) (*daemonSetPod, outcome) {
			next, took := c.refusedRollout(ds, v)
			return next, outcome{gap: next.took, vmmWait: took,
				note: fmt.Sprintf("the new pod stayed unready and the old one served for %v, until the fault went", refusedFor)}
		}, nil},
	)
	return events
}

// criDown is a sandbox the kubelet could not ask containerd for, or whose
// request containerd dropped, as it restarted: a CRI transport error,
// retried by the kubelet (finishPodLoop still checks that the pod
// started and left nothing behind).
var criDown = regexp.MustCompile(`^FailedCreatePodSandBox .*rpc error: code = Unavailable desc = (connection error: .*containerd\.sock|error reading from server: EOF)`)

// backOff is a sandbox whose ADD found no napitapd while the kubelet's
// back-off kept its container down: the plugin's "try again later" (code
// 11), which the kubelet does.
var backOff = regexp.MustCompile(`^FailedCreatePodSandBox .*handoff: napitapd (at|unreachable at) `)

// operationsTable is rows as a markdown table.
func operationsTable(rows []operationRow) string {
	var b strings.Builder
	b.WriteString("| event | no napitapd served for | a VMM's TUNSETIFF during it took | pods created during it | failed | retried by the kubelet | what happened |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---|\n")
	for _, r := range rows {
		gap, wait := "0", "-"
		if r.out.gap > 0 {
			gap = r.out.gap.Round(time.Millisecond).String()
		}
		if r.out.vmmWait > 0 {
			wait = r.out.vmmWait.Round(time.Millisecond).String()
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %s |\n", r.event, gap, wait, r.pods.created, r.pods.failed, r.pods.retried, r.out.note)
	}
	return b.String()
}

// killSupervisor SIGKILLs the napitapd container's own process, napitapd
// --supervise: the container ends and the kubelet restarts it (its
// back-off applies here, as to any container). The child, sent SIGTERM as
// its supervisor dies (or SIGKILL by containerd's shim, which ends what
// is left of a container whose process exited), either serves on until
// the restarted container's napitapd takes everything over, or leaves
// everything to the fd holder, from which the next one takes it back.
func (c *cluster) killSupervisor(ds *daemonSetPod, v *longRunningVM) (*daemonSetPod, outcome) {
	t := c.t
	t.Helper()
	before, err := c.daemonSetPodStatus(ds.name)
	if err != nil {
		t.Fatal(err)
	}
	if procName(ds.supervisor) != "napitapd" {
		t.Fatalf("pid %d is not napitapd --supervise", ds.supervisor)
	}
	killed := time.Now()
	if err := syscall.Kill(ds.supervisor, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Its child gets SIGTERM and serves on until containerd ends what is
	// left of the container, milliseconds later: the hot-plug goes out
	// once it has, so that no napitapd of the killed container answers it.
	if err := crihelp.Poll(30*time.Second, func() error {
		if procName(ds.pid) == "napitapd" {
			return fmt.Errorf("the killed container's napitapd, pid %d, still runs", ds.pid)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	whileDead := v.hotPlugAsync("hp-container")
	next, m := c.waitRestartedContainer(before, killed)
	serving := next.servingAt
	after, err := c.daemonSetPodStatus(next.name)
	switch {
	case err != nil:
		t.Fatal(err)
	case next.name != ds.name || after.napitapdRestarts != before.napitapdRestarts+1:
		t.Errorf("after the SIGKILL of napitapd's container: pod %s, restarted %d times; want pod %s restarted %d times", next.name, after.napitapdRestarts, ds.name, before.napitapdRestarts+1)
	case after.fdstoreRestarts != before.fdstoreRestarts || after.fdstoreID != before.fdstoreID:
		t.Errorf("the fd holder's container restarted (%d, %.12s, was %.12s)", after.fdstoreRestarts, after.fdstoreID, before.fdstoreID)
	}
	if procName(ds.pid) == "napitapd" {
		t.Errorf("the killed container's napitapd, pid %d, still runs", ds.pid)
	}
	c.useDaemonSet(next)
	c.checkLogClean("the killed container's napitapd", readFile(ds.log), ds.allowWarn...)
	out := outcome{down: killed, up: serving, gap: serving.Sub(killed)}
	if m[2] == "true" {
		next.took, _ = time.ParseDuration(strings.Trim(m[3], `"`))
		out = outcome{gap: next.took, note: "the kubelet restarted the container; the killed supervisor's child served on until the new napitapd took everything over"}
	} else {
		out.note = "the kubelet restarted the container, whose napitapd took everything back from the fd holder"
	}
	h := v.awaitHotPlug(c, whileDead)
	if h != nil && h.issued.Add(h.took).Before(serving) && v.attachedIn(readFile(ds.log), killed) == 0 {
		// Done before napitapd was back: the fd holder let it go on.
		v.probePlainHotPlug(c, h, ds)
		out.vmmWait = h.took
		out.note += fmt.Sprintf("; the kubelet's back-off kept it down, and the fd holder let a hot-plug's TUNSETIFFs go on after %v, its queues without NAPI", plainQueueAfter)
	} else if h != nil {
		v.probeHotPlug(c, h, next, time.Time{})
		out.vmmWait = h.took
		// The old child, sent SIGTERM as its supervisor died, may have
		// served on long enough to answer it.
		old, now := v.attachedIn(readFile(ds.log), killed), v.attachedLines(c, killed)
		if old+now != 2 {
			t.Errorf("napitapd logged %d attaches with NAPI of %s for netdev %s (%d by the killed container's, %d by the restarted one's), want 2",
				old+now, v.hpTap, h.id, old, now)
		}
		t.Logf("hot-plug %s, issued %v after the SIGKILL: %d queues attached by the killed container's napitapd, %d by the restarted one's",
			h.id, h.issued.Sub(killed).Round(time.Millisecond), old, now)
	}
	t.Logf("kill -9 of napitapd's container process, pid %d: its napitapd (pid %d) serves %v after, tookOver=%s; %s",
		ds.supervisor, next.pid, serving.Sub(killed).Round(time.Millisecond), m[2], out.note)
	return next, out
}

// waitedThrough is killed if the hot-plug h was issued while no napitapd
// served, for probeHotPlug to check that its TUNSETIFFs waited for next;
// zero if napitapd was back before it (a supervisor restarts it in tens
// of milliseconds).
func waitedThrough(h *hotPlug, next *daemonSetPod, killed time.Time) time.Time {
	if h.issued.Before(next.servingAt) {
		return killed
	}
	return time.Time{}
}

// removeAndReapply is kubectl delete -k of the DaemonSet's kustomization
// dir, and kubectl apply -k once it is gone: the pod goes with no
// successor, so napitapd serves on for --successor-wait and then stops,
// and its fd holder goes with the pod. What that loses, and only that:
// v's seccomp listener, so its next TUNSETIFF gets ENOSYS, before the
// re-apply and after (fact 12); the held queues of p, which a fetch
// reopens as NAPI queues. It returns the new pod.
func (c *cluster) removeAndReapply(dir string, ds *daemonSetPod, v *longRunningVM, p *multusPod) *daemonSetPod {
	t := c.t
	t.Helper()
	start := time.Now()
	c.kubectlMust("delete", "-k", dir, "--wait=false")
	err := crihelp.Poll(30*time.Second, func() error {
		if !strings.Contains(readFile(ds.log), "serving on until a new napitapd takes everything over") {
			return fmt.Errorf("napitapd does not say it serves on after its SIGTERM")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Still served while it waits for a successor.
	v.hotPlugAndProbe(c, "hp-removing", ds)
	// Read before the kubelet removes the pod's logs with the pod.
	err = crihelp.Poll(time.Minute, func() error {
		if !strings.Contains(readFile(ds.log), `msg="no napitapd took over; stopping"`) {
			return fmt.Errorf("napitapd did not say it stopped after its wait:\n%s", crihelp.Tail(readFile(ds.log), 2000))
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	stopped := time.Since(start)
	err = crihelp.Poll(2*time.Minute, func() error {
		if _, err := c.kubectl("get", "namespace", daemonSetNamespace); err == nil {
			return fmt.Errorf("namespace %s is still there", daemonSetNamespace)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gone := time.Since(start)
	lostBefore := v.hotPlugRefused(c, "hp-removed")
	c.kubectlMust("apply", "-k", dir)
	next := c.waitDaemonSet("120s")
	m, err := waitServing(next.log, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	next.servingAt = parseLogTime(m[1])
	c.useDaemonSet(next)
	if m[2] != "false" {
		t.Errorf("the re-applied napitapd: %s; want it serving afresh", m[0])
	}
	lostAfter := v.hotPlugRefused(c, "hp-reapplied")
	c.checkGuestAnswers(v)
	// The held queues went with the pod; a fetch reopens them, as NAPI
	// queues, from the state files.
	c.fetchHeldQueues(p)
	t.Logf("kubectl delete -k: napitapd served on for its --successor-wait and stopped %v after; the pod and namespace were gone %v after; kubectl apply -k: napitapd (pid %d) serving afresh %v after the delete. The VM's hot-plug after the removal: %s; after the re-apply: %s",
		stopped.Round(time.Millisecond), gone.Round(time.Millisecond), next.pid, next.servingAt.Sub(start).Round(time.Millisecond), lostBefore, lostAfter)
	return next
}

// hotPlugRefused hot-plugs id, which must fail: QEMU's TUNSETIFF gets
// ENOSYS once no process holds the filter's listener. It returns QEMU's
// error.
func (v *longRunningVM) hotPlugRefused(c *cluster, id string) string {
	h := v.hotPlug(id)
	if h.err == nil || !strings.Contains(h.err.Error(), "Function not implemented") {
		c.t.Errorf("netdev_add %s with napitap removed: QEMU opened %v (%v); want ENOSYS (Function not implemented)", id, h.queues, h.err)
		return fmt.Sprint(h.err)
	}
	return h.err.Error()
}

// plainQueueAfter is the fd holder's --plain-queue-after in
// deploy/base/daemonset.yaml.
const plainQueueAfter = 5 * time.Second

// probePlainHotPlug checks the hot-plug h, made while the kubelet's
// back-off kept the napitapd container of ds down: its TUNSETIFFs waited
// for the fd holder's bound, not for napitapd, which then let them go on
// in the kernel, and each of its queues is a plain one (no GRO merge).
// It then removes the netdev.
func (v *longRunningVM) probePlainHotPlug(c *cluster, h *hotPlug, ds *daemonSetPod) {
	t := c.t
	t.Helper()
	if h.err != nil || len(h.queues) != 2 {
		t.Errorf("pod %s: netdev_add %s: QEMU opened queues %v of %s (%v), want 2", v.name, h.id, h.queues, v.hpTap, h.err)
		return
	}
	if h.took > plainQueueAfter+2*time.Second {
		t.Errorf("netdev_add %s took %v with no napitapd: more than the fd holder's bound of %v", h.id, h.took, plainQueueAfter)
	}
	st, err := c.daemonSetPodStatus(ds.name)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(plainQueueLine.FindAllString(logSince(readFile(st.holderLogPath()), h.issued), -1)); n != 2 {
		t.Errorf("the fd holder logged %d TUNSETIFFs let go on since netdev_add %s, want 2", n, h.id)
	}
	// napitapd, once back, counts and names each (the holder hands them
	// over at its first sync): in any of its container's logs.
	err = crihelp.Poll(30*time.Second, func() error {
		logs, _ := filepath.Glob(filepath.Join(filepath.Dir(ds.log), "*.log"))
		n := 0
		for _, l := range logs {
			n += len(napitapdPlainQueueLine.FindAllString(logSince(readFile(l), h.issued), -1))
		}
		if n != 2 {
			return fmt.Errorf("napitapd logged %d plain queues (reason holder_bounded_wait) since netdev_add %s, want 2", n, h.id)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	pidfd, err := unix.PidfdOpen(v.qemuPid, 0)
	if err != nil {
		t.Fatalf("pidfd_open of QEMU, pid %d: %v", v.qemuPid, err)
	}
	defer unix.Close(pidfd)
	for _, fd := range h.queues {
		dup, err := unix.PidfdGetfd(pidfd, fd, 0)
		if err != nil {
			t.Errorf("pidfd_getfd of QEMU's fd %d: %v", fd, err)
			continue
		}
		q := os.NewFile(uintptr(dup), fmt.Sprintf("QEMU's fd %d", fd))
		res, err := napiprobe.RunQueue(q, 16, 1000)
		q.Close()
		if err != nil || res.Merged() {
			t.Errorf("netdev %s: QEMU's fd %d: %v (%v), want a queue without NAPI", h.id, fd, res, err)
		}
	}
	t.Logf("pod %s: QMP netdev_add %s, made while the back-off kept napitapd down, took %v: the fd holder let its TUNSETIFFs go on; QEMU's fds %v are queues without NAPI",
		v.name, h.id, h.took.Round(time.Millisecond), h.queues)
	if err := vm.QMPExecute(v.qmp, time.Minute, "netdev_del", map[string]any{"id": h.id}); err != nil {
		t.Errorf("pod %s: netdev_del %s: %v", v.name, h.id, err)
	}
}

// waitRestartedContainer waits for the kubelet's restart of napitapd's
// container, whose status before the kill at killed was before, and for
// its napitapd to serve; it returns the pod, and the serving line's match.
func (c *cluster) waitRestartedContainer(before dsPodStatus, killed time.Time) (*daemonSetPod, []string) {
	t := c.t
	t.Helper()
	logPath := filepath.Join(before.napitapdLogDir, fmt.Sprintf("%d.log", before.napitapdRestarts+1))
	m, err := waitServingSince(logPath, killed, 2*time.Minute)
	if err != nil {
		out, _ := c.kubectl("describe", "-n", daemonSetNamespace, "pods")
		t.Fatalf("after the SIGKILL of napitapd's container: %v\n%s", err, out)
	}
	next := c.waitDaemonSet("120s")
	next.servingAt = parseLogTime(m[1])
	return next, m
}

// killWithHolder SIGKILLs napitapd's container process, napitapd and the
// fd holder at once (pkill -9 -f napitap on the node): the last copies of
// the seccomp listeners close. What that loses, and only that: v's
// listener, so its next TUNSETIFF gets ENOSYS; p's held queues, which a
// fetch reopens as NAPI queues. The kubelet restarts both containers,
// and pods created after start as ever. It returns the pod, served again.
func (c *cluster) killWithHolder(ds *daemonSetPod, v *longRunningVM, p *multusPod) *daemonSetPod {
	t := c.t
	t.Helper()
	before, err := c.daemonSetPodStatus(ds.name)
	if err != nil {
		t.Fatal(err)
	}
	holder := c.fdstorePid(ds.name)
	killed := time.Now()
	for _, pid := range []int{ds.supervisor, ds.pid, holder} {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	next, m := c.waitRestartedContainer(before, killed)
	// Started before the holder was back, it may have found none.
	next.allowWarn = append(next.allowWarn, regexp.MustCompile(`level=WARN msg="fd holder: none; serving afresh"`))
	c.useDaemonSet(next)
	if after, err := c.daemonSetPodStatus(next.name); err != nil || after.fdstoreRestarts != before.fdstoreRestarts+1 {
		t.Errorf("the fd holder's container: %+v (%v), want it restarted once", after, err)
	}
	lost := v.hotPlugRefused(c, "hp-both")
	c.checkGuestAnswers(v)
	c.fetchHeldQueues(p)
	loop := c.startPodLoop("afterboth")
	loop.waitCreated(podLoopMin)
	pods := c.finishPodLoop(loop, time.Time{}, time.Time{})
	c.checkHolderKeepsCopies(next)
	t.Logf("kill -9 of napitapd with its fd holder: the kubelet restarted both; napitapd (pid %d) served afresh %v after the kill (tookOver=%s). The VM's hot-plug after: %s; its guest answers; the held queues reopened as NAPI queues on fetch; %d pods created after, %d failed",
		next.pid, next.servingAt.Sub(killed).Round(time.Millisecond), m[2], lost, pods.created, pods.failed)
	return next
}

// holderLost is what napitapd logs while its fd holder is gone; after
// killHolder, its log may hold them.
var holderLost = regexp.MustCompile(`level=WARN msg="fdstore: (lost the holder|no holder|the holder hung up|sync)`)

// killHolder SIGKILLs ds's fd holder and waits until the kubelet has
// restarted it and napitapd has put everything into it again; it returns
// how long that took.
func (c *cluster) killHolder(ds *daemonSetPod) time.Duration {
	t := c.t
	t.Helper()
	before, err := c.daemonSetPodStatus(ds.name)
	if err != nil {
		t.Fatal(err)
	}
	pid := c.fdstorePid(ds.name)
	synced := strings.Count(readFile(ds.log), "fdstore: synced with the holder")
	killed := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ds.allowWarn = append(ds.allowWarn, holderLost)
	err = crihelp.Poll(2*time.Minute, func() error {
		st, err := c.daemonSetPodStatus(ds.name)
		switch {
		case err != nil:
			return err
		case st.fdstoreRestarts == before.fdstoreRestarts:
			return fmt.Errorf("the kubelet has not restarted the fd holder yet")
		case strings.Count(readFile(ds.log), "fdstore: synced with the holder") == synced:
			return fmt.Errorf("napitapd has not synced with the restarted holder yet:\n%s", crihelp.Tail(readFile(ds.log), 2000))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	back := time.Since(killed)
	if st, err := procStatus(ds.pid, "Name"); err != nil || st["Name"] != "napitapd" {
		t.Errorf("napitapd, pid %d, is gone after the holder's kill: %v %v", ds.pid, st, err)
	}
	t.Logf("kill -9 of pod %s's fd holder, pid %d: restarted, and holding napitapd's files again, %v after", ds.name, pid, back.Round(time.Millisecond))
	return back
}

// restartKubelet stops the kubelet, has the VM hot-plug a NIC while it is
// gone, and starts it again; the DaemonSet pod's napitapd must be the same
// process after. It returns the hot-plug's time and how long the kubelet
// was gone.
func (c *cluster) restartKubelet(ds *daemonSetPod, v *longRunningVM) (took, down time.Duration) {
	t := c.t
	t.Helper()
	start := time.Now()
	c.kubelet.stop(t)
	took = v.hotPlugAndProbe(c, "hp-nokubelet", ds)
	c.startKubelet()
	down = time.Since(start)
	c.checkSameNapitapd(ds, "the kubelet's restart")
	return took, down
}

// restartContainerd restarts the node's containerd (its shims, and the
// containers under them, run on); the DaemonSet pod's napitapd must be the
// same process after. It returns how long containerd was gone.
func (c *cluster) restartContainerd(ds *daemonSetPod) time.Duration {
	down := c.node.RestartContainerd()
	c.t.Logf("containerd restarted: gone for %v", down.Round(time.Millisecond))
	c.checkSameNapitapd(ds, "containerd's restart")
	return down
}

// checkSameNapitapd: ds is still the DaemonSet's pod, Ready, with the same
// napitapd process.
func (c *cluster) checkSameNapitapd(ds *daemonSetPod, after string) {
	t := c.t
	t.Helper()
	now := c.waitDaemonSet("120s")
	if now.name != ds.name || now.pid != ds.pid {
		t.Errorf("after %s: DaemonSet pod %s, napitapd pid %d; want pod %s's napitapd, pid %d, untouched", after, now.name, now.pid, ds.name, ds.pid)
	}
	c.checkServedBy(ds)
}

// brokenImage names no image anywhere: the pull fails.
const brokenImage = "napinode.local/napitap:e2e-missing"

// brokenHold is how long brokenRolloutUndone watches the stuck rollout.
const brokenHold = 20 * time.Second

// brokenRolloutUndone rolls the DaemonSet's container (or "*": every
// one) out to image, which never runs napitapd: for brokenHold the new pod
// must stay unready and the old pod serve on,
// Ready (a hot-plug of v's answered meanwhile). Then kubectl rollout undo:
// the controller deletes the new pod and the old one, the current
// revision again, stays with the same napitapd. It returns the hot-plug's
// time and why the new pod was stuck.
func (c *cluster) brokenRolloutUndone(ds *daemonSetPod, v *longRunningVM, container, image string) (time.Duration, string) {
	t := c.t
	t.Helper()
	c.kubectlMust("set", "image", "-n", daemonSetNamespace, "daemonset/napitap", container+"="+image)
	var stuck, next string
	err := crihelp.Poll(2*time.Minute, func() error {
		out, err := c.kubectl("get", "pods", "-n", daemonSetNamespace, "-l", "app.kubernetes.io/name=napitap", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.status.initContainerStatuses[*].state.waiting.reason} {.status.containerStatuses[*].state.waiting.reason} {.status.containerStatuses[*].lastState.terminated.reason}{"\n"}{end}`)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 || f[0] == ds.name {
				continue
			}
			for _, why := range f[1:] {
				if strings.Contains(why, "Image") || strings.Contains(why, "Error") || why == "CrashLoopBackOff" {
					next, stuck = f[0], why
					return nil
				}
			}
		}
		return fmt.Errorf("no new pod stuck yet:\n%s", out)
	})
	if err != nil {
		t.Fatal(err)
	}
	var took time.Duration
	for deadline := time.Now().Add(brokenHold); time.Now().Before(deadline) && !t.Failed(); time.Sleep(2 * time.Second) {
		if ready, err := c.podReady(ds.name); err != nil || !ready {
			t.Fatalf("old pod %s: Ready %v (%v) while the rollout is stuck, want it serving on", ds.name, ready, err)
		}
		if ready, _ := c.podReady(next); ready {
			t.Fatalf("new pod %s is Ready, though its napitapd never ran", next)
		}
		c.checkServedBy(ds)
		if took == 0 {
			took = v.hotPlugAndProbe(c, "hp-broken", ds)
		}
	}
	start := time.Now()
	c.kubectlMust("rollout", "undo", "-n", daemonSetNamespace, "daemonset/napitap")
	err = crihelp.Poll(2*time.Minute, func() error {
		if _, err := c.daemonSetPodStatus(next); err == nil {
			return fmt.Errorf("the broken pod %s is still there", next)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rollout of %s to %s: pod %s stuck (%s) for %v with pod %s serving; kubectl rollout undo removed it in %v",
		container, image, next, stuck, brokenHold, ds.name, time.Since(start).Round(time.Millisecond))
	c.checkSameNapitapd(ds, "the undo")
	return took, stuck
}
