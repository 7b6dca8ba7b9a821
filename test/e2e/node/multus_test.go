package node

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/katadan"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
	"github.com/vishvananda/netlink"
)

// Multus on the node: the thin plugin is the node's one CNI config, with
// the cluster default network (bridge + host-local) as its delegate, and
// reads the pods' network selections and their NetworkAttachmentDefinitions
// from the test's apiserver with a kubeconfig of its own.
const (
	multusVersion = "v4.2.2"
	// multusSubnet is the default network's: none of the shipped examples'
	// subnets, which a pod on them holds next to it.
	multusSubnet = "10.196.0.0/24"
	// The annotations of the Network Plumbing Working Group's spec.
	networksAnnotation      = "k8s.v1.cni.cncf.io/networks"
	networkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"
)

// nadCRD is the NetworkAttachmentDefinition CRD as the Network Plumbing
// Working Group's spec defines it (k8s.cni.cncf.io/v1, namespaced,
// spec.config a CNI config as a string).
const nadCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: network-attachment-definitions.k8s.cni.cncf.io
spec:
  group: k8s.cni.cncf.io
  scope: Namespaced
  names:
    plural: network-attachment-definitions
    singular: network-attachment-definition
    kind: NetworkAttachmentDefinition
    shortNames: [net-attach-def]
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            properties:
              config: {type: string}
`

// multusRBAC is what the Multus thin plugin does with its kubeconfig: read
// pods and NADs, write the pod's network-status, record events.
const multusRBAC = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: napitap-e2e-multus
rules:
- apiGroups: ["k8s.cni.cncf.io"]
  resources: ["*"]
  verbs: ["*"]
- apiGroups: [""]
  resources: ["pods", "pods/status"]
  verbs: ["get", "list", "update", "watch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: napitap-e2e-multus
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: napitap-e2e-multus
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: napitap-e2e-multus
`

// multusNode is what the node's Multus sees at the node-wide paths the
// shipped NADs imply (they name no socket, no DAN dir, no IPAM data dir):
// dirs of the test's, bind-mounted there in a mount namespace of Multus'
// own, which every plugin it delegates to inherits. The machine's own
// /run/napitap (a real napitapd's, or the demo's) stays untouched.
type multusNode struct {
	napitapd string // at /run/napitap: the test napitapd's sockets
	kataDans string // at /run/kata-containers/dans
	varLib   string // at /var/lib/cni: Multus' cache, host-local's leases
	log      string
	// stage holds napitapd's dir and /run/netns while a tmpfs covers
	// /run: the DaemonSet's napitapd serves the machine's /run/napitap.
	stage string
}

func newMultusNode(root string) multusNode {
	return multusNode{
		napitapd: filepath.Join(root, "napitapd"), // crihelp.Start's napitapd dir
		kataDans: filepath.Join(root, "kata-dans"),
		varLib:   filepath.Join(root, "var-lib-cni"),
		log:      filepath.Join(root, "multus.log"),
		stage:    filepath.Join(root, "multus-stage"),
	}
}

// buildMultus runs multus.sh, which builds only what is missing or stale.
func buildMultus(t *testing.T) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("bash", "multus.sh", "--path")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("multus.sh: %v", err)
	}
	t.Logf("multus.sh (Multus %s): %v", multusVersion, time.Since(start).Round(time.Millisecond))
	return filepath.Join(strings.TrimSpace(string(out)), "multus")
}

// startMultusCluster is startClusterWith with Multus as the node's CNI config
// and the NetworkAttachmentDefinition CRD installed.
func startMultusCluster(t *testing.T, cfg crihelp.Config, opts clusterOpts) *cluster {
	t.Helper()
	multus := buildMultus(t)
	cfg.Conflist = multusConflist
	c := startClusterWith(t, cfg, opts)
	mn := newMultusNode(c.root)
	mn.napitapd = filepath.Dir(c.node.Socket) // the test's napitapd's, or the DaemonSet's /run/napitap
	for _, d := range []string{mn.kataDans, mn.varLib} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c.writeMultusWrapper(multus, mn)

	client := c.pki.client(t, "multus-client", "napitap-e2e-multus")
	kubeconfig := c.pki.kubeconfig(t, "multus", fmt.Sprintf("https://%s:%d", nodeIP, apiPort), client)
	if want := multusKubeconfig(c.node); kubeconfig != want {
		t.Fatalf("Multus' kubeconfig is %s, its config names %s", kubeconfig, want)
	}
	c.apply(multusRBAC)
	c.apply(nadCRD)
	c.kubectlMust("wait", "--for=condition=Established", "--timeout=60s", "crd/network-attachment-definitions.k8s.cni.cncf.io")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(mn.log)
			t.Logf("Multus log (last 6000 bytes):\n%s", crihelp.Tail(string(b), 6000))
		}
	})
	return c
}

