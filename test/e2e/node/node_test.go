package node

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

var binDir string

// probeEnv makes the test binary the program napitapctl exec runs with
// the fetched queue fds: "<netns path>|<tap name>", the queue count as its
// one argument.
const probeEnv = "NAPITAP_NODE_E2E_PROBE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(probeEnv); spec != "" {
		os.Exit(probeMain(spec, os.Args[1:]))
	}
	// The pause binary runs alone in its image: it must be static.
	os.Setenv("CGO_ENABLED", "0")
	cnitest.MainWithBinaries(m, &binDir,
		"github.com/napitap/napitap/plugins/napitap",
		"github.com/napitap/napitap/cmd/napitapd",
		"github.com/napitap/napitap/cmd/napitapctl",
		"github.com/napitap/napitap/test/e2e/crihelp/pause",
		// The burst pods' VM opener (TestABurstOfVMPodsUnderNapitapdsCPULimits).
		"github.com/napitap/napitap/internal/bench/cnibench/launch/napitap-bench-launcher",
		"github.com/containernetworking/plugins/plugins/main/bridge",
		"github.com/containernetworking/plugins/plugins/main/loopback",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
		"github.com/containernetworking/plugins/plugins/ipam/static",
	)
}

// groFlushTimeout is the conflist's: it lets GRO merge segments written
// one at a time, which is what the probe looks for (DESIGN.md fact 10).
const groFlushTimeout = 200000

// TestKubernetesNode runs VM-like pods on a real kubelet whose CNI chain
// is bridge + napitap: applied with kubectl, Running, each with its tap
// wired and its NAPI queues held by napitapd; a kubelet restart leaves
// them alone; napitap's CHECK passes and GC keeps live pods' attachments
// while removing a stale one; napitapctl fetches the queues and they carry
// NAPI; deleting the pods with kubectl leaves nothing behind.
func TestKubernetesNode(t *testing.T) {
	testStart := time.Now()
	queueCounts := []int{1, 4}
	c := startCluster(t, crihelp.Config{Name: "napinode", Subnet: podSubnet, Queues: queueCounts[0],
		NapitapExtra: fmt.Sprintf(`"groFlushTimeout": %d`, groFlushTimeout)})
	n, netns := c.node, c.node.NetNS

	// Pods, one queue count at a time (see the package doc).
	var pods []*pod
	for _, queues := range queueCounts {
		p := &pod{name: fmt.Sprintf("vm-q%d", queues), queues: queues}
		n.UseQueues(queues)
		start := time.Now()
		c.apply(c.manifest(p.name, queues))
		st := c.waitReady(p, "120s")
		t.Logf("pod %s (%d queues): Running in %v, phase %s, pod IP %s, sandbox %.12s, netns %s",
			p.name, queues, time.Since(start).Round(time.Millisecond), st.Status.Phase, st.Status.PodIP, p.sandbox, p.netns)
		if err := nodecheck.Present(p.netns, c.expect(p, queues)); err != nil {
			t.Errorf("pod %s: %v", p.name, err)
		}
		pods = append(pods, p)
	}
	for _, p := range pods {
		if err := nodecheck.Present(p.netns, c.expect(p, p.queues)); err != nil {
			t.Errorf("pod %s with all pods up: %v", p.name, err)
		}
		attrs, err := tapsetup.ReadSysfs(p.netns, "tap0")
		if err != nil || attrs.GROFlushTimeout != groFlushTimeout {
			t.Errorf("pod %s: tap0 gro_flush_timeout %+v (%v), want %d", p.name, attrs, err, groFlushTimeout)
		}
	}
	if t.Failed() {
		return
	}

	// kubelet restarts with the pods alive: they keep their sandboxes,
	// containers and taps.
	c.kubelet.stop(t)
	t.Log("kubelet stopped with the pods running")
	c.startKubelet()
	c.waitKubeletSynced(pods)
	for _, p := range pods {
		c.assertUnchanged(p)
		if err := nodecheck.Present(p.netns, c.expect(p, p.queues)); err != nil {
			t.Errorf("pod %s after the kubelet restart: %v", p.name, err)
		}
	}

	// CHECK: neither kubelet nor containerd 1.6 calls it; a runtime that
	// does would, like this, through libcni with the cached result.
	for _, p := range pods {
		if err := c.check(p); err != nil {
			t.Errorf("CHECK of pod %s: %v", p.name, err)
		} else {
			t.Logf("CHECK of pod %s (bridge + napitap): ok", p.name)
		}
	}

	// GC: containerd 1.6 does not call it either. A stale attachment
	// (ADD through libcni, then forgotten by its runtime) goes; the live
	// pods keep theirs.
	c.gc(pods)

	// napitapctl fetches each pod's queues and runs the probe with them:
	// every queue carries NAPI.
	for _, p := range pods {
		c.fetchAndProbe(p)
		if err := nodecheck.Present(p.netns, c.expect(p, 0)); err != nil {
			t.Errorf("pod %s after the fetch: %v", p.name, err)
		}
	}
	if t.Failed() {
		return
	}

	// kubectl delete: CNI DEL through kubelet and containerd.
	start := time.Now()
	c.kubectlMust(append([]string{"delete", "pod", "-n", podNamespace, "--wait", "--timeout=120s"}, names(pods)...)...)
	t.Logf("kubectl delete of %d pods: %v", len(pods), time.Since(start).Round(time.Millisecond))
	for _, p := range pods {
		err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(p.netns, c.expect(p, 0)) })
		if err != nil {
			t.Errorf("pod %s after kubectl delete: %v", p.name, err)
		}
		if out, err := n.CrictlRun("pods", "--id", p.sandbox, "--state", "ready", "-q"); err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("pod %s: sandbox %.12s still ready (%v)", p.name, p.sandbox, err)
		}
	}
	if atts, err := (&handoff.Client{Socket: n.Socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("napitapd after the pods went holds %+v (%v), want nothing", atts, err)
	}
	if left := crihelp.AttachmentStates(n.StateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", n.StateDir, left)
	}
	if links := crihelp.LinkNames(t, netns); strings.Join(links, " ") != "lo napinode0" {
		t.Errorf("node netns links after the pods went: %v, want lo and napinode0", links)
	}
	if left := ipamEntries(t, n); len(left) > 0 {
		t.Errorf("host-local still holds %v", left)
	}
	t.Logf("whole run: %v", time.Since(testStart).Round(time.Second))
}

