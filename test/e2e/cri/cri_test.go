package cri

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

var binDir string

func TestMain(m *testing.M) {
	// The pause binary runs alone in its image: it must be static.
	os.Setenv("CGO_ENABLED", "0")
	cnitest.MainWithBinaries(m, &binDir,
		"github.com/napitap/napitap/plugins/napitap",
		"github.com/napitap/napitap/cmd/napitapd",
		"github.com/napitap/napitap/test/e2e/cri/pause",
		"github.com/containernetworking/plugins/plugins/main/bridge",
		"github.com/containernetworking/plugins/plugins/main/loopback",
		"github.com/containernetworking/plugins/plugins/ipam/host-local",
	)
}

// TestPodSandboxesThroughContainerdCRI runs three pod sandboxes through
// containerd's CRI plugin with crictl, as kubelet would (RunPodSandbox,
// StopPodSandbox, RemovePodSandbox), on a node whose CNI chain is bridge +
// napitap, with 1, 2 and 4 queues. Each sandbox netns gets its tap wired
// to eth0 with its queues held by napitapd; stopping and removing the
// sandboxes leaves nothing behind.
func TestPodSandboxesThroughContainerdCRI(t *testing.T) {
	nstest.RequireRoot(t)
	for _, tool := range []string{"containerd", "ctr", "runc", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run hack/deps.sh (%v)", tool, err)
		}
	}
	crictl := buildCrictl(t)
	ensureCgroups(t)
	root := newRoot(t)
	queueCounts := []int{1, 2, 4}
	n := startNode(t, root, crictl, queueCounts[0])

	type pod struct {
		id, netns string
		want      nodecheck.Expect
	}
	var pods []pod
	for i, queues := range queueCounts {
		n.useQueues(queues)
		cfg := n.writePodConfig(i, queues)
		start := time.Now()
		id := n.crictlMust("runp", cfg)
		took := time.Since(start)
		n.ids = append(n.ids, id)
		netns, ip := n.inspectPod(id)
		t.Logf("pod %d (%d queues): runp %v, sandbox %.12s, ip %s, netns %s", i, queues, took.Round(time.Millisecond), id, ip, netns)
		if !strings.HasPrefix(netns, root+"/") {
			t.Errorf("sandbox %.12s netns %s is not under the test's state dir %s", id, netns, root)
		}
		if _, subnet, _ := net.ParseCIDR(n.subnet); ip == nil || !subnet.Contains(ip) {
			t.Errorf("sandbox %.12s has ip %v, want one in %s", id, ip, n.subnet)
		}
		// The name containerd's shim listens on, checked here so that its
		// absence after rmp means something.
		if sock := shimSocket(n.address, id); !exists(sock) {
			t.Errorf("sandbox %.12s: no shim socket at %s", id, sock)
		}
		want := nodecheck.Expect{ContainerID: id, IfName: "eth0", TapName: "tap0", Queues: queues, NAPI: true,
			Wiring: "tc-redirect", Socket: n.socket, Held: queues}
		if err := nodecheck.Present(netns, want); err != nil {
			t.Errorf("after runp of pod %d: %v", i, err)
		}
		pods = append(pods, pod{id: id, netns: netns, want: want})
	}
	// Three sandboxes side by side: each still has exactly its own.
	for i, p := range pods {
		if err := nodecheck.Present(p.netns, p.want); err != nil {
			t.Errorf("pod %d with all pods up: %v", i, err)
		}
	}
	if t.Failed() {
		return // cleanup removes the pods
	}

	for i, p := range pods {
		start := time.Now()
		n.crictlMust("stopp", p.id)
		stopped := time.Since(start)
		if err := nodecheck.Gone(p.netns, p.want); err != nil {
			t.Errorf("after stopp of pod %d: %v", i, err)
		}
		start = time.Now()
		n.crictlMust("rmp", p.id)
		removed := time.Since(start)
		t.Logf("pod %d: stopp %v, rmp %v", i, stopped.Round(time.Millisecond), removed.Round(time.Millisecond))
		if err := nodecheck.Gone(p.netns, p.want); err != nil {
			t.Errorf("after rmp of pod %d: %v", i, err)
		}
		if exists(p.netns) {
			t.Errorf("pod %d netns file %s is still there after rmp", i, p.netns)
		}
		if exists(shimSocket(n.address, p.id)) {
			t.Errorf("pod %d shim socket %s is still there after rmp", i, shimSocket(n.address, p.id))
		}
	}

	// The node is as it was, but for the bridge the bridge plugin keeps.
	if left := n.crictlMust("pods", "-q"); left != "" {
		t.Errorf("crictl pods after rmp: %q", left)
	}
	if links := nodeLinks(t, n.netns); strings.Join(links, " ") != "lo "+bridgeName {
		t.Errorf("node netns links after rmp: %v, want only lo and %s", links, bridgeName)
	}
	if links := hostLinks(t); len(links) > 0 {
		t.Errorf("napicri links in the host netns: %v", links)
	}
	if netnsDir := filepath.Join(root, "state", "io.containerd.grpc.v1.cri", "netns"); len(listDir(netnsDir)) > 0 {
		t.Errorf("pod netns files left in %s: %v", netnsDir, listDir(netnsDir))
	}
	if left := listDir(n.stateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", n.stateDir, left)
	}
	if atts, err := (&handoff.Client{Socket: n.socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("napitapd after rmp holds %+v (%v), want nothing", atts, err)
	}
	if pids := shimsOf(n.address); len(pids) > 0 {
		t.Errorf("shims still running after rmp: %v", pids)
	}
}