func multusKubeconfig(n *crihelp.Node) string {
	return filepath.Join(n.Root, "pki", "multus.kubeconfig")
}

// multusConflist is the node's CNI config: Multus, whose delegate is the
// cluster default network, bridge + host-local (its leases in the temp
// dir, where ipamEntries reads them).
func multusConflist(n *crihelp.Node) string {
	deflt := map[string]any{
		"cniVersion": "1.0.0",
		"name":       n.NetworkName(),
		"plugins": []any{map[string]any{
			"type": "bridge", "bridge": n.NetworkName() + "0", "isGateway": true,
			"ipam": map[string]any{"type": "host-local", "subnet": n.Subnet, "dataDir": filepath.Join(n.Root, "cni", "ipam")},
		}},
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "multus-cni-network",
		"plugins": []any{map[string]any{
			"type":       "multus",
			"kubeconfig": multusKubeconfig(n),
			"binDir":     n.BinLinks,
			"logFile":    newMultusNode(n.Root).log,
			"logLevel":   "verbose",
			"delegates":  []any{deflt},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		panic(err)
	}
	return string(b)
}

// writeMultusWrapper puts "multus" into the node's CNI bin dir: a script
// that runs the Multus binary in a mount namespace of its own (private, so
// nothing propagates to the machine) with a tmpfs on /run and mn's dirs at
// the node-wide paths.
func (c *cluster) writeMultusWrapper(multus string, mn multusNode) {
	t := c.t
	var tools []string
	for _, tool := range []string{"unshare", "mount", "mkdir", "sh"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		tools = append(tools, p)
	}
	unshare, mount, mkdir, sh := tools[0], tools[1], tools[2], tools[3]
	// /var/lib/cni is a mount point on the machine: containerd keeps its
	// CNI result cache there anyway (as on any node).
	if err := os.MkdirAll("/var/lib/cni", 0o755); err != nil {
		t.Fatal(err)
	}
	// napitapd's dir and the pod netns files (/run/netns, where a default
	// containerd makes them, as on the DaemonSet's nodes) stay visible
	// under the tmpfs: staged, then bound back.
	stageNapitapd, stageNetns := filepath.Join(mn.stage, "napitapd"), filepath.Join(mn.stage, "netns")
	for _, d := range []string{stageNapitapd, stageNetns} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	inner := strings.Join([]string{
		"set -e",
		mount + " --bind " + shellQuote(mn.napitapd) + " " + shellQuote(stageNapitapd),
		"if [ -d /run/netns ]; then " + mount + " --rbind /run/netns " + shellQuote(stageNetns) + "; fi",
		mount + " -t tmpfs napitap-e2e-run /run",
		mkdir + " -p /run/napitap /run/kata-containers/dans /run/netns",
		mount + " --bind " + shellQuote(stageNapitapd) + " /run/napitap",
		mount + " --rbind " + shellQuote(stageNetns) + " /run/netns",
		mount + " --bind " + shellQuote(mn.kataDans) + " /run/kata-containers/dans",
		mount + " --bind " + shellQuote(mn.varLib) + " /var/lib/cni",
		`exec "$@"`,
	}, "\n")
	script := fmt.Sprintf("#!%s\n# Multus with the test's dirs at the node-wide paths (multus_test.go).\nexec %s --mount --propagation private -- %s -c %s multus %s \"$@\"\n",
		sh, unshare, sh, shellQuote(inner), shellQuote(multus))
	if err := os.WriteFile(filepath.Join(c.node.BinLinks, "multus"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// kubeVirtPodIfName is the pod interface KubeVirt has Multus make for a
// secondary network of a VMI: "pod" and the first 11 hex digits of the
// SHA-256 of the VMI's network name (kubevirt pkg/network/namescheme).
func kubeVirtPodIfName(network string) string {
	sum := sha256.Sum256([]byte(network))
	return "pod" + hex.EncodeToString(sum[:])[:11]
}

// kubeVirtTapName is the tap KubeVirt looks for on a pod interface: "tap"
// and the name without its first three letters (kubevirt pkg/network/link).
func kubeVirtTapName(podIfName string) string { return "tap" + podIfName[3:] }

// networkStatus is one entry of a pod's network-status annotation.
type networkStatus struct {
	Name      string   `json:"name"`
	Interface string   `json:"interface"`
	IPs       []string `json:"ips"`
	Mac       string   `json:"mac"`
	Default   bool     `json:"default"`
}

// multusPod is one pod on a napitap network, as Multus attaches it.
type multusPod struct {
	pod
	nad    string // its name, in podNamespace
	want   nodecheck.Expect
	subnet string // of the guest NIC's address; empty: none
	status []networkStatus
}

// TestMultusAttachesTheShippedNetworks runs the shipped
// NetworkAttachmentDefinitions through a real Multus on a real kubelet,
// served by the shipped DaemonSet's napitapd (no napitapd of the test's):
// `kubectl apply -k deploy/examples` (the example pod placed by the
// scheduler) and the KubeVirt and Kata NADs, and pods that select
// them in k8s.v1.cni.cncf.io/networks. Each pod gets its tap with the
// NAD's settings, its cni-args reaching the tap, and a network-status that
// names the guest NIC with napitap's MAC and addresses; a KubeVirt pod
// interface gets the tap KubeVirt looks for; a NAD deleted under its pod
// does not keep the pod from going, and kubectl delete leaves nothing.
func TestMultusAttachesTheShippedNetworks(t *testing.T) {
	testStart := time.Now()
	repo, err := crihelp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := startDaemonSetCluster(t, crihelp.Config{Name: "napimultus", Subnet: multusSubnet})
	n := c.node
	mn := newMultusNode(c.root)
	_, ds := c.deployDaemonSet(repo)
	if pid, err := socketServer(n.Socket); err != nil || pid != ds.pid {
		t.Fatalf("%s is served by pid %d (%v), want the DaemonSet pod's napitapd, pid %d", n.Socket, pid, err, ds.pid)
	}

	// The shipped examples, as a user applies them: no test copies.
	examples := filepath.Join(repo, "deploy", "examples")
	example := c.examplePod(examples)
	c.importWaitImage(example.image)
	c.kubectlMust("apply", "-n", podNamespace, "-k", examples)
	c.kubectlMust("apply", "-n", podNamespace, "-f", filepath.Join(repo, "deploy", "kubevirt", "nad.yaml"),
		"-f", filepath.Join(repo, "deploy", "kata", "nad.yaml"), "-f", filepath.Join(repo, "deploy", "kata", "nad-multiqueue.yaml"))
	// The KubeVirt VM's own network, from the file that holds it with the
	// VM (this API server has no KubeVirt kinds).
	vmNAD := filepath.Join(c.root, "vm-nad.yaml")
	if err := os.WriteFile(vmNAD, []byte(nadDocuments(t, filepath.Join(repo, "deploy", "kubevirt", "vm.yaml"))), 0o644); err != nil {
		t.Fatal(err)
	}
	c.kubectlMust("apply", "-n", podNamespace, "-f", vmNAD)
	t.Logf("NADs: %s", c.kubectlMust("get", "-n", podNamespace, "network-attachment-definitions", "-o", "name"))
	c.publishRootCA()

	kubevirtIf := kubeVirtPodIfName("napitap")
	pods := []*multusPod{
		{pod: pod{name: example.name}, nad: "napitap-bridge", subnet: "10.198.0.0/24",
			want: nodecheck.Expect{IfName: "net1", TapName: "tap1", Queues: 8, NAPI: true, Wiring: "tc-redirect", Held: 8}},
		{pod: pod{name: "vm-standalone"}, nad: "napitap-standalone", subnet: "10.199.0.0/24",
			want: nodecheck.Expect{IfName: "net1", TapName: "net1", Queues: 2, NAPI: true, Wiring: "none", Held: 2}},
		{pod: pod{name: "vm-kubevirt"}, nad: "napitap-kubevirt",
			want: nodecheck.Expect{IfName: kubevirtIf, TapName: kubeVirtTapName(kubevirtIf), Queues: 4, NAPI: true, Wiring: "tc-redirect", Held: 0}},
		// Its tap is in the node's netns, named when the sandbox is known
		// (waitMultusPod).
		{pod: pod{name: "vm-kata"}, nad: "napitap-kata", subnet: "10.197.0.0/24",
			want: nodecheck.Expect{IfName: "net1", Queues: 1, NAPI: true, Wiring: "node-bridge", Bridge: "napitap1", NodeNetns: c.node.NetNS.Path(), Held: 0}},
		{pod: pod{name: "vm-kata-mq"}, nad: "napitap-kata-mq", subnet: "10.196.0.0/24",
			want: nodecheck.Expect{IfName: "net1", Queues: 2, NAPI: true, Wiring: "node-bridge", Bridge: "napitap2", NodeNetns: c.node.NetNS.Path(), Held: 0}},
		{pod: pod{name: "vm-kubevirt-vm1"}, nad: "napitap-vm1", subnet: "10.192.0.10/32",
			want: nodecheck.Expect{IfName: kubevirtIf, TapName: kubeVirtTapName(kubevirtIf), Queues: 4, NAPI: true, Wiring: "tc-redirect", Held: 0}},
	}
	for _, p := range pods[1:] {
		c.apply(c.multusManifest(p.name, fmt.Sprintf(`[{"name":%q,"interface":%q}]`, p.nad, p.want.IfName)))
	}
	for _, p := range pods {
		c.waitMultusPod(p)
	}
	if t.Failed() {
		return
	}

	checkDAN := func(t *testing.T, p *multusPod) {
		b, err := os.ReadFile(katadan.Path(mn.kataDans, p.sandbox))
		var f katadan.File
		if err == nil {
			err = json.Unmarshal(b, &f)
		}
		if err != nil || len(f.Devices) != 1 || f.Devices[0].Device.TapName != p.want.TapName || f.Devices[0].Device.QueueNum != p.want.Queues ||
			f.Devices[0].GuestMAC != attachmentOf(t, n, p.sandbox, p.want.IfName).MAC {
			t.Errorf("pod %s: DAN file %s: %s (%v), want one device, %s with %d queues", p.name, katadan.Path(mn.kataDans, p.sandbox), b, err, p.want.TapName, p.want.Queues)
		}
	}
	checks := []struct {
		name  string
		pod   *multusPod
		check func(t *testing.T, p *multusPod)
	}{
		{"the example pod's cni-args give its tap 8 queues and threaded NAPI", pods[0], func(t *testing.T, p *multusPod) {
			attrs, err := tapsetup.ReadSysfs(p.netns, p.want.TapName)
			if err != nil || !attrs.Threaded {
				t.Errorf("pod %s: %s threaded %+v (%v), want on (cni-args threadedNapi)", p.name, p.want.TapName, attrs, err)
			}
		}},
		{"a standalone pod's tap is its net1, with host-local's address on it", pods[1], func(*testing.T, *multusPod) {}},
		{"a KubeVirt pod interface gets the tap KubeVirt looks for", pods[2], func(*testing.T, *multusPod) {}},
		{"a Kata pod's tap is in the node's netns and the sandbox's DAN file, one queue", pods[3], checkDAN},
		{"a multiqueue Kata pod's tap is in the node's netns and the sandbox's DAN file, 2 queues", pods[4], checkDAN},
		{"the KubeVirt VM's network gives its guest the address its cloud-init sets, and the node's bridge the gateway", pods[5], func(t *testing.T, p *multusPod) {
			var addrs []string
			err := c.node.NetNS.Do(func(ns.NetNS) error {
				link, err := netlink.LinkByName("napitap3")
				if err != nil {
					return err
				}
				list, err := netlink.AddrList(link, netlink.FAMILY_V4)
				for _, a := range list {
					addrs = append(addrs, a.IPNet.String())
				}
				return err
			})
			if err != nil || !slices.Contains(addrs, "10.192.0.1/24") {
				t.Errorf("napitap3 in the node's netns: %v (%v), want the gateway 10.192.0.1/24", addrs, err)
			}
		}},
	}
	for _, tc := range checks {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.pod
			if err := nodecheck.Present(p.netns, p.want); err != nil {
				t.Fatalf("pod %s: %v", p.name, err)
			}
			c.checkNetworkStatus(t, p)
			tc.check(t, p)
		})
	}

	// A NAD deleted under its pod: Multus deletes with the config it
	// cached at ADD.
	c.kubectlMust("delete", "-n", podNamespace, "network-attachment-definition", pods[1].nad)
	start := time.Now()
	c.kubectlMust(append([]string{"delete", "pod", "-n", podNamespace, "--wait", "--timeout=120s"}, multusNames(pods)...)...)
	t.Logf("kubectl delete of %d pods (%s's NAD deleted before): %v", len(pods), pods[1].name, time.Since(start).Round(time.Millisecond))
	for _, p := range pods {
		if err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(p.netns, p.want) }); err != nil {
			t.Errorf("pod %s after kubectl delete: %v", p.name, err)
		}
	}
	if atts, err := (&handoff.Client{Socket: n.Socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("napitapd after the pods went holds %+v (%v), want nothing", atts, err)
	}
	if left := crihelp.ListDir(mn.kataDans); len(left) > 0 {
		t.Errorf("DAN files left: %v", left)
	}
	for _, nad := range []string{"napitap-bridge", "napitap-standalone", "napitap-kata", "napitap-kata-mq"} {
		if left := leases(t, filepath.Join(mn.varLib, "networks", nad)); len(left) > 0 {
			t.Errorf("host-local still holds %v on %s", left, nad)
		}
	}
	if left := ipamEntries(t, n); len(left) > 0 {
		t.Errorf("host-local still holds %v on the default network", left)
	}
	// The bridges stay, as on a node: the default network's and the NADs'.
	if links, want := crihelp.LinkNames(t, n.NetNS), "lo napimultus0 napitap0 napitap1 napitap2 napitap3"; strings.Join(links, " ") != want {
		t.Errorf("node netns links after the pods went: %v, want %s", links, want)
	}
	t.Logf("whole run: %v", time.Since(testStart).Round(time.Second))
}

func multusNames(pods []*multusPod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.name)
	}
	return out
}

