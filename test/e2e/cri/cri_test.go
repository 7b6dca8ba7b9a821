package cri

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

var binDir string

func TestMain(m *testing.M) {
	// The pause binary runs alone in its image: it must be static.
	os.Setenv("CGO_ENABLED", "0")
	cnitest.MainWithBinaries(m, &binDir,
		"github.com/napitap/napitap/plugins/napitap",
		"github.com/napitap/napitap/cmd/napitapd",
		"github.com/napitap/napitap/cmd/napitapctl",
		"github.com/napitap/napitap/test/e2e/crihelp/pause",
		"github.com/napitap/napitap/test/e2e/cri/tunstorm",
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
	crihelp.RequireTools(t, "containerd", "ctr", "runc", "nsenter", "ip")
	crictl := crihelp.BuildCrictl(t)
	crihelp.EnsureCgroups(t)
	root := crihelp.NewRoot(t, "napicri")
	queueCounts := []int{1, 2, 4}
	n := crihelp.Start(t, crihelp.Config{Root: root, BinDir: binDir, Crictl: crictl, Queues: queueCounts[0]})

	type pod struct {
		id, netns string
		want      nodecheck.Expect
	}
	var pods []pod
	for i, queues := range queueCounts {
		n.UseQueues(queues)
		cfg := writePodConfig(t, n, i, queues)
		start := time.Now()
		id := n.Crictl("runp", cfg)
		took := time.Since(start)
		n.Track(id)
		netns, ip := inspectPod(t, n, id)
		t.Logf("pod %d (%d queues): runp %v, sandbox %.12s, ip %s, netns %s", i, queues, took.Round(time.Millisecond), id, ip, netns)
		if !strings.HasPrefix(netns, root+"/") {
			t.Errorf("sandbox %.12s netns %s is not under the test's state dir %s", id, netns, root)
		}
		if _, subnet, _ := net.ParseCIDR(n.Subnet); ip == nil || !subnet.Contains(ip) {
			t.Errorf("sandbox %.12s has ip %v, want one in %s", id, ip, n.Subnet)
		}
		// The name containerd's shim listens on, checked here so that its
		// absence after rmp means something.
		if sock := crihelp.ShimSocket(n.Address, id); !crihelp.Exists(sock) {
			t.Errorf("sandbox %.12s: no shim socket at %s", id, sock)
		}
		want := nodecheck.Expect{ContainerID: id, IfName: "eth0", TapName: "tap0", Queues: queues, NAPI: true,
			Wiring: "tc-redirect", Socket: n.Socket, Held: queues}
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
		n.Crictl("stopp", p.id)
		stopped := time.Since(start)
		if err := nodecheck.Gone(p.netns, p.want); err != nil {
			t.Errorf("after stopp of pod %d: %v", i, err)
		}
		start = time.Now()
		n.Crictl("rmp", p.id)
		removed := time.Since(start)
		t.Logf("pod %d: stopp %v, rmp %v", i, stopped.Round(time.Millisecond), removed.Round(time.Millisecond))
		if err := nodecheck.Gone(p.netns, p.want); err != nil {
			t.Errorf("after rmp of pod %d: %v", i, err)
		}
		if crihelp.Exists(p.netns) {
			t.Errorf("pod %d netns file %s is still there after rmp", i, p.netns)
		}
		if sock := crihelp.ShimSocket(n.Address, p.id); crihelp.Exists(sock) {
			t.Errorf("pod %d shim socket %s is still there after rmp", i, sock)
		}
	}

	// The node is as it was, but for the bridge the bridge plugin keeps.
	if left := n.Crictl("pods", "-q"); left != "" {
		t.Errorf("crictl pods after rmp: %q", left)
	}
	if links := crihelp.LinkNames(t, n.NetNS); strings.Join(links, " ") != "lo napicri0" {
		t.Errorf("node netns links after rmp: %v, want only lo and napicri0", links)
	}
	if links := hostLinks(t); len(links) > 0 {
		t.Errorf("napicri links in the host netns: %v", links)
	}
	if netnsDir := filepath.Join(root, "state", "io.containerd.grpc.v1.cri", "netns"); len(crihelp.ListDir(netnsDir)) > 0 {
		t.Errorf("pod netns files left in %s: %v", netnsDir, crihelp.ListDir(netnsDir))
	}
	if left := crihelp.AttachmentStates(n.StateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", n.StateDir, left)
	}
	if atts, err := (&handoff.Client{Socket: n.Socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("napitapd after rmp holds %+v (%v), want nothing", atts, err)
	}
	if pids := crihelp.ShimsOf(n.Address); len(pids) > 0 {
		t.Errorf("shims still running after rmp: %v", pids)
	}
}

// writePodConfig writes the PodSandboxConfig crictl runp sends, with the
// pod's cgroups under the test's napicri-* parent and its logs in the
// temp dir.
func writePodConfig(t *testing.T, n *crihelp.Node, i, queues int) string {
	t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{
			"name":      fmt.Sprintf("napicri-q%d", queues),
			"namespace": "napicri",
			"uid":       fmt.Sprintf("napicri-%s-%d", filepath.Base(n.Root), i),
			"attempt":   0,
		},
		"hostname":      fmt.Sprintf("napicri-%d", i),
		"log_directory": filepath.Join(n.Root, "logs", fmt.Sprint(i)),
		"linux":         map[string]any{"cgroup_parent": n.Cgroup},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(n.Root, fmt.Sprintf("pod-%d.json", i))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// inspectPod returns the sandbox's netns path, from the OCI spec containerd
// ran it with, and its IP as the CRI reports it.
func inspectPod(t *testing.T, n *crihelp.Node, id string) (string, net.IP) {
	t.Helper()
	sb, err := n.InspectSandbox(id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "SANDBOX_READY" {
		t.Errorf("sandbox %.12s state %s, want SANDBOX_READY", id, sb.State)
	}
	return sb.NetNS, sb.IP
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
