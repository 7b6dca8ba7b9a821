package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/fdtest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/takeover"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
	"github.com/napitap/napitap/test/e2e/vm"
)

// checkServedBy: ds's napitapd holds the sockets listening on the
// machine's /run/napitap (asked of the kernel: after a takeover or a
// crash, SO_PEERCRED still names the napitapd that called listen), and it
// answers.
func (c *cluster) checkServedBy(ds *daemonSetPod) {
	t := c.t
	t.Helper()
	for _, sock := range []string{c.node.Socket, c.node.Napitapd.SeccompSocket} {
		if err := listensOn(ds.pid, sock); err != nil {
			t.Errorf("napitapd of pod %s, pid %d: %v", ds.name, ds.pid, err)
		}
	}
	if atts, err := (&handoff.Client{Socket: c.node.Socket}).List(); err != nil {
		t.Errorf("napitapctl list over %s: %v (%d attachments)", c.node.Socket, err, len(atts))
	}
}

// --- The VM, intercept mode ---

// longRunningVM is a VM pod as vm_test.go's vm-napi (QEMU opening its tap
// by name under napitap/vmm.json, on the KubeVirt NAD), whose guest stays
// up and whose QEMU serves QMP in the pod's out dir. The pod has a second
// interface on the KubeVirt NAD, whose tap no NIC uses when QEMU starts:
// the tap of the NIC the test hot-plugs, as KubeVirt's hot-plug gives a
// new NIC a tap of its own. (Not the running NIC's tap: a tap netdev's
// init sets the tap's vnet header size, one for the whole device, to its
// own, which breaks the running NIC's, whose virtio-net uses 12 bytes.)
type longRunningVM struct {
	*vmPod
	podIf, tap    string // the running NIC's
	hpIf, hpTap   string // the hot-plugged NICs'
	qemuPid       int
	qmp           string // the QMP socket, on the host
	want, wantHP  nodecheck.Expect
	runningQueues []int // QEMU's fds of the running NIC's queues
}

// hotPlugNetwork is the VMI network name KubeVirt would hash into the
// hot-plugged NIC's pod interface.
const hotPlugNetwork = "napitap-hotplug"

// guestStaysUp is what the guest's script prints before it sleeps for
// ever.
const guestStaysUp = "NAPITAP-GUEST-STAYS-UP"