// exampleObject is the example pod of deploy/examples as kustomize
// renders it.
type exampleObject struct{ name, image string }

// examplePod renders deploy/examples with kubectl's kustomize and returns
// its one pod.
func (c *cluster) examplePod(dir string) exampleObject {
	t := c.t
	t.Helper()
	out := c.kubectlMust("kustomize", dir)
	path := filepath.Join(c.root, "examples.yaml")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	// One JSON object after another, as kubectl prints several.
	dec := json.NewDecoder(strings.NewReader(c.kubectlMust("create", "--dry-run=client", "-o", "json", "-f", path)))
	var pods []exampleObject
	for dec.More() {
		var o struct {
			Kind     string
			Metadata struct{ Name string }
			Spec     struct{ Containers []struct{ Image string } }
		}
		if err := dec.Decode(&o); err != nil {
			t.Fatalf("deploy/examples as kubectl reads it: %v", err)
		}
		if o.Kind == "Pod" && len(o.Spec.Containers) == 1 {
			pods = append(pods, exampleObject{o.Metadata.Name, o.Spec.Containers[0].Image})
		}
	}
	if len(pods) != 1 {
		t.Fatalf("deploy/examples has pods %+v, want one with one container", pods)
	}
	return pods[0]
}

// importWaitImage gives the node an image of ref whose only program is
// napitapctl at the path napitap's image has it: what the example pod runs
// of napitap's image (napitapctl wait), which this node cannot pull.
func (c *cluster) importWaitImage(ref string) {
	t := c.t
	t.Helper()
	bin, err := os.ReadFile(filepath.Join(binDir, "napitapctl"))
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(c.root, "wait-image.tar")
	entries := []crihelp.ImageEntry{
		{Name: "usr", Dir: true, Mode: 0o755}, {Name: "usr/local", Dir: true, Mode: 0o755}, {Name: "usr/local/bin", Dir: true, Mode: 0o755},
		{Name: "usr/local/bin/napitapctl", Data: bin, Mode: 0o755},
	}
	if err := crihelp.WriteImageArchive(archive, ref, []string{"/usr/local/bin/napitapctl", "wait"}, entries); err != nil {
		t.Fatal(err)
	}
	c.node.ImportImage(archive, ref)
}