func names(pods []*pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.name)
	}
	return out
}

// expect is what nodecheck asks of a pod's attachment, with held queue fds
// in napitapd.
func (c *cluster) expect(p *pod, held int) nodecheck.Expect {
	return nodecheck.Expect{ContainerID: p.sandbox, IfName: "eth0", TapName: "tap0", Queues: p.queues, NAPI: true,
		Wiring: "tc-redirect", Socket: c.node.Socket, Held: held}
}

// describe logs kubectl describe of a pod that did not get Ready.
func (c *cluster) describe(name string) {
	out, err := c.kubectl("describe", "pod", "-n", podNamespace, name)
	c.t.Logf("kubectl describe pod %s (%v):\n%s", name, err, out)
}

// waitKubeletSynced waits until the restarted kubelet reports every pod
// (kubelet's own /pods, through the apiserver's node proxy), then watches
// for 15 s that it does not replace them.
func (c *cluster) waitKubeletSynced(pods []*pod) {
	t := c.t
	err := crihelp.Poll(60*time.Second, func() error {
		out, err := c.kubectl("get", "--raw", "/api/v1/nodes/"+c.nodeName+"/proxy/pods")
		if err != nil {
			return err
		}
		for _, p := range pods {
			if !strings.Contains(out, p.uid) {
				return fmt.Errorf("kubelet does not list pod %s yet", p.name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("restarted kubelet: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && !t.Failed() {
		for _, p := range pods {
			c.assertUnchanged(p)
		}
		time.Sleep(time.Second)
	}
	t.Logf("restarted kubelet keeps %d pods for 15 s", len(pods))
}

// assertUnchanged: the pod is Running and Ready with no container restart,
// on the one sandbox it started with, still ready.
func (c *cluster) assertUnchanged(p *pod) {
	t := c.t
	t.Helper()
	st, err := c.getPod(p.name)
	if err != nil {
		t.Errorf("pod %s: %v", p.name, err)
		return
	}
	if st.Status.Phase != "Running" || len(st.Status.ContainerStatuses) != 1 || !st.Status.ContainerStatuses[0].Ready || st.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("pod %s: %+v, want Running with its one container ready and never restarted", p.name, st.Status)
	}
	ids, err := c.sandboxOf(p.uid)
	if err != nil || !slices.Equal(ids, []string{p.sandbox}) {
		t.Errorf("pod %s: sandboxes %v (%v), want only %.12s", p.name, ids, err, p.sandbox)
	}
	if sb, err := c.node.InspectSandbox(p.sandbox); err != nil || sb.State != "SANDBOX_READY" {
		t.Errorf("pod %s: sandbox %+v (%v), want ready", p.name, sb, err)
	}
}

// cniCacheDir is where containerd 1.6 (go-cni, libcni's default) caches
// results.
const cniCacheDir = "/var/lib/cni"

// check runs CHECK of the pod's attachment through libcni, in the node
// netns, with the conflist it was added with and the result and args
// containerd cached.
func (c *cluster) check(p *pod) error {
	cni := libcni.NewCNIConfigWithCacheDir([]string{c.node.BinLinks}, cniCacheDir, nil)
	list, err := libcni.ConfListFromBytes([]byte(c.node.Conflist(p.queues)))
	if err != nil {
		return err
	}
	rt := &libcni.RuntimeConf{ContainerID: p.sandbox, NetNS: p.netns, IfName: "eth0"}
	cached, cachedRT, err := cni.GetNetworkListCachedConfig(list, rt)
	if err != nil || cached == nil {
		return fmt.Errorf("no cached config of %.12s/eth0 in %s (%v)", p.sandbox, cniCacheDir, err)
	}
	if cachedRT.NetNS != p.netns {
		return fmt.Errorf("cached netns %s, the CRI says %s", cachedRT.NetNS, p.netns)
	}
	if !strings.Contains(fmt.Sprint(cachedRT.Args), p.name) {
		return fmt.Errorf("cached CNI_ARGS %v do not name pod %s", cachedRT.Args, p.name)
	}
	return c.node.NetNS.Do(func(ns.NetNS) error {
		return cni.CheckNetworkList(context.Background(), list, cachedRT)
	})
}

// gc adds a stale attachment through libcni (its own cache, so that only
// napitap's GC, not libcni's cache walk, can find it), then runs GC of the
// network with the live pods as the valid attachments, as a runtime would.
func (c *cluster) gc(pods []*pod) {
	t := c.t
	stale := nstest.New(t, "node-stale")
	staleCNI := libcni.NewCNIConfigWithCacheDir([]string{c.node.BinLinks}, t.TempDir(), nil)
	list, err := libcni.ConfListFromBytes([]byte(c.node.ConflistVersion("1.1.0", 2)))
	if err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: "napinode-stale-" + nstest.RandomSuffix(), NetNS: stale.Path(), IfName: "eth0"}
	err = c.node.NetNS.Do(func(ns.NetNS) error {
		_, err := staleCNI.AddNetworkList(context.Background(), list, rt)
		return err
	})
	if err != nil {
		t.Fatalf("ADD of the stale attachment: %v", err)
	}
	staleWant := nodecheck.Expect{ContainerID: rt.ContainerID, IfName: "eth0", TapName: "tap0", Queues: 2, NAPI: true,
		Wiring: "tc-redirect", Socket: c.node.Socket, Held: 2}
	if err := nodecheck.Present(stale.Path(), staleWant); err != nil {
		t.Fatalf("stale attachment: %v", err)
	}
	ipamBefore := ipamEntries(t, c.node)

	var valid []types.GCAttachment
	for _, p := range pods {
		valid = append(valid, types.GCAttachment{ContainerID: p.sandbox, IfName: "eth0"})
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{c.node.BinLinks}, cniCacheDir, nil)
	start := time.Now()
	err = c.node.NetNS.Do(func(ns.NetNS) error {
		return cni.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
	})
	if err != nil {
		t.Errorf("GC: %v", err)
	}
	t.Logf("GC with %d valid attachments: %v", len(valid), time.Since(start).Round(time.Millisecond))
	if err := nodecheck.Gone(stale.Path(), staleWant); err != nil {
		t.Errorf("stale attachment after GC: %v", err)
	}
	for _, p := range pods {
		if err := nodecheck.Present(p.netns, c.expect(p, p.queues)); err != nil {
			t.Errorf("pod %s after GC: %v", p.name, err)
		}
	}
	// The live pods keep their addresses. (bridge has no GC, and napitap
	// delegates GC only to an IPAM of its own, so the stale address is
	// host-local's until the DEL below.)
	ipamAfter := ipamEntries(t, c.node)
	for _, p := range pods {
		if id := ipamAfter[p.ip.String()]; id != p.sandbox {
			t.Errorf("host-local after GC: %s is %q's, want pod %s's (before %v, after %v)", p.ip, id, p.name, ipamBefore, ipamAfter)
		}
	}
	// What the runtime that forgot it would do next: DEL, which succeeds
	// with the tap already gone and removes the bridge's veth.
	err = c.node.NetNS.Do(func(ns.NetNS) error { return staleCNI.DelNetworkList(context.Background(), list, rt) })
	if err != nil {
		t.Errorf("DEL of the stale attachment after GC: %v", err)
	}
	for ip, id := range ipamEntries(t, c.node) {
		if id == rt.ContainerID {
			t.Errorf("host-local still holds %s for the stale attachment after its DEL", ip)
		}
	}
}

// ipamEntries maps the addresses host-local has handed out on the node to
// their container IDs.
func ipamEntries(t *testing.T, n *crihelp.Node) map[string]string {
	t.Helper()
	dir := filepath.Join(n.Root, "cni", "ipam", n.NetworkName())
	out := map[string]string{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "last_reserved_ip") || e.Name() == "lock" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = strings.Fields(string(b) + " ?")[0]
	}
	return out
}

// fetchAndProbe runs `napitapctl exec` for the pod's attachment with this
// test binary as the program: it gets the queue fds and proves on each
// that it carries NAPI (napiprobe).
func (c *cluster) fetchAndProbe(p *pod) {
	c.fetchAndProbeIf(p, "eth0", "tap0")
}

// fetchAndProbeIf is fetchAndProbe for the attachment of ifName, whose
// tap is tap.
func (c *cluster) fetchAndProbeIf(p *pod, ifName, tap string) {
	t := c.t
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "napitapctl"), "--socket", c.node.Socket, "exec",
		"--container", p.sandbox, "--ifname", ifName, "--", self, "{queues}", "{fds}")
	cmd.Env = append(os.Environ(), probeEnv+"="+p.netns+"|"+tap)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	t.Logf("pod %s: napitapctl exec with the probe (%v):\n%s", p.name, time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	if err != nil {
		t.Errorf("pod %s: napitapctl exec: %v", p.name, err)
	}
}

// probeMain is the test binary as napitapctl's program: args are the
// queue count and the fds ("3:4:..."), spec the pod netns and tap.
//
// napiprobe.Run writes the probe flow into each queue. What it reads back
// itself is nothing here: its packet socket is bound to ETH_P_IP, and
// protocol handlers run after tc ingress, where tc-redirect wiring's
// mirred filter on the tap has already taken every frame to eth0. A
// packet socket bound to ETH_P_ALL is a tap (ptype_all), served before tc
// ingress, so the probe's frames are read from one of those.
func probeMain(spec string, args []string) int {
	netnsPath, tap, ok := strings.Cut(spec, "|")
	if !ok || len(args) != 2 {
		fmt.Fprintf(os.Stderr, "probe: bad spec %q or args %q\n", spec, args)
		return 2
	}
	queues, err := strconv.Atoi(args[0])
	fds := strings.Split(args[1], ":")
	if err != nil || queues != len(fds) {
		fmt.Fprintf(os.Stderr, "probe: %s queues, fds %s\n", args[0], args[1])
		return 2
	}
	const segments, segmentLen = 16, 1000
	rc := 0
	for i, s := range fds {
		fd, err := strconv.Atoi(s)
		if err != nil {
			fmt.Fprintf(os.Stderr, "probe: fd %q\n", s)
			return 2
		}
		q := os.NewFile(uintptr(fd), "queue"+s)
		flags, err := tapsetup.QueueFlagsOf(q)
		if err != nil {
			fmt.Printf("queue %d (fd %d): not a tap queue: %v\n", i, fd, err)
			rc = 1
			continue
		}
		sock, err := tapCapture(netnsPath, tap)
		if err != nil {
			fmt.Printf("queue %d (fd %d): %v\n", i, fd, err)
			return 1
		}
		res, err := napiprobe.Run(netnsPath, tap, q, 12, segments, segmentLen)
		if err != nil {
			unix.Close(sock)
			fmt.Printf("queue %d (fd %d): %v\n", i, fd, err)
			rc = 1
			continue
		}
		res.SKBLens = probeFrames(sock, segments*segmentLen)
		unix.Close(sock)
		fmt.Printf("queue %d (fd %d, TUNGETIFF %#x): %d segments of %d bytes arrived on %s as frames of %v bytes: merged=%v\n",
			i, fd, flags, segments, segmentLen, tap, res.SKBLens, res.Merged())
		if !res.Merged() {
			rc = 1
		}
	}
	return rc
}

// Headers of the probe's frames and its flow's ports (pkg/napiprobe).
const (
	probeHdrs                  = 14 + 20 + 20
	probeSrcPort, probeDstPort = 40000, 40001
)

// tapCapture opens an ETH_P_ALL packet socket on tap in the pod netns.
func tapCapture(netnsPath, tap string) (int, error) {
	sock := -1
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		link, err := netlink.LinkByName(tap)
		if err != nil {
			return err
		}
		all := htons(unix.ETH_P_ALL)
		if sock, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(all)); err != nil {
			return err
		}
		_ = unix.SetsockoptInt(sock, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
		tv := unix.NsecToTimeval((300 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		return unix.Bind(sock, &unix.SockaddrLinklayer{Protocol: all, Ifindex: link.Attrs().Index})
	})
	if err != nil {
		if sock >= 0 {
			unix.Close(sock)
		}
		return -1, fmt.Errorf("capture on %s in %s: %w", tap, netnsPath, err)
	}
	return sock, nil
}

// probeFrames reads the lengths of the probe flow's frames received on
// the socket until they carry want payload bytes or none comes for 300 ms.
func probeFrames(sock, want int) []int {
	var lens []int
	buf := make([]byte, 256)
	for got := 0; got < want; {
		n, from, err := unix.Recvfrom(sock, buf, unix.MSG_TRUNC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return lens
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		f := buf[:min(n, len(buf))]
		if len(f) < probeHdrs || binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_IP || f[14+9] != unix.IPPROTO_TCP {
			continue
		}
		tcp := f[14+int(f[14]&0x0f)*4:]
		if len(tcp) < 4 || binary.BigEndian.Uint16(tcp) != probeSrcPort || binary.BigEndian.Uint16(tcp[2:]) != probeDstPort {
			continue
		}
		lens = append(lens, n)
		got += n - probeHdrs
	}
	return lens
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// addNodeIP puts the node's address on the node netns' lo (this kernel
// has no dummy links): the apiserver advertises it and kubelet reports it.
func addNodeIP(ip string) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	addr, err := netlink.ParseAddr(ip + "/32")
	if err != nil {
		return err
	}
	return netlink.AddrAdd(lo, addr)
}

// makeCgroupRoot makes kubelet's cgroupRoot in every hierarchy (kubelet
// wants it to exist), with the root's cpuset; crihelp removes it with
// the pods' cgroups when the test ends.
func makeCgroupRoot(t *testing.T, name string) {
	t.Helper()
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/cgroup.procs")
	if crihelp.Exists("/sys/fs/cgroup/cgroup.procs") {
		dirs = append(dirs, "/sys/fs/cgroup/cgroup.procs")
	}
	for _, procs := range dirs {
		top := filepath.Dir(procs)
		dir := filepath.Join(top, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(top, f)); err == nil {
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatalf("%s: %v", filepath.Join(dir, f), err)
				}
			}
		}
	}
}