func (c *cluster) startLongRunningVM(name, kernel, initrd string) *longRunningVM {
	t := c.t
	t.Helper()
	start := time.Now()
	podIf := kubeVirtPodIfName(vmNetwork)
	hpIf := kubeVirtPodIfName(hotPlugNetwork)
	v := &longRunningVM{vmPod: &vmPod{pod: pod{name: name, queues: 2}, outDir: filepath.Join(c.root, name)},
		podIf: podIf, tap: kubeVirtTapName(podIf), hpIf: hpIf, hpTap: kubeVirtTapName(hpIf)}
	v.qmp = filepath.Join(v.outDir, "qmp.sock")
	if err := os.MkdirAll(v.outDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(v.outDir, 0o777); err != nil { // for the non-root QEMU
		t.Fatal(err)
	}
	// 2 queues for QEMU's 2 vCPUs, and the gro_flush_timeout that lets
	// GRO merge segments written one at a time (DESIGN.md fact 10).
	networks := fmt.Sprintf(`[{"name":"napitap-kubevirt","interface":%q,"cni-args":{"queues":2,"groFlushTimeout":%[3]d}},`+
		`{"name":"napitap-kubevirt","interface":%[2]q,"cni-args":{"queues":2,"groFlushTimeout":%[3]d}}]`, podIf, hpIf, groFlushTimeout)
	guest := vm.Guest{IP: vmGuestIP, Gateway: vmPeer, MAC: macPlaceholder, Script: "echo " + guestStaysUp + "\nwhile :; do sleep 3600; done\n"}
	netdev := "tap,id=n0,ifname=" + v.tap + ",script=no,downscript=no,vhost=off,queues=2"
	argv := vm.QEMUArgs("/guest/"+filepath.Base(kernel), "/guest/"+filepath.Base(initrd), netdev, 2, guest, "/out/serial.log", true)
	argv = append(argv, "-qmp", "unix:/out/qmp.sock,server=on,wait=off")
	c.apply(c.vmManifest(v.name, networks, podIf, map[string]any{"type": "Localhost", "localhostProfile": vmmProfile}, filepath.Dir(kernel), v.outDir, argv))
	c.waitVMPodRunning(v.vmPod, podIf)
	c.addVMPeer()
	c.checkSeccomp(v.vmPod, true)
	v.want = nodecheck.Expect{ContainerID: v.sandbox, IfName: podIf, TapName: v.tap, Queues: 2, NAPI: true,
		Wiring: "tc-redirect", Socket: c.node.Socket, Held: 0}
	v.wantHP = v.want
	v.wantHP.IfName, v.wantHP.TapName = hpIf, v.hpTap
	for _, want := range []nodecheck.Expect{v.want, v.wantHP} {
		if err := nodecheck.Present(v.netns, want); err != nil {
			t.Fatalf("pod %s: %v", v.name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(v.outDir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := crihelp.Poll(5*time.Minute, func() error {
		if b, err := os.ReadFile(filepath.Join(v.outDir, "qemu.exit")); err == nil {
			return fmt.Errorf("QEMU exited: %s", b)
		}
		if !strings.Contains(readFile(filepath.Join(v.outDir, "serial.log")), guestStaysUp) {
			return errors.New("the guest is not up yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("pod %s: %v\nserial:\n%s\nQEMU's output:\n%s", v.name, err,
			tailFile(filepath.Join(v.outDir, "serial.log"), 3000), tailFile(filepath.Join(v.outDir, "qemu.log"), 3000))
	}
	v.qemuPid = c.qemuOf(v.vmPod)
	v.runningQueues, err = vm.TapQueuesOf(v.qemuPid, v.tap)
	if err != nil || len(v.runningQueues) != 2 {
		t.Fatalf("QEMU (pid %d) has queues %v of %s (%v), want 2", v.qemuPid, v.runningQueues, v.tap, err)
	}
	if queues, err := vm.TapQueuesOf(v.qemuPid, v.hpTap); err != nil || len(queues) != 0 {
		t.Fatalf("QEMU (pid %d) has queues %v of %s (%v), the tap it hot-plugs later", v.qemuPid, queues, v.hpTap, err)
	}
	c.checkGuestAnswers(v)
	t.Logf("pod %s: QEMU pid %d up with its guest in %v; its NIC's queues of %s are its fds %v; QMP on %s; NICs hot-plugged on %s",
		v.name, v.qemuPid, time.Since(start).Round(time.Millisecond), v.tap, v.runningQueues, v.qmp, v.hpTap)
	return v
}

// qemuOf is the host pid of the QEMU that the VM pod's vmm container (the
// vmmWrapper shell) runs.
func (c *cluster) qemuOf(p *vmPod) int {
	t := c.t
	t.Helper()
	st, err := c.getPod(p.name)
	if err != nil || len(st.Status.ContainerStatuses) != 1 {
		t.Fatalf("pod %s: %+v (%v)", p.name, st, err)
	}
	var info struct{ Info struct{ Pid int } }
	id := strings.TrimPrefix(st.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if err := json.Unmarshal([]byte(c.node.Crictl("inspect", id)), &info); err != nil || info.Info.Pid == 0 {
		t.Fatalf("crictl inspect %s: pid %d (%v)", id, info.Info.Pid, err)
	}
	pid, err := childNamed(info.Info.Pid, "qemu-system-x86")
	if err != nil {
		t.Fatalf("pod %s: %v", p.name, err)
	}
	return pid
}

// childNamed is the one child of ppid whose comm is comm.
func childNamed(ppid int, comm string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces and parens.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		f := strings.Fields(s[end+1:])
		if len(f) > 1 && s[open+1:end] == comm && f[1] == strconv.Itoa(ppid) {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("children of pid %d named %s: %v, want one", ppid, comm, found)
	}
	return found[0], nil
}

// checkGuestAnswers: the running guest answers ping from its peer on the
// KubeVirt NAD's bridge, through the queues QEMU opened when it started,
// within a minute (a guest whose QEMU was stalled may take a while).
func (c *cluster) checkGuestAnswers(v *longRunningVM) {
	t := c.t
	t.Helper()
	start := time.Now()
	argv := c.inNode("busybox", "ping", "-c", "1", "-W", "2", strings.Split(vmGuestIP, "/")[0])
	var out []byte
	err := crihelp.Poll(time.Minute, func() (err error) {
		out, err = exec.Command(argv[0], argv[1:]...).CombinedOutput()
		return err
	})
	if err != nil {
		neigh, _ := exec.Command("nsenter", "--net="+c.node.NetNS.Path(), "--", "ip", "neigh").CombinedOutput()
		t.Errorf("pod %s: the guest does not answer ping from the node for a minute: %v\n%s\nthe node's neighbours:\n%s\nserial:\n%s",
			v.name, err, out, neigh, tailFile(filepath.Join(v.outDir, "serial.log"), 2000))
		return
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	t.Logf("pod %s: the guest answers ping (%v): %s", v.name, time.Since(start).Round(time.Millisecond), lines[len(lines)-1])
}

// checkStillRunning: the same QEMU runs, in the same container, its
// queues untouched, and its guest answers.
func (c *cluster) checkStillRunning(v *longRunningVM, event string) {
	t := c.t
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(v.outDir, "qemu.exit")); err == nil {
		t.Errorf("after %s: pod %s: %s", event, v.name, b)
	}
	if st, err := procStatus(v.qemuPid, "Name"); err != nil || st["Name"] != "qemu-system-x86" {
		t.Errorf("after %s: pod %s: QEMU (pid %d) is gone: %v %v", event, v.name, v.qemuPid, st, err)
	}
	st, err := c.getPod(v.name)
	if err != nil || len(st.Status.ContainerStatuses) != 1 || !st.Status.ContainerStatuses[0].Ready || st.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("after %s: pod %s: %+v (%v), want its container ready, never restarted", event, v.name, st, err)
	}
	if queues, err := vm.TapQueuesOf(v.qemuPid, v.tap); err != nil || !slices.Equal(queues, v.runningQueues) {
		t.Errorf("after %s: QEMU has queues %v of %s (%v), want its %v", event, queues, v.tap, err, v.runningQueues)
	}
	for _, want := range []nodecheck.Expect{v.want, v.wantHP} {
		if err := nodecheck.Present(v.netns, want); err != nil {
			t.Errorf("after %s: pod %s: %v", event, v.name, err)
		}
	}
	c.checkGuestAnswers(v)
}

// hotPlug is one QMP netdev_add of a tap netdev on the VM's second tap,
// as KubeVirt's NIC hot-plug has libvirt do: QEMU opens each of its 2
// queues by name (TUNSETIFF), which napitapd's agent answers with
// IFF_NAPI.
type hotPlug struct {
	id     string
	issued time.Time
	took   time.Duration
	queues []int // QEMU's fds of the queues it opened
	err    error
}

func (v *longRunningVM) hotPlug(id string) *hotPlug {
	h := &hotPlug{id: id, issued: time.Now()}
	before, err := vm.TapQueuesOf(v.qemuPid, v.hpTap)
	if err != nil {
		h.err = err
		return h
	}
	h.err = vm.QMPExecute(v.qmp, 3*time.Minute, "netdev_add", map[string]any{
		"type": "tap", "id": id, "ifname": v.hpTap, "script": "no", "downscript": "no", "vhost": false, "queues": 2,
	})
	h.took = time.Since(h.issued)
	if h.err != nil {
		return h
	}
	after, err := vm.TapQueuesOf(v.qemuPid, v.hpTap)
	if err != nil {
		h.err = err
		return h
	}
	for _, fd := range after {
		if !slices.Contains(before, fd) {
			h.queues = append(h.queues, fd)
		}
	}
	return h
}

// hotPlugAsync starts hotPlug and returns at once: QEMU's TUNSETIFF waits
// while no napitapd runs.
func (v *longRunningVM) hotPlugAsync(id string) <-chan *hotPlug {
	ch := make(chan *hotPlug, 1)
	go func() { ch <- v.hotPlug(id) }()
	return ch
}

// awaitHotPlug waits for hotPlugAsync's hot-plug; nil if it never ends.
func (v *longRunningVM) awaitHotPlug(c *cluster, ch <-chan *hotPlug) *hotPlug {
	select {
	case h := <-ch:
		return h
	case <-time.After(4 * time.Minute):
		c.t.Errorf("pod %s: QMP netdev_add did not return in 4 minutes", v.name)
		return nil
	}
}

// hotPlugAndProbe hot-plugs id and proves its queues NAPI queues; it
// returns how long QEMU's netdev_add (its TUNSETIFFs) took.
func (v *longRunningVM) hotPlugAndProbe(c *cluster, id string, ds *daemonSetPod) time.Duration {
	attachs := v.attachedLines(c, time.Time{})
	h := v.hotPlug(id)
	v.probeHotPlug(c, h, ds, time.Time{})
	if n := v.attachedLines(c, time.Time{}) - attachs; n != 2 {
		c.t.Errorf("napitapd of pod %s logged %d attaches with NAPI of %s for netdev %s, want 2", ds.name, n, v.hpTap, id)
	}
	return h.took
}

// attachedLines counts the current napitapd's log lines since then saying
// it attached a queue of the VM's tap with NAPI.
func (v *longRunningVM) attachedLines(c *cluster, since time.Time) int {
	return v.attachedIn(c.node.Napitapd.ReadLog(), since)
}

// attachedIn is attachedLines of a napitapd's log.
func (v *longRunningVM) attachedIn(log string, since time.Time) int {
	n := 0
	for _, line := range strings.Split(logSince(log, since), "\n") {
		if strings.Contains(line, `msg="attached the caller's queue with NAPI"`) && strings.Contains(line, "tap="+v.hpTap+" ") {
			n++
		}
	}
	return n
}

// probeHotPlug proves that each queue the hot-plug h opened is a NAPI
// queue: a copy of QEMU's fd (pidfd_getfd) has IFF_NAPI, and segments
// written into it are GRO-merged on the tap. killed, if set, is the
// SIGKILL whose dead time h's TUNSETIFFs waited through, for the napitapd
// of ds to answer them. It then removes the netdev.
func (v *longRunningVM) probeHotPlug(c *cluster, h *hotPlug, ds *daemonSetPod, killed time.Time) {
	t := c.t
	t.Helper()
	if h == nil {
		return
	}
	if h.err != nil || len(h.queues) != 2 {
		t.Errorf("pod %s: netdev_add %s: QEMU opened queues %v of %s (%v), want 2\nQEMU's output:\n%s", v.name, h.id, h.queues, v.hpTap, h.err,
			tailFile(filepath.Join(v.outDir, "qemu.log"), 2000))
		return
	}
	when := ""
	if !killed.IsZero() {
		if !h.issued.Before(ds.servingAt) {
			t.Errorf("netdev_add %s was issued %v after the SIGKILL, once napitapd served again (%v after it): no TUNSETIFF waited",
				h.id, h.issued.Sub(killed), ds.servingAt.Sub(killed))
		}
		when = fmt.Sprintf(", issued %v after the SIGKILL, napitapd serving again %v after it",
			h.issued.Sub(killed).Round(time.Millisecond), ds.servingAt.Sub(killed).Round(time.Millisecond))
	}
	t.Logf("pod %s: QMP netdev_add %s (tap, ifname=%s, queues=2) took %v%s: QEMU's new queues are its fds %v",
		v.name, h.id, v.hpTap, h.took.Round(time.Millisecond), when, h.queues)
	pidfd, err := unix.PidfdOpen(v.qemuPid, 0)
	if err != nil {
		t.Fatalf("pidfd_open of QEMU, pid %d: %v", v.qemuPid, err)
	}
	defer unix.Close(pidfd)
	for _, fd := range h.queues {
		v.probeQueue(c, pidfd, fd, h.id)
	}
	// A TUNSETIFF made while no napitapd ran is the restarted one's to
	// answer.
	if n := v.attachedLines(c, killed); !killed.IsZero() && n != 2 {
		t.Errorf("the restarted napitapd logged %d attaches with NAPI of %s, want 2 (netdev %s)", n, v.hpTap, h.id)
	}
	if err := vm.QMPExecute(v.qmp, time.Minute, "netdev_del", map[string]any{"id": h.id}); err != nil {
		t.Errorf("pod %s: netdev_del %s: %v", v.name, h.id, err)
	}
	err = crihelp.Poll(10*time.Second, func() error {
		if queues, err := vm.TapQueuesOf(v.qemuPid, v.hpTap); err != nil || len(queues) != 0 {
			return fmt.Errorf("QEMU has queues %v of %s (%v), want none", queues, v.hpTap, err)
		}
		return nil
	})
	if err != nil {
		t.Errorf("pod %s after netdev_del %s: %v", v.name, h.id, err)
	}
}

// probeQueue takes a copy of QEMU's fd and proves it a NAPI queue.
func (v *longRunningVM) probeQueue(c *cluster, pidfd, fd int, id string) {
	t := c.t
	t.Helper()
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		t.Errorf("pidfd_getfd of QEMU's fd %d: %v", fd, err)
		return
	}
	q := os.NewFile(uintptr(dup), fmt.Sprintf("QEMU's fd %d", fd))
	defer q.Close() // before netdev_del, so that the queue goes with QEMU's fd
	flags, err := tapsetup.QueueFlagsOf(q)
	if err != nil || flags&unix.IFF_NAPI == 0 {
		t.Errorf("netdev %s: QEMU's fd %d: TUNGETIFF flags %#x (%v), want IFF_NAPI", id, fd, flags, err)
	}
	res, err := napiprobe.RunQueue(q, 16, 1000)
	if err != nil {
		t.Errorf("netdev %s: QEMU's fd %d: %v", id, fd, err)
		return
	}
	t.Logf("netdev %s: QEMU's fd %d (TUNGETIFF %#x): %v", id, fd, flags, res)
	if !res.Merged() {
		t.Errorf("netdev %s: QEMU's fd %d is no NAPI queue: %v", id, fd, res)
	}
}

// --- The held queues, fds mode ---

// startHeldQueuesPod is a pod on the shipped napitap-standalone NAD, whose
// 2 queues napitapd holds until a fetch; cni-args lets GRO merge the
// probe's segments.
func (c *cluster) startHeldQueuesPod(name string) *multusPod {
	t := c.t
	t.Helper()
	p := &multusPod{pod: pod{name: name}, nad: "napitap-standalone", subnet: "10.199.0.0/24",
		want: nodecheck.Expect{IfName: "net1", TapName: "net1", Queues: 2, NAPI: true, Wiring: "none", Held: 2}}
	c.apply(c.multusManifest(p.name, fmt.Sprintf(`[{"name":%q,"interface":%q,"cni-args":{"groFlushTimeout":%d}}]`, p.nad, p.want.IfName, groFlushTimeout)))
	c.waitMultusPod(p)
	if err := nodecheck.Present(p.netns, p.want); err != nil {
		t.Fatalf("pod %s: %v", p.name, err)
	}
	return p
}

// fetchHeldQueues fetches p's held queues with napitapctl exec and proves
// them NAPI queues (fetchAndProbeIf); napitapd holds none of them after.
func (c *cluster) fetchHeldQueues(p *multusPod) {
	t := c.t
	t.Helper()
	c.fetchAndProbeIf(&p.pod, p.want.IfName, p.want.TapName)
	p.want.Held = 0
	if err := nodecheck.Present(p.netns, p.want); err != nil {
		t.Errorf("pod %s after the fetch: %v", p.name, err)
	}
}

// checkAfterEvent: ds's napitapd serves the sockets, the VM runs on as it
// was, and the fds-mode pods' queues are held as they were (not
// reopened: Held counts the fds napitapd has, which a takeover or the
// holder handed on).
func (c *cluster) checkAfterEvent(event string, ds *daemonSetPod, v *longRunningVM, held []*multusPod) {
	t := c.t
	t.Helper()
	c.checkServedBy(ds)
	c.checkStillRunning(v, event)
	for _, p := range held {
		if err := nodecheck.Present(p.netns, p.want); err != nil {
			t.Errorf("after %s: pod %s: %v", event, p.name, err)
		}
	}
	listeners, err := distinctFiles(ds.pid, seccompListenerFile)
	t.Logf("after %s: napitapd of pod %s (pid %d) serves %d seccomp listeners (%v)", event, ds.name, ds.pid, len(listeners), err)
}

// --- The fd holder ---

// checkHolderKeepsCopies: the pod's fd holder (the fdstore sidecar) keeps
// a copy of each seccomp listener and held queue napitapd has, and of
// nothing else of those kinds: the same open files (kcmp), which is what
// lets a restarted napitapd serve the very listeners and queues.
func (c *cluster) checkHolderKeepsCopies(ds *daemonSetPod) {
	t := c.t
	t.Helper()
	holder := c.fdstorePid(ds.name)
	atts, err := (&handoff.Client{Socket: c.node.Socket}).List()
	if err != nil {
		t.Fatal(err)
	}
	heldQueues := 0
	for _, a := range atts {
		heldQueues += a.Held
	}
	var listeners, queues int
	err = crihelp.Poll(15*time.Second, func() error {
		for _, kind := range []string{seccompListenerFile, tunFile} {
			has, err := distinctFiles(ds.pid, kind)
			if err != nil {
				return err
			}
			keeps, err := distinctFiles(holder, kind)
			if err != nil {
				return err
			}
			for _, fd := range has {
				if !slices.ContainsFunc(keeps, func(h int) bool { return sameFile(ds.pid, fd, holder, h) }) {
					return fmt.Errorf("napitapd's fd %d (%s) has no copy in the holder (pid %d)", fd, kind, holder)
				}
			}
			if len(keeps) != len(has) {
				return fmt.Errorf("the holder (pid %d) keeps %d %s files, napitapd has %d", holder, len(keeps), kind, len(has))
			}
			if kind == tunFile {
				queues = len(has)
			} else {
				listeners = len(has)
			}
		}
		if queues != heldQueues {
			return fmt.Errorf("napitapd has %d queue files, its attachments %d held queues", queues, heldQueues)
		}
		return nil
	})
	if err != nil {
		t.Errorf("pod %s: %v", ds.name, err)
		return
	}
	t.Logf("pod %s: the fd holder (pid %d) keeps a copy of each of napitapd's %d seccomp listeners and %d held queues", ds.name, holder, listeners, queues)
}

// The kinds of files napitapd keeps in its holder, as the kernel shows
// them: a seccomp listener's /proc/<pid>/fd link, and an attached tun
// queue's fdinfo (the link names /dev/net/tun as the opener's mount
// namespace had it, not always napitapd's).
const (
	seccompListenerFile = "seccomp listener"
	tunFile             = "tun queue"
)

// attachedTun is the fdinfo line of a tun fd attached to a tap.
var attachedTun = regexp.MustCompile(`(?m)^iff:\t`)

// fileKind is which of those kinds fd of pid is, if any.
func fileKind(pid, fd int) string {
	if target, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%d", pid, fd)); err == nil && strings.HasPrefix(target, "anon_inode:seccomp notify") {
		return seccompListenerFile
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err == nil && attachedTun.Match(b) {
		return tunFile
	}
	return ""
}

// fdsOf lists pid's fds.
func fdsOf(pid int) ([]int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

// distinctFiles is one fd of each distinct open file of pid that is a
// kind: copies of one file (dup, SCM_RIGHTS) count once.
func distinctFiles(pid int, kind string) ([]int, error) {
	all, err := fdsOf(pid)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, fd := range all {
		if fileKind(pid, fd) != kind {
			continue
		}
		if !slices.ContainsFunc(fds, func(other int) bool { return sameFile(pid, fd, pid, other) }) {
			fds = append(fds, fd)
		}
	}
	return fds, nil
}

// sameFile: fd1 of pid1 and fd2 of pid2 are the same open file.
func sameFile(pid1, fd1, pid2, fd2 int) bool {
	same, err := fdtest.Same(pid1, fd1, pid2, fd2)
	return err == nil && same
}

// countFiles counts pid's fds of each kind, copies included.
func countFiles(pid int) (listeners, queues int, err error) {
	fds, err := fdsOf(pid)
	for _, fd := range fds {
		switch fileKind(pid, fd) {
		case seccompListenerFile:
			listeners++
		case tunFile:
			queues++
		}
	}
	return listeners, queues, err
}

// fdstorePid is the pid of the fd holder of DaemonSet pod name.
func (c *cluster) fdstorePid(name string) int {
	t := c.t
	t.Helper()
	p, err := c.daemonSetPodStatus(name)
	if err != nil || p.fdstoreID == "" {
		t.Fatalf("DaemonSet pod %s: %+v (%v), want its fdstore sidecar", name, p, err)
	}
	var info struct{ Info struct{ Pid int } }
	if err := json.Unmarshal([]byte(c.node.Crictl("inspect", p.fdstoreID)), &info); err != nil || info.Info.Pid == 0 {
		t.Fatalf("crictl inspect %s: pid %d (%v)", p.fdstoreID, info.Info.Pid, err)
	}
	return info.Info.Pid
}

// dsPodStatus is what the test reads of a DaemonSet pod's status.
type dsPodStatus struct {
	name, uid        string
	napitapdID       string
	napitapdRestarts int
	fdstoreID        string
	fdstoreRestarts  int
	napitapdLogDir   string
}

// daemonSetPods lists the DaemonSet's pods.
func (c *cluster) daemonSetPods() ([]dsPodStatus, error) {
	out, err := c.kubectl("get", "pods", "-n", daemonSetNamespace, "-l", "app.kubernetes.io/name=napitap", "-o", "json")
	if err != nil {
		return nil, err
	}
	type containerStatus struct {
		Name, ContainerID string
		RestartCount      int
	}
	var list struct {
		Items []struct {
			Metadata struct{ Name, UID string }
			Status   struct{ ContainerStatuses, InitContainerStatuses []containerStatus }
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, err
	}
	var pods []dsPodStatus
	for _, item := range list.Items {
		p := dsPodStatus{name: item.Metadata.Name, uid: item.Metadata.UID,
			napitapdLogDir: filepath.Join(c.root, "kubelet", "pod-logs", daemonSetNamespace+"_"+item.Metadata.Name+"_"+item.Metadata.UID, "napitapd")}
		for _, cs := range item.Status.ContainerStatuses {
			if cs.Name == "napitapd" {
				p.napitapdID, p.napitapdRestarts = strings.TrimPrefix(cs.ContainerID, "containerd://"), cs.RestartCount
			}
		}
		for _, cs := range item.Status.InitContainerStatuses {
			if cs.Name == "fdstore" {
				p.fdstoreID, p.fdstoreRestarts = strings.TrimPrefix(cs.ContainerID, "containerd://"), cs.RestartCount
			}
		}
		pods = append(pods, p)
	}
	return pods, nil
}

func (c *cluster) daemonSetPodStatus(name string) (dsPodStatus, error) {
	pods, err := c.daemonSetPods()
	if err != nil {
		return dsPodStatus{}, err
	}
	for _, p := range pods {
		if p.name == name {
			return p, nil
		}
	}
	return dsPodStatus{}, fmt.Errorf("no DaemonSet pod %s among %+v", name, pods)
}

// --- The two events ---

// servingLine is napitapd's line once it serves; took is how long a
// takeover took, from the new napitapd's request.
var servingLine = regexp.MustCompile(`time=(\S+) level=INFO msg=serving .* tookOver=(true|false) took=("[^"]*"|\S*)`)

// logTime is the time of napitapd's log line (its own time=, not the
// kubelet's).
var logTime = regexp.MustCompile(`time=(\S+) level=`)

// waitServing waits until napitapd's log at path says it serves, and
// returns the line's match.
func waitServing(path string, timeout time.Duration) ([]string, error) {
	return waitServingSince(path, time.Time{}, timeout)
}

// waitServingSince is waitServing for a serving line logged since then.
func waitServingSince(path string, since time.Time, timeout time.Duration) ([]string, error) {
	var m []string
	err := crihelp.Poll(timeout, func() error {
		if m = servingLine.FindStringSubmatch(logSince(readFile(path), since)); m == nil {
			return fmt.Errorf("napitapd does not serve yet; its log %s:\n%s", path, crihelp.Tail(readFile(path), 3000))
		}
		return nil
	})
	return m, err
}

func parseLogTime(s string) time.Time {
	tm, _ := time.Parse(time.RFC3339Nano, s)
	return tm
}

// rolloutRestart runs kubectl rollout restart of the DaemonSet: the new
// pod starts beside old (maxSurge 1), its napitapd takes everything over
// from old's, and the controller deletes old once the new one is Ready.
// It returns the new pod, and prints the takeover time.
func (c *cluster) rolloutRestart(old *daemonSetPod) *daemonSetPod {
	start := time.Now()
	c.kubectlMust("rollout", "restart", "-n", daemonSetNamespace, "daemonset/napitap")
	return c.completeRollout(old, c.waitNewPod(old), start, "kubectl rollout restart")
}

// setImage rolls the DaemonSet's every container out to ref (kubectl set
// image), as an upgrade does; see rolloutRestart.
func (c *cluster) setImage(old *daemonSetPod, ref string) *daemonSetPod {
	start := time.Now()
	c.kubectlMust("set", "image", "-n", daemonSetNamespace, "daemonset/napitap", "*="+ref)
	return c.completeRollout(old, c.waitNewPod(old), start, "kubectl set image "+ref)
}

// deletePod runs kubectl delete pod of old, as an operator restarts
// napitap on a node: the controller starts the replacement while old
// terminates (maxSurge; ../shared/DESIGN.md fact 21), and old's napitapd,
// serving on after its SIGTERM (--successor-wait), hands everything over
// to the replacement's. Meanwhile v hot-plugs a NIC, which old's napitapd
// must answer with NAPI queues. It returns the replacement.
func (c *cluster) deletePod(old *daemonSetPod, v *longRunningVM) (*daemonSetPod, time.Duration) {
	t := c.t
	t.Helper()
	start := time.Now()
	c.kubectlMust("delete", "pod", "-n", daemonSetNamespace, old.name, "--wait=false")
	err := crihelp.Poll(30*time.Second, func() error {
		if !strings.Contains(readFile(old.log), "serving on until a new napitapd takes everything over") {
			return fmt.Errorf("pod %s's napitapd does not say it serves on after its SIGTERM:\n%s", old.name, crihelp.Tail(readFile(old.log), 2000))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl delete pod: napitapd of pod %s got its SIGTERM within %v and serves on", old.name, time.Since(start).Round(time.Millisecond))
	took := v.hotPlugAndProbe(c, "hp-terminating", old)
	return c.completeRollout(old, c.waitNewPod(old), start, "kubectl delete pod"), took
}

// waitNewPod waits for a DaemonSet pod other than old to run napitapd.
func (c *cluster) waitNewPod(old *daemonSetPod) dsPodStatus {
	t := c.t
	t.Helper()
	var next dsPodStatus
	err := crihelp.Poll(2*time.Minute, func() error {
		pods, err := c.daemonSetPods()
		if err != nil {
			return err
		}
		for _, p := range pods {
			if p.name != old.name && p.napitapdID != "" {
				next = p
				return nil
			}
		}
		return fmt.Errorf("no new DaemonSet pod running napitapd yet: %+v", pods)
	})
	if err != nil {
		out, _ := c.kubectl("describe", "-n", daemonSetNamespace, "ds,pods")
		t.Fatalf("no new pod beside %s: %v\n%s", old.name, err, out)
	}
	return next
}

// completeRollout waits for next's napitapd to serve what it took over
// from old's, for the rollout to complete and for old to go; it returns
// next, and prints the times since start, when since happened.
func (c *cluster) completeRollout(old *daemonSetPod, next dsPodStatus, start time.Time, since string) *daemonSetPod {
	t := c.t
	t.Helper()
	m, err := waitServing(filepath.Join(next.napitapdLogDir, "0.log"), 2*time.Minute)
	if err != nil {
		t.Fatalf("new pod %s: %v", next.name, err)
	}
	serving := parseLogTime(m[1])
	if m[2] != "true" {
		t.Errorf("new pod %s's napitapd serves with tookOver=%s, want a takeover: %s", next.name, m[2], m[0])
	}
	// The old pod's log, before the controller deletes the pod with it.
	// Its line comes a moment after the new napitapd's serving line.
	var oldLog string
	_ = crihelp.Poll(5*time.Second, func() error {
		if oldLog = readFile(old.log); !strings.Contains(oldLog, "handed everything over to the next napitapd") {
			return errors.New("not yet")
		}
		return nil
	})
	if !strings.Contains(oldLog, "handed everything over to the next napitapd") {
		t.Errorf("old pod %s's napitapd did not log that it handed everything over:\n%s", old.name, crihelp.Tail(oldLog, 3000))
	}
	c.checkLogClean("old pod "+old.name+"'s napitapd", oldLog, old.allowWarn...)
	if _, err := c.kubectl("rollout", "status", "-n", daemonSetNamespace, "ds/napitap", "--timeout=180s"); err != nil {
		out, _ := c.kubectl("describe", "-n", daemonSetNamespace, "ds,pods")
		t.Fatalf("%v\n%s", err, out)
	}
	complete := time.Since(start)
	err = crihelp.Poll(2*time.Minute, func() error {
		if _, err := c.daemonSetPodStatus(old.name); err == nil {
			return fmt.Errorf("old pod %s is still there", old.name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	gone := time.Since(start)
	if st, err := procStatus(old.pid, "Name"); err == nil && st["Name"] == "napitapd" {
		t.Errorf("the old pod's napitapd, pid %d, still runs", old.pid)
	}
	ds := c.waitDaemonSet("60s")
	if ds.name != next.name {
		t.Fatalf("DaemonSet pod %s after the rollout, want %s", ds.name, next.name)
	}
	ds.servingAt = serving
	ds.took, _ = time.ParseDuration(strings.Trim(m[3], `"`))
	c.useDaemonSet(ds)
	t.Logf("rollout: new pod %s's napitapd (pid %d) took everything over from pod %s's (pid %d) in %s (its log: %s); serving %v after %s; rollout complete in %v, old pod gone in %v",
		ds.name, ds.pid, old.name, old.pid, strings.Trim(m[3], `"`), m[0], serving.Sub(start).Round(time.Millisecond), since, complete.Round(time.Millisecond), gone.Round(time.Millisecond))
	return ds
}

// refusedFor is how long the refused rollout is watched: three readiness
// probes (periodSeconds 10) and then some.
const refusedFor = 35 * time.Second

// refusedRollout is a kubectl rollout restart whose new napitapd cannot
// take over: old's napitapd, a build with the fault hook, hangs up on
// every takeover request while its state dir holds takeover.FaultFile.
// For refusedFor the new pod must stay unready, so that the rollout stops
// there, with old's napitapd serving (and answering a hot-plug of v's);
// once the file goes the takeover happens and the rollout completes. It
// returns the new pod and how long the hot-plug took.
func (c *cluster) refusedRollout(old *daemonSetPod, v *longRunningVM) (*daemonSetPod, time.Duration) {
	t := c.t
	t.Helper()
	fault := filepath.Join(hostNapitapdOwn, "state", takeover.FaultFile)
	if err := os.WriteFile(fault, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(fault) })
	start := time.Now()
	c.kubectlMust("rollout", "restart", "-n", daemonSetNamespace, "daemonset/napitap")
	next := c.waitNewPod(old)
	var hotPlugged time.Duration
	for deadline := time.Now().Add(refusedFor); time.Now().Before(deadline) && !t.Failed(); time.Sleep(2 * time.Second) {
		ready, err := c.podReady(next.name)
		switch {
		case err != nil:
			t.Fatal(err)
		case ready:
			t.Fatalf("new pod %s is Ready while its napitapd cannot take over", next.name)
		}
		if log := readFile(filepath.Join(next.napitapdLogDir, "0.log")); servingLine.MatchString(log) {
			t.Fatalf("new pod %s's napitapd serves while the takeover is refused:\n%s", next.name, crihelp.Tail(log, 3000))
		}
		if ready, err := c.podReady(old.name); err != nil || !ready {
			t.Fatalf("old pod %s: Ready %v (%v), want it serving on", old.name, ready, err)
		}
		c.checkServedBy(old)
		if hotPlugged == 0 {
			hotPlugged = v.hotPlugAndProbe(c, "hp-refused", old)
		}
	}
	refusals := strings.Count(readFile(old.log), "refused by a fault hook")
	if refusals == 0 {
		t.Errorf("old pod %s's napitapd refused no takeover:\n%s", old.name, crihelp.Tail(readFile(old.log), 3000))
	}
	t.Logf("refused rollout: for %v after kubectl rollout restart, new pod %s stayed unready and old pod %s's napitapd (pid %d) served, refusing %d takeover requests; removing %s",
		time.Since(start).Round(time.Millisecond), next.name, old.name, old.pid, refusals, fault)
	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}
	return c.completeRollout(old, next, time.Now(), "the fault file's removal"), hotPlugged
}

// podReady: the DaemonSet pod name's Ready condition is True.
func (c *cluster) podReady(name string) (bool, error) {
	out, err := c.kubectl("get", "pod", "-n", daemonSetNamespace, name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	return strings.TrimSpace(out) == "True", err
}

// killNapitapd SIGKILLs ds's napitapd (a process the test's DaemonSet
// started) and waits until it is dead; it returns when it sent the
// signal.
func (c *cluster) killNapitapd(ds *daemonSetPod) time.Time {
	t := c.t
	t.Helper()
	if st, err := procStatus(ds.pid, "Name"); err != nil || st["Name"] != "napitapd" {
		t.Fatalf("pid %d is not napitapd: %v %v", ds.pid, st, err)
	}
	killed := time.Now()
	if err := syscall.Kill(ds.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := crihelp.Poll(10*time.Second, func() error {
		if st, err := procStatus(ds.pid, "State"); err == nil && !strings.HasPrefix(st["State"], "Z") {
			return fmt.Errorf("napitapd, pid %d, is still %s", ds.pid, st["State"])
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kill -9 of pod %s's napitapd, pid %d: dead in %v", ds.name, ds.pid, time.Since(killed).Round(time.Millisecond))
	return killed
}

// waitRestartedNapitapd waits for the kubelet to restart the killed
// napitapd's container and for the restarted napitapd to serve, with what
// it recovered from the pod's fd holder, which must have lived on. It
// returns the pod with its new napitapd, and prints the time from the
// SIGKILL to its serving.
func (c *cluster) waitRestartedNapitapd(old *daemonSetPod, killed time.Time) *daemonSetPod {
	t := c.t
	t.Helper()
	before, err := c.daemonSetPodStatus(old.name)
	if err != nil {
		t.Fatal(err)
	}
	// Killed under its supervisor, which lives on, napitapd is started
	// again in the same container, logging on into the same file; else
	// the kubelet restarts the container, which logs into the next.
	supervised := old.supervisor != 0 && procName(old.supervisor) == "napitapd"
	restarts := before.napitapdRestarts
	if !supervised && before.napitapdID == old.containerID {
		restarts++ // the kubelet has not noticed the exit yet
	}
	logPath := filepath.Join(before.napitapdLogDir, fmt.Sprintf("%d.log", restarts))
	m, err := waitServingSince(logPath, killed, 2*time.Minute)
	if err != nil {
		out, _ := c.kubectl("describe", "-n", daemonSetNamespace, "pods")
		t.Fatalf("after the SIGKILL: %v\n%s", err, out)
	}
	serving := parseLogTime(m[1])
	log := logSince(readFile(logPath), killed)
	started := time.Time{}
	if lt := logTime.FindStringSubmatch(log); lt != nil {
		started = parseLogTime(lt[1])
	}
	recovered := regexp.MustCompile(`msg="fd holder: recovered[^\n]*`).FindString(log)
	if m[2] != "false" || recovered == "" {
		t.Errorf("the restarted napitapd: %q, recovered %q; want it serving from what the fd holder kept (tookOver=false):\n%s", m[0], recovered, crihelp.Tail(log, 3000))
	}
	ds := c.waitDaemonSet("120s")
	after, err := c.daemonSetPodStatus(ds.name)
	switch {
	case err != nil:
		t.Fatal(err)
	case ds.name != old.name || ds.pid == old.pid || ds.log != logPath:
		t.Errorf("after the SIGKILL: DaemonSet pod %s, napitapd pid %d, log %s; want pod %s, a new napitapd, log %s", ds.name, ds.pid, ds.log, old.name, logPath)
	case after.napitapdRestarts != restarts:
		t.Errorf("napitapd's container restarted %d times, want %d", after.napitapdRestarts, restarts)
	case after.fdstoreRestarts != before.fdstoreRestarts || after.fdstoreID != before.fdstoreID:
		t.Errorf("the fd holder's container restarted (%d, %.12s, was %.12s): what it held is lost", after.fdstoreRestarts, after.fdstoreID, before.fdstoreID)
	}
	ds.servingAt = serving
	c.useDaemonSet(ds)
	by := fmt.Sprintf("the kubelet restarted its container (restart %d)", after.napitapdRestarts)
	if supervised {
		by = fmt.Sprintf("its supervisor, pid %d, started it again", ds.supervisor)
	}
	t.Logf("kill -9 of napitapd, pid %d: %s %v after the SIGKILL; it serves (pid %d) %v after the SIGKILL, %v after it started; %s",
		old.pid, by, started.Sub(killed).Round(time.Millisecond), ds.pid, serving.Sub(killed).Round(time.Millisecond),
		serving.Sub(started).Round(time.Millisecond), recovered)
	// Read again: what it answered at once is logged after the serving line.
	if waited := answeredAtOnce(logSince(readFile(logPath), killed), serving); len(waited) > 0 {
		t.Logf("kill -9: what the restarted napitapd answered in its first %v, which had waited in the sockets' backlogs or the listener:\n  %s",
			atOnce, strings.Join(waited, "\n  "))
	}
	if supervised {
		ds.allowWarn = append(old.allowWarn, killedByLine)
	}
	c.checkLogClean("the killed napitapd", readFile(old.log), ds.allowWarn...)
	return ds
}

// killedByLine is what a supervisor logs of a SIGKILL, which the test sent.
var killedByLine = regexp.MustCompile(`level=WARN msg="supervise: killed; starting it again"`)

// logSince is the lines of a napitapd log from since on, by their time=.
func logSince(log string, since time.Time) string {
	lines := strings.Split(log, "\n")
	for i, line := range lines {
		if lt := logTime.FindStringSubmatch(line); lt != nil && !parseLogTime(lt[1]).Before(since) {
			return strings.Join(lines[i:], "\n")
		}
	}
	return ""
}

// procName is pid's comm, "" if it is gone.
func procName(pid int) string {
	st, err := procStatus(pid, "Name")
	if err != nil {
		return ""
	}
	return st["Name"]
}

// atOnce is how soon after it serves napitapd answers what waited for it.
const atOnce = 100 * time.Millisecond

// answeredAtOnce lists the registrations (ADD), seccomp listeners (runc)
// and TUNSETIFFs (a VMM) a napitapd's log shows it answered within
// atOnce of serving: requests made while no napitapd served.
func answeredAtOnce(log string, serving time.Time) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		lt := logTime.FindStringSubmatch(line)
		if lt == nil || parseLogTime(lt[1]).After(serving.Add(atOnce)) {
			continue
		}
		for _, msg := range []string{"msg=registered ", `msg="serving seccomp listener"`, `msg="attached the caller's queue with NAPI"`} {
			if i := strings.Index(line, msg); i >= 0 {
				out = append(out, parseLogTime(lt[1]).Sub(serving).Round(time.Millisecond).String()+" after serving: "+crihelp.Tail(line[i:], 160))
			}
		}
	}
	return out
}

// --- Pods created during an event ---

// A pod every podLoopEvery while an event happens, at least podLoopMin and
// at most podLoopMax of them.
const (
	podLoopEvery = 1500 * time.Millisecond
	podLoopMin   = 4
	podLoopMax   = 16
)

// loopPod is one pod the loop created: on the KubeVirt NAD under the
// Localhost profile napitap/vmm.json (intercept: runc hands its listener
// to napitapd, the ADD registers the tap), or on napitap-standalone (fds:
// the ADD hands napitapd its queues).
type loopPod struct {
	multusPod
	intercept bool
	created   time.Time
}

// podLoop creates pods until halted.
type podLoop struct {
	event    string
	stop     chan struct{}
	stopOnce sync.Once
	done     chan struct{}

	mu      sync.Mutex
	pods    []*loopPod
	failed  []string // kubectl apply failures
	created chan struct{}

	// excuse, if set, matches the warnings of a failure the event makes
	// unavoidable (a sandbox the kubelet could not ask a restarting
	// containerd for, an ADD while the kubelet's back-off keeps napitapd
	// down): reported, with the pod's delay, not failed.
	excuse *regexp.Regexp
}

func (c *cluster) startPodLoop(event string) *podLoop {
	l := &podLoop{event: event, stop: make(chan struct{}), done: make(chan struct{}), created: make(chan struct{}, podLoopMax)}
	go func() {
		defer close(l.done)
		stopped := false
		for i := 1; i <= podLoopMax && !(stopped && i > podLoopMin); i++ {
			p := c.loopPod(event, i)
			p.created = time.Now()
			err := c.createLoopPod(p)
			l.mu.Lock()
			if err != nil {
				l.failed = append(l.failed, fmt.Sprintf("%s: %v", p.name, err))
			} else {
				l.pods = append(l.pods, p)
			}
			l.mu.Unlock()
			l.created <- struct{}{}
			select {
			case <-l.stop:
				stopped = true
			case <-time.After(time.Until(p.created.Add(podLoopEvery))):
			}
		}
	}()
	// A test that fails mid-event creates no pod while the cluster goes.
	c.t.Cleanup(l.halt)
	return l
}

// halt stops the loop and waits until it has.
func (l *podLoop) halt() {
	l.stopOnce.Do(func() { close(l.stop) })
	<-l.done
}

// waitCreated waits until the loop has created n pods.
func (l *podLoop) waitCreated(n int) {
	for range n {
		<-l.created
	}
}

// loopPod is the loop's i-th pod: intercept and fds mode by turns.
func (c *cluster) loopPod(event string, i int) *loopPod {
	if i%2 == 1 {
		podIf := kubeVirtPodIfName(vmNetwork)
		return &loopPod{intercept: true, multusPod: multusPod{pod: pod{name: fmt.Sprintf("%s-%02d-intercept", event, i)}, nad: "napitap-kubevirt",
			want: nodecheck.Expect{IfName: podIf, TapName: kubeVirtTapName(podIf), Queues: 2, NAPI: true, Wiring: "tc-redirect", Held: 0}}}
	}
	return &loopPod{multusPod: multusPod{pod: pod{name: fmt.Sprintf("%s-%02d-fds", event, i)}, nad: "napitap-standalone", subnet: "10.199.0.0/24",
		want: nodecheck.Expect{IfName: "net1", TapName: "net1", Queues: 2, NAPI: true, Wiring: "none", Held: 2}}}
}

// createLoopPod applies p's manifest: manifest's pod (the pause image)
// with its network selection and, in intercept mode, the Localhost
// profile.
func (c *cluster) createLoopPod(p *loopPod) error {
	networks := fmt.Sprintf(`[{"name":%q,"interface":%q,"cni-args":{"queues":2}}]`, p.nad, p.want.IfName)
	if !p.intercept {
		networks = fmt.Sprintf(`[{"name":%q,"interface":%q}]`, p.nad, p.want.IfName)
	}
	m := c.multusManifest(p.name, networks)
	if p.intercept {
		m = strings.Replace(m, "spec:\n", "spec:\n  securityContext:\n    seccompProfile:\n      type: Localhost\n      localhostProfile: "+vmmProfile+"\n", 1)
	}
	path := filepath.Join(c.root, "loop-"+p.name+".yaml")
	if err := os.WriteFile(path, []byte(m), 0o644); err != nil {
		return err
	}
	_, err := c.kubectl("apply", "-f", path)
	return err
}

// finishPodLoop stops the loop and checks that every pod it created
// started: Ready, with no Warning event (FailedCreatePodSandBox, Failed,
// BackOff, ...), no restart, its attachment as its NAD makes it, and, in
// intercept mode, runc given napitapd's listener path. down..up, if set,
// is when no napitapd served. The pods are deleted after.
func (c *cluster) finishPodLoop(l *podLoop, down, up time.Time) loopResult {
	t := c.t
	t.Helper()
	l.halt()
	for _, f := range l.failed {
		t.Errorf("%s: creating a pod: %s", l.event, f)
	}
	var names []string
	for _, p := range l.pods {
		names = append(names, "pod/"+p.name)
	}
	if len(names) == 0 {
		t.Fatalf("%s: no pod created", l.event)
	}
	start := time.Now()
	if _, err := c.kubectl(append([]string{"wait", "-n", podNamespace, "--for=condition=Ready", "--timeout=300s"}, names...)...); err != nil {
		t.Errorf("%s: %v", l.event, err)
	}
	waited := time.Since(start)
	// The loop's pods, and the VM pods that run through every event.
	watched := map[string]bool{}
	for _, p := range l.pods {
		watched[p.name] = true
	}
	failed, excused := map[string][]string{}, map[string][]string{}
	for _, w := range c.warningEvents() {
		switch {
		case !watched[w.pod] && !strings.HasPrefix(w.pod, "vm-"):
		case l.excuse != nil && l.excuse.MatchString(w.String()):
			excused[w.pod] = append(excused[w.pod], w.String())
		default:
			failed[w.pod] = append(failed[w.pod], w.String())
		}
	}
	var intercept, whileDown int
	var offsets []string
	var slowest time.Duration
	for _, p := range l.pods {
		if p.intercept {
			intercept++
		}
		if !down.IsZero() {
			offsets = append(offsets, fmt.Sprintf("%+.1fs", p.created.Sub(down).Seconds()))
			if p.created.After(down) && p.created.Before(up) {
				whileDown++
			}
		}
		st, err := c.getPod(p.name)
		if err != nil || st.Status.Phase != "Running" || len(st.Status.ContainerStatuses) != 1 || !st.Status.ContainerStatuses[0].Ready || st.Status.ContainerStatuses[0].RestartCount != 0 {
			failed[p.name] = append(failed[p.name], fmt.Sprintf("status %+v (%v), want Running, ready, never restarted", st, err))
			continue
		}
		c.waitReady(&p.pod, "10s")
		p.want.ContainerID, p.want.Socket = p.sandbox, c.node.Socket
		if err := nodecheck.Present(p.netns, p.want); err != nil {
			failed[p.name] = append(failed[p.name], err.Error())
		}
		if p.intercept {
			c.node.CheckSeccomp(t, strings.TrimPrefix(st.Status.ContainerStatuses[0].ContainerID, "containerd://"), true)
		}
		if d := c.readyAfter(p.name); d > slowest {
			slowest = d
		}
	}
	for name, why := range failed {
		t.Errorf("%s: pod %s failed:\n  %s", l.event, name, strings.Join(why, "\n  "))
	}
	for name, why := range excused {
		t.Logf("%s: pod %s was retried by the kubelet, for a cause the event makes unavoidable, and Ready %v after its creation:\n  %s",
			l.event, name, c.readyAfter(name), strings.Join(why, "\n  "))
	}
	nFailed := len(l.failed) + len(failed)
	during := ""
	if !down.IsZero() {
		during = fmt.Sprintf(", created at %s from the event (napitapd served again at %+.1fs), %d of them while no napitapd served",
			strings.Join(offsets, " "), up.Sub(down).Seconds(), whileDown)
	}
	t.Logf("%s: %d pods created one every %v during it (%d intercept under %s, %d fds)%s: %d failed; all Ready %v after the loop stopped, the slowest %v after its creation",
		l.event, len(l.pods)+len(l.failed), podLoopEvery, intercept, vmmProfile, len(l.pods)-intercept, during, nFailed, waited.Round(time.Millisecond), slowest)

	start = time.Now()
	var plain []string
	for _, p := range l.pods {
		plain = append(plain, p.name)
	}
	if _, err := c.kubectl(append([]string{"delete", "pod", "-n", podNamespace, "--wait", "--timeout=180s"}, plain...)...); err != nil {
		t.Errorf("%s: %v", l.event, err)
	}
	for _, p := range l.pods {
		if p.sandbox == "" {
			continue
		}
		if err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(p.netns, p.want) }); err != nil {
			t.Errorf("%s: pod %s after kubectl delete: %v", l.event, p.name, err)
		}
	}
	t.Logf("%s: kubectl delete of its %d pods: %v", l.event, len(plain), time.Since(start).Round(time.Millisecond))
	return loopResult{created: len(l.pods) + len(l.failed), failed: nFailed, retried: len(excused)}
}

// loopResult is what a pod loop created, how many of those failed, and
// how many the kubelet retried for a cause the event makes unavoidable
// (podLoop.excuse).
type loopResult struct{ created, failed, retried int }

// readyAfter is how long after its creation pod name became Ready, to the
// second (the API's resolution).
func (c *cluster) readyAfter(name string) time.Duration {
	out, err := c.kubectl("get", "pod", "-n", podNamespace, name, "-o", "json")
	if err != nil {
		return 0
	}
	var p struct {
		Metadata struct{ CreationTimestamp time.Time }
		Status   struct {
			Conditions []struct {
				Type               string
				LastTransitionTime time.Time
			}
		}
	}
	if json.Unmarshal([]byte(out), &p) != nil {
		return 0
	}
	for _, cond := range p.Status.Conditions {
		if cond.Type == "Ready" {
			return cond.LastTransitionTime.Sub(p.Metadata.CreationTimestamp)
		}
	}
	return 0
}

// podWarning is a Warning event of a pod in podNamespace.
type podWarning struct {
	pod, reason, message string
	count                int
}

func (w podWarning) String() string {
	return fmt.Sprintf("%s (x%d): %s", w.reason, w.count, w.message)
}

// warningEvents lists the Warning events of the pods in podNamespace:
// what a failed sandbox (FailedCreatePodSandBox), container (Failed,
// CreateContainerError) or restart (BackOff) leaves.
func (c *cluster) warningEvents() []podWarning {
	out, err := c.kubectl("get", "events", "-n", podNamespace, "--field-selector", "type=Warning", "-o", "json")
	if err != nil {
		c.t.Errorf("events: %v", err)
		return nil
	}
	var list struct {
		Items []struct {
			InvolvedObject  struct{ Kind, Name string }
			Reason, Message string
			Count           int
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		c.t.Errorf("events: %v", err)
		return nil
	}
	var ws []podWarning
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Pod" {
			ws = append(ws, podWarning{e.InvolvedObject.Name, e.Reason, e.Message, e.Count})
		}
	}
	return ws
}

// --- The end ---

// deleteAndCheckGone deletes the VM pods and checks that nothing of
// theirs is left: taps, attachments, state files, leases, seccomp
// listeners, and no copy in the fd holder.
func (c *cluster) deleteAndCheckGone(ds *daemonSetPod, vms []*longRunningVM, held []*multusPod) {
	t := c.t
	t.Helper()
	start := time.Now()
	var names []string
	for _, v := range vms {
		names = append(names, v.name)
	}
	for _, p := range held {
		names = append(names, p.name)
	}
	c.kubectlMust(append([]string{"delete", "pod", "-n", podNamespace, "--wait", "--timeout=180s"}, names...)...)
	t.Logf("kubectl delete of %v: %v", names, time.Since(start).Round(time.Millisecond))
	for _, v := range vms {
		for _, want := range []nodecheck.Expect{v.want, v.wantHP} {
			if err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(v.netns, want) }); err != nil {
				t.Errorf("pod %s after kubectl delete: %v", v.name, err)
			}
		}
	}
	for _, p := range held {
		if err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(p.netns, p.want) }); err != nil {
			t.Errorf("pod %s after kubectl delete: %v", p.name, err)
		}
	}
	if atts, err := (&handoff.Client{Socket: c.node.Socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("napitapd after the pods went holds %+v (%v), want nothing", atts, err)
	}
	if left := crihelp.AttachmentStates(c.node.StateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", c.node.StateDir, left)
	}
	holder := c.fdstorePid(ds.name)
	err := crihelp.Poll(30*time.Second, func() error {
		for _, pid := range []int{ds.pid, holder} {
			if listeners, queues, err := countFiles(pid); err != nil || listeners+queues > 0 {
				return fmt.Errorf("pid %d holds %d seccomp listeners and %d queues (%v)", pid, listeners, queues, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Errorf("napitapd (pid %d) or its fd holder (pid %d) after the pods went: %v", ds.pid, holder, err)
	}
	if left := leases(t, filepath.Join(newMultusNode(c.root).varLib, "networks", "napitap-standalone")); len(left) > 0 {
		t.Errorf("host-local still holds %v on napitap-standalone", left)
	}
	if left := ipamEntries(t, c.node); len(left) > 0 {
		t.Errorf("host-local still holds %v on the default network", left)
	}
	if links, want := crihelp.LinkNames(t, c.node.NetNS), "lo napinodeup0 "+vmBridge; strings.Join(links, " ") != want {
		t.Errorf("node netns links after the pods went: %v, want %s (bridges stay, as on a node)", links, want)
	}
}

// checkHolderLog: the pod's fd holder logged no warning or error through
// the SIGKILL; it prints what the holder said it held as each napitapd
// connection ended.
func (c *cluster) checkHolderLog(ds *daemonSetPod) {
	t := c.t
	t.Helper()
	st, err := c.daemonSetPodStatus(ds.name)
	if err != nil {
		t.Fatal(err)
	}
	path := st.holderLogPath()
	log := readFile(path)
	if log == "" {
		t.Errorf("the fd holder's log %s is empty or missing", path)
	}
	c.checkLogClean("the fd holder", log, plainQueueLine)
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "holding on") {
			_, msg, _ := strings.Cut(line, " F ") // the CRI log line's time, stream and tag first
			t.Logf("fd holder: %s", msg)
		}
	}
}

// holderLogPath is the log of the pod's running fd holder.
func (st dsPodStatus) holderLogPath() string {
	return filepath.Join(filepath.Dir(st.napitapdLogDir), "fdstore", fmt.Sprintf("%d.log", st.fdstoreRestarts))
}

// plainQueueLine is the fd holder's warning for a TUNSETIFF it let go on
// while the kubelet's back-off kept napitapd down (killSupervisor's).
var plainQueueLine = regexp.MustCompile(`level=WARN msg="plainqueue: no napitapd: a TUNSETIFF went on in the kernel, its queue without NAPI"`)

// napitapdPlainQueueLine is napitapd's warning, once back, for each
// TUNSETIFF the fd holder let go on while it was down (issue 44, item 4):
// expected after the back-off rows, which count it (probePlainHotPlug).
var napitapdPlainQueueLine = regexp.MustCompile(`level=WARN msg="plain queue: with no napitapd, the fd holder let a TUNSETIFF go on in the kernel: that queue has no NAPI" reason=holder_bounded_wait pod="pod napitap-e2e/`)

// faultLine is a warning refusedRollout causes: the old napitapd's on
// each refusal, the new one's while it waits.
var faultLine = regexp.MustCompile(`level=WARN msg="(takeover: refused by a fault hook|another napitapd serves this state dir and cannot be taken over)`)

// checkLogClean fails the test on a warning or error in a napitapd's
// log, but for those of a refused takeover (refusedRollout's) and those
// one of allow matches.
func (c *cluster) checkLogClean(whose, log string, allow ...*regexp.Regexp) {
	for _, line := range strings.Split(log, "\n") {
		if faultLine.MatchString(line) || napitapdPlainQueueLine.MatchString(line) || slices.ContainsFunc(allow, func(re *regexp.Regexp) bool { return re.MatchString(line) }) {
			continue
		}
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			c.t.Errorf("%s: %s", whose, line)
		}
	}
}