// publishRootCA makes the namespace's kube-root-ca.crt ConfigMap, as
// kube-controller-manager (not running here) would: the example pod mounts
// a service account token, whose projected volume holds it.
func (c *cluster) publishRootCA() {
	t := c.t
	t.Helper()
	ca, err := os.ReadFile(c.pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	cm, err := json.Marshal(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "kube-root-ca.crt", "namespace": podNamespace},
		"data":     map[string]any{"ca.crt": string(ca)},
	})
	if err != nil {
		t.Fatal(err)
	}
	c.apply(string(cm))
}

// multusManifest is manifest's pod with a network selection.
func (c *cluster) multusManifest(name, networks string) string {
	m := c.manifest(name, 0)
	return strings.Replace(m, "  annotations:\n", fmt.Sprintf("  annotations:\n    %s: '%s'\n", networksAnnotation, networks), 1)
}

// waitMultusPod waits until the pod is Ready and fills in its sandbox,
// netns, IP and network-status, and what nodecheck asks of its tap.
func (c *cluster) waitMultusPod(p *multusPod) {
	t := c.t
	t.Helper()
	start := time.Now()
	st := c.waitReady(&p.pod, "120s")
	p.want.ContainerID, p.want.Socket = p.sandbox, c.node.Socket
	if p.want.Wiring == config.WiringNodeBridge {
		p.want.TapName = config.NodeTapName(p.sandbox, p.want.IfName)
	}
	raw := st.Metadata.Annotations[networkStatusAnnotation]
	if err := json.Unmarshal([]byte(raw), &p.status); err != nil {
		t.Errorf("pod %s: %s %q: %v", p.name, networkStatusAnnotation, raw, err)
	}
	att := attachmentOf(t, c.node, p.sandbox, p.want.IfName)
	t.Logf("pod %s: Running in %v, sandbox %.12s, pod IP %s; NAD %s (%s %s): tap %s, %d queues, NAPI %v, wiring %s, %d held by napitapd, guest MAC %s",
		p.name, time.Since(start).Round(time.Millisecond), p.sandbox, p.ip, p.nad, networksAnnotation, st.Metadata.Annotations[networksAnnotation],
		att.TapName, att.Queues, att.NAPI, att.Wiring, att.Held, att.MAC)
	for _, s := range p.status {
		t.Logf("pod %s: network-status %+v", p.name, s)
	}
}