// buildCrictl returns the cached crictl, building it first (about a
// minute) through hack/crictl.sh, which pins its version.
func buildCrictl(t *testing.T) string {
	t.Helper()
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cmd := exec.Command("bash", filepath.Join(repo, "hack", "crictl.sh"), "--path")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/crictl.sh --path: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("built crictl in %v", d.Round(time.Second))
	}
	return strings.TrimSpace(string(out))
}

// writePodConfig writes the PodSandboxConfig crictl runp sends, with the
// pod's cgroups under the test's napicri-* parent and its logs in the
// temp dir.
func (n *node) writePodConfig(i, queues int) string {
	n.t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{
			"name":      fmt.Sprintf("napicri-q%d", queues),
			"namespace": "napicri",
			"uid":       fmt.Sprintf("napicri-%s-%d", filepath.Base(n.root), i),
			"attempt":   0,
		},
		"hostname":      fmt.Sprintf("napicri-%d", i),
		"log_directory": filepath.Join(n.root, "logs", fmt.Sprint(i)),
		"linux":         map[string]any{"cgroup_parent": n.cgroup},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		n.t.Fatal(err)
	}
	path := filepath.Join(n.root, fmt.Sprintf("pod-%d.json", i))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		n.t.Fatal(err)
	}
	return path
}

// inspectPod returns the sandbox's netns path, from the OCI spec containerd
// ran it with, and its IP as the CRI reports it.
func (n *node) inspectPod(id string) (string, net.IP) {
	n.t.Helper()
	out := n.crictlMust("inspectp", "-o", "json", id)
	var inspect struct {
		Status struct {
			State   string
			Network struct{ IP string }
		}
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct{ Type, Path string }
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &inspect); err != nil {
		n.t.Fatalf("crictl inspectp %s: %v", id, err)
	}
	if inspect.Status.State != "SANDBOX_READY" {
		n.t.Errorf("sandbox %.12s state %s, want SANDBOX_READY", id, inspect.Status.State)
	}
	for _, ns := range inspect.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path, net.ParseIP(inspect.Status.Network.IP)
		}
	}
	n.t.Fatalf("sandbox %.12s: no network namespace path in its runtime spec: %s", id, tail(out, 2000))
	return "", nil
}

func nodeLinks(t *testing.T, netns *nstest.NetNS) []string {
	t.Helper()
	var names []string
	netns.Run(t, func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return err
	})
	sort.Strings(names)
	return names
}

func hostLinks(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "napicri") {
			names = append(names, l.Attrs().Name)
		}
	}
	return names
}