// checkNetworkStatus: Multus wrote the default network's eth0 with the pod
// IP and, for the NAD, the interface napitap's result gives the guest: for
// a chained wiring the guest NIC, the result's last interface, with the MAC
// napitapd gives the guest and the address IPAM gave it; for wiring
// "none" the tap itself (the pod's net1) with its own MAC and address.
func (c *cluster) checkNetworkStatus(t *testing.T, p *multusPod) {
	t.Helper()
	mac := attachmentOf(t, c.node, p.sandbox, p.want.IfName).MAC
	if p.want.Wiring == "none" {
		tap, err := tapsetup.Inspect(p.netns, p.want.TapName)
		if err != nil {
			t.Fatal(err)
		}
		mac = tap.Link.Attrs().HardwareAddr.String()
	}
	nad := podNamespace + "/" + p.nad
	var deflt, guest *networkStatus
	for i, s := range p.status {
		switch {
		case s.Default && s.Interface == "eth0":
			deflt = &p.status[i]
		case s.Name == nad && s.Interface == p.want.IfName && s.Mac == mac:
			guest = &p.status[i] // the last: a chained result lists the pod's own interface first
		}
	}
	if deflt == nil || deflt.Name != c.node.NetworkName() || len(deflt.IPs) != 1 || deflt.IPs[0] != p.ip.String() {
		t.Errorf("pod %s: network-status %+v has no default eth0 of %s with the pod IP %s", p.name, p.status, c.node.NetworkName(), p.ip)
	}
	if mac == "" || guest == nil {
		t.Fatalf("pod %s: network-status %+v names no %s of %s with MAC %q", p.name, p.status, p.want.IfName, nad, mac)
	}
	if p.subnet == "" {
		if len(guest.IPs) != 0 {
			t.Errorf("pod %s: network-status %+v: addresses on a network without IPAM", p.name, *guest)
		}
		return
	}
	_, subnet, _ := net.ParseCIDR(p.subnet)
	if len(guest.IPs) != 1 || !subnet.Contains(net.ParseIP(guest.IPs[0])) {
		t.Errorf("pod %s: network-status %+v, want one address in %s", p.name, *guest, p.subnet)
	}
}

// leases lists the addresses host-local holds in dataDir.
func leases(t *testing.T, dataDir string) []string {
	t.Helper()
	var out []string
	for name := range crihelp.ListDir(dataDir) {
		if net.ParseIP(name) != nil {
			out = append(out, name)
		}
	}
	return out
}

// nadDocuments is the NetworkAttachmentDefinitions of a manifest file,
// alone, for an API server that would refuse its other kinds.
func nadDocuments(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var nads []string
	for _, doc := range strings.Split(string(b), "\n---\n") {
		if strings.Contains(doc, "\nkind: NetworkAttachmentDefinition\n") {
			nads = append(nads, doc)
		}
	}
	if len(nads) == 0 {
		t.Fatalf("%s holds no NetworkAttachmentDefinition", path)
	}
	return strings.Join(nads, "\n---\n")
}
