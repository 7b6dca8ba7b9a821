package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/test/e2e/crihelp"
)

const (
	k8sVersion = "v1.37.2"
	nodeIP     = "10.194.0.1" // on the node netns' lo, outside every shipped example's subnet
	podSubnet  = "10.197.0.0/24"
	apiPort    = 6443
)

// proc is one long-running component, stopped by its PID.
type proc struct {
	name   string
	cmd    *exec.Cmd
	exited <-chan struct{}
	log    string
}

// startProc runs argv with its output in logPath. It is stopped (SIGTERM,
// then SIGKILL) when the test ends, and gets SIGTERM should the test
// binary die.
func startProc(t *testing.T, name, logPath string, argv ...string) *proc {
	t.Helper()
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: exec.Command(argv[0], argv[1:]...), log: logPath}
	p.cmd.Stdout, p.cmd.Stderr = logFile, logFile
	p.exited, err = crihelp.StartPinned(p.cmd, func() { logFile.Close() })
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("%s log (last 5000 bytes):\n%s", name, crihelp.Tail(string(b), 5000))
		}
	})
	return p
}

func (p *proc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, and SIGKILL after 20 s, and waits for the exit.
func (p *proc) stop(t *testing.T) {
	if !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		t.Errorf("%s (pid %d) ignored SIGTERM for 20s: killing it", p.name, p.cmd.Process.Pid)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// cluster is the control plane and the node.
type cluster struct {
	t             *testing.T
	root          string
	bin           string // build.sh's dir
	node          *crihelp.Node
	nodeName      string
	pki           *pki
	admin         string // kubeconfig
	kubelet       *proc
	kubeletArgv   []string
	kubeletRoot   string // its --root-dir: Localhost seccomp profiles live in its seccomp/
	kubeletStarts int
	apiLog        string
	maxPods       int // clusterOpts'
}

// startCluster runs a node as cfg says (Root, BinDir, Crictl and NetNS
// are filled in here: a node netns "napitap-node-*" holding the node IP)
// and, on it, etcd, kube-apiserver and kubelet, with podNamespace and its
// default ServiceAccount made. Everything stops, by PID, when the test
// ends.
func startCluster(t *testing.T, cfg crihelp.Config) *cluster {
	t.Helper()
	return startClusterWith(t, cfg, clusterOpts{})
}

// clusterOpts is what a cluster runs beyond startCluster's.
type clusterOpts struct {
	// seccompDir, if set, is bind-mounted on the kubelet's seccomp dir
	// (its --root-dir's seccomp/): kubelet names a Localhost profile by its
	// path there, and containerd, in the machine's mount namespace, reads
	// it, so both must find what the DaemonSet installs into the machine's
	// /var/lib/kubelet/seccomp.
	seccompDir string
	// controllers runs kube-controller-manager (the DaemonSet, garbage
	// collector and namespace controllers) and kube-scheduler: what makes
	// and places a DaemonSet's pods, and what kubectl delete of a
	// namespace or a DaemonSet waits for.
	controllers bool
	// maxPods, if set, is the kubelet's maxPods (default 110), for a test
	// that runs more pods than that beside the DaemonSet's.
	maxPods int
}

// startClusterWith is startCluster with opts.
func startClusterWith(t *testing.T, cfg crihelp.Config, opts clusterOpts) *cluster {
	t.Helper()
	nstest.RequireRoot(t)
	crihelp.RequireTools(t, "containerd", "ctr", "runc", "nsenter", "unshare", "ip", "mount")
	bin := buildK8s(t)
	cfg.Crictl = crihelp.BuildCrictl(t)
	crihelp.EnsureCgroups(t)
	cfg.Root = crihelp.NewRoot(t, cfg.Name)
	cfg.BinDir = binDir
	cfg.NetNS = nstest.New(t, "node")
	cfg.NetNS.Run(t, func() error { return addNodeIP(nodeIP) })
	n := crihelp.Start(t, cfg)
	makeCgroupRoot(t, n.Cgroup)
	c := &cluster{t: t, root: cfg.Root, bin: bin, node: n, nodeName: cfg.Name + "-" + nstest.RandomSuffix(), pki: newPKI(t, filepath.Join(cfg.Root, "pki")),
		maxPods: opts.maxPods}
	c.startEtcd()
	c.startAPIServer()
	if opts.controllers {
		c.startControllers()
	}
	c.kubeletArgv = c.kubeletCommand()
	if opts.seccompDir != "" {
		c.bindSeccompDir(opts.seccompDir)
	}
	c.startKubelet()
	t.Cleanup(n.TrackAll) // the sandboxes kubelet made, for the shim socket cleanup

	c.apply(fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
# The ServiceAccount controller (kube-controller-manager) is not running.
apiVersion: v1
kind: ServiceAccount
metadata:
  name: default
  namespace: %[1]s
`, podNamespace))
	return c
}

// buildK8s runs build.sh, which builds only what is missing or stale.
func buildK8s(t *testing.T) string {
	t.Helper()
	start := time.Now()
	cmd := exec.Command("bash", "build.sh", "--path")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build.sh: %v", err)
	}
	t.Logf("build.sh (Kubernetes %s, etcd): %v", k8sVersion, time.Since(start).Round(time.Millisecond))
	return strings.TrimSpace(string(out))
}

// inNode returns argv run in the node netns (nsenter --net only, as for
// containerd: `ip netns exec` would remount /sys).
func (c *cluster) inNode(argv ...string) []string {
	return append([]string{"nsenter", "--net=" + c.node.NetNS.Path(), "--"}, argv...)
}

// startEtcd runs a one-member etcd on the node netns' loopback.
func (c *cluster) startEtcd() {
	t := c.t
	start := time.Now()
	data := filepath.Join(c.root, "etcd")
	startProc(t, "etcd", filepath.Join(c.root, "etcd.log"), c.inNode(filepath.Join(c.bin, "etcd"),
		"--name", "napinode", "--data-dir", data,
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "napinode=http://127.0.0.1:2380", "--initial-cluster-state", "new",
		"--unsafe-no-fsync", "--log-level", "warn")...)
	err := crihelp.Poll(30*time.Second, func() error { return c.dial("127.0.0.1:2379") })
	if err != nil {
		t.Fatalf("etcd: %v", err)
	}
	t.Logf("etcd up in %v", time.Since(start).Round(time.Millisecond))
}

// dial connects to addr from the node netns.
func (c *cluster) dial(addr string) error {
	return c.node.NetNS.Do(func(ns.NetNS) error {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	})
}

// startAPIServer runs kube-apiserver on the node netns (all addresses),
// with Node+RBAC authorization and NodeRestriction, as kubeadm would.
func (c *cluster) startAPIServer() {
	t := c.t
	start := time.Now()
	serving := c.pki.serving(t, "apiserver", "kube-apiserver",
		[]net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(nodeIP), net.ParseIP("10.0.0.1")},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	kubeletClient := c.pki.client(t, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters")
	saPub, saKey := c.pki.serviceAccountKeys(t)
	c.apiLog = filepath.Join(c.root, "kube-apiserver.log")
	startProc(t, "kube-apiserver", c.apiLog, c.inNode(filepath.Join(c.bin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address=0.0.0.0", "--secure-port="+strconv.Itoa(apiPort), "--advertise-address="+nodeIP,
		"--tls-cert-file="+serving.Cert, "--tls-private-key-file="+serving.Key,
		"--client-ca-file="+c.pki.CAFile,
		"--kubelet-client-certificate="+kubeletClient.Cert, "--kubelet-client-key="+kubeletClient.Key,
		"--kubelet-preferred-address-types=InternalIP", // no DNS in the node netns
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file="+saPub,
		"--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true", "--profiling=false", "--cert-dir="+filepath.Join(c.root, "apiserver-certs"),
		"--v=1")...)
	admin := c.pki.client(t, "admin", "napitap-e2e-admin", "system:masters")
	c.admin = c.pki.kubeconfig(t, "admin", fmt.Sprintf("https://127.0.0.1:%d", apiPort), admin)
	var out string
	err := crihelp.Poll(120*time.Second, func() (err error) {
		out, err = c.kubectl("get", "--raw", "/readyz")
		return err
	})
	if err != nil {
		t.Fatalf("kube-apiserver not ready: %v", err)
	}
	t.Logf("kube-apiserver %s ready in %v: /readyz %s", k8sVersion, time.Since(start).Round(time.Millisecond), out)
}

// startControllers runs kube-controller-manager, with only the
// controllers a DaemonSet's life needs, and kube-scheduler, both as admin
// on the node netns' apiserver, serving nothing themselves.
func (c *cluster) startControllers() {
	t := c.t
	start := time.Now()
	startProc(t, "kube-controller-manager", filepath.Join(c.root, "kube-controller-manager.log"), c.inNode(filepath.Join(c.bin, "kube-controller-manager"),
		"--kubeconfig="+c.admin, "--controllers=daemonset,garbagecollector,namespace,nodelifecycle",
		"--leader-elect=false", "--secure-port=0", "--v=1")...)
	startProc(t, "kube-scheduler", filepath.Join(c.root, "kube-scheduler.log"), c.inNode(filepath.Join(c.bin, "kube-scheduler"),
		"--kubeconfig="+c.admin, "--leader-elect=false", "--secure-port=0", "--v=1")...)
	t.Logf("kube-controller-manager (daemonset, garbagecollector, namespace, nodelifecycle) and kube-scheduler started in %v", time.Since(start).Round(time.Millisecond))
}

// bindSeccompDir bind-mounts dir on the kubelet's seccomp dir before
// kubelet starts, so that kubelet's mount namespace has it too.
func (c *cluster) bindSeccompDir(dir string) {
	t := c.t
	target := filepath.Join(c.kubeletRoot, "seccomp")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(dir, target, "", syscall.MS_BIND, ""); err != nil {
		t.Fatalf("bind %s on the kubelet's seccomp dir %s: %v", dir, target, err)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(target, syscall.MNT_DETACH); err != nil {
			t.Errorf("umount %s: %v", target, err)
		}
	})
}

// kubectl runs kubectl in the node netns as admin, bounded.
func (c *cluster) kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := c.inNode(append([]string{filepath.Join(c.bin, "kubectl"), "--kubeconfig", c.admin}, args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

func (c *cluster) kubectlMust(args ...string) string {
	c.t.Helper()
	out, err := c.kubectl(args...)
	if err != nil {
		c.t.Fatal(err)
	}
	return out
}

// kubeletSysctls are the kernel settings kubelet makes as it wants them
// unless protectKernelDefaults (pkg/kubelet/cm setupKernelTunables): all
// machine-wide, and kernel.panic_on_oops=1 would turn any oops on a shared
// machine into a reboot.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// kubeletCommand writes the kubelet's kubeconfig, certs and
// KubeletConfiguration, and the script that starts it in a mount namespace
// of its own; it returns the command line.
func (c *cluster) kubeletCommand() []string {
	t := c.t
	dir := filepath.Join(c.root, "kubelet")
	for _, d := range []string{dir, filepath.Join(dir, "varlog"), filepath.Join(dir, "varlib"), filepath.Join(dir, "sysctl"), filepath.Join(dir, "pod-logs"), filepath.Join(dir, "volume-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	client := c.pki.client(t, "kubelet-client", "system:node:"+c.nodeName, "system:nodes")
	kubeconfig := c.pki.kubeconfig(t, "kubelet", fmt.Sprintf("https://%s:%d", nodeIP, apiPort), client)
	serving := c.pki.serving(t, "kubelet-serving", c.nodeName, []net.IP{net.ParseIP(nodeIP), net.ParseIP("127.0.0.1")}, []string{c.nodeName})
	cfg := map[string]any{
		"kind":       "KubeletConfiguration",
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": false},
			"x509":      map[string]any{"clientCAFile": c.pki.CAFile},
		},
		"authorization":               map[string]any{"mode": "AlwaysAllow"},
		"tlsCertFile":                 serving.Cert,
		"tlsPrivateKeyFile":           serving.Key,
		"containerRuntimeEndpoint":    "unix://" + c.node.Address,
		"imageServiceEndpoint":        "unix://" + c.node.Address,
		"cgroupDriver":                "cgroupfs",
		"cgroupRoot":                  c.node.Cgroup,
		"cgroupsPerQOS":               true,
		"failSwapOn":                  false,
		"failCgroupV1":                false,
		"protectKernelDefaults":       false,
		"oomScoreAdj":                 0,
		"podLogsDir":                  filepath.Join(dir, "pod-logs"),
		"volumePluginDir":             filepath.Join(dir, "volume-plugins"),
		"resolvConf":                  "",
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 10248,
		"readOnlyPort":                0,
		"staticPodPath":               "",
		"registerNode":                true,
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"evictionHard": map[string]string{
			"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%",
		},
		"nodeStatusUpdateFrequency": "5s",
		"syncFrequency":             "20s",
		"fileCheckFrequency":        "20s",
		"shutdownGracePeriod":       "0s",
	}
	if c.maxPods > 0 {
		cfg["maxPods"] = c.maxPods
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "config.json")
	if err := os.WriteFile(config, b, 0o644); err != nil {
		t.Fatal(err)
	}

	// The mount namespace: /var/log and /var/lib of the test's own (kubelet
	// keeps its /var/log/containers links, and its device-plugin socket
	// in /var/lib/kubelet whatever --root-dir says), and the kernel
	// settings kubelet wants read from files saying so. Only the settings
	// the machine does not have already are masked.
	script := "set -e\nmount --bind " + shellQuote(filepath.Join(dir, "varlog")) + " /var/log\n" +
		"mount --bind " + shellQuote(filepath.Join(dir, "varlib")) + " /var/lib\n"
	for name, want := range kubeletSysctls {
		path := "/proc/sys/" + name
		have, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("kubelet reads %s: %v", path, err)
		}
		if strings.TrimSpace(string(have)) == want {
			continue
		}
		file := filepath.Join(dir, "sysctl", strings.ReplaceAll(name, "/", "."))
		if err := os.WriteFile(file, []byte(want+"\n"), 0o444); err != nil {
			t.Fatal(err)
		}
		script += "mount --bind " + shellQuote(file) + " " + path + "\n"
	}
	script += `exec "$@"` + "\n"
	wrapper := filepath.Join(dir, "mountns.sh")
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	c.kubeletRoot = filepath.Join(dir, "root")
	return c.inNode("unshare", "--mount", "--propagation", "slave", "--", "sh", wrapper,
		filepath.Join(c.bin, "kubelet"),
		"--config="+config, "--kubeconfig="+kubeconfig,
		"--root-dir="+c.kubeletRoot, "--cert-dir="+filepath.Join(dir, "pki"),
		"--hostname-override="+c.nodeName, "--node-ip="+nodeIP, "--v=2")
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// startKubelet starts kubelet and waits until its node is Ready on a
// status this kubelet posted (after a restart the old Ready stays: no
// node lifecycle controller runs). Each start has a log of its own.
func (c *cluster) startKubelet() {
	t := c.t
	t.Helper()
	start := time.Now()
	c.kubeletStarts++
	name := fmt.Sprintf("kubelet (start %d)", c.kubeletStarts)
	c.kubelet = startProc(t, name, filepath.Join(c.root, fmt.Sprintf("kubelet-%d.log", c.kubeletStarts)), c.kubeletArgv...)
	var info string
	err := crihelp.Poll(120*time.Second, func() (err error) {
		if !c.kubelet.alive() {
			return errKubeletExited
		}
		info, err = c.nodeReady(start.Truncate(time.Second))
		return err
	})
	if err != nil {
		b, _ := os.ReadFile(c.kubelet.log)
		t.Fatalf("node %s not Ready: %v\n%s log:\n%s", c.nodeName, err, name, crihelp.Tail(string(b), 8000))
	}
	t.Logf("%s, pid %d: node %s Ready in %v (%s)", name, c.kubelet.cmd.Process.Pid, c.nodeName, time.Since(start).Round(time.Millisecond), info)
}

var errKubeletExited = errors.New("kubelet exited")

// nodeReady asks the apiserver whether the node is Ready with a status
// posted since since; it returns what the node says it runs.
func (c *cluster) nodeReady(since time.Time) (string, error) {
	out, err := c.kubectl("get", "node", c.nodeName, "-o", "json")
	if err != nil {
		return "", err
	}
	var node struct {
		Status struct {
			Conditions []struct {
				Type, Status, Reason, Message string
				LastHeartbeatTime             time.Time
			}
			NodeInfo struct{ KubeletVersion, ContainerRuntimeVersion, KernelVersion string }
		}
	}
	if err := json.Unmarshal([]byte(out), &node); err != nil {
		return "", err
	}
	info := fmt.Sprintf("kubelet %s, %s, kernel %s", node.Status.NodeInfo.KubeletVersion,
		node.Status.NodeInfo.ContainerRuntimeVersion, node.Status.NodeInfo.KernelVersion)
	for _, cond := range node.Status.Conditions {
		if cond.Type != "Ready" {
			continue
		}
		switch {
		case cond.Status != "True":
			return "", fmt.Errorf("Ready=%s: %s %s", cond.Status, cond.Reason, cond.Message)
		case cond.LastHeartbeatTime.Before(since):
			return "", fmt.Errorf("Ready, but last heartbeat %v is from before this kubelet", cond.LastHeartbeatTime)
		}
		return info, nil
	}
	return "", errors.New("no Ready condition yet")
}

// pod is one pod as the test made it and the node runs it.
type pod struct {
	name    string
	queues  int
	uid     string
	sandbox string
	netns   string
	ip      net.IP
}

const podNamespace = "napitap-e2e"

// manifest is a VM-like pod bound to the node: one container standing in
// for the VMM, the local pause image, nothing that needs a controller.
func (c *cluster) manifest(name string, queues int) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels:
    app: napitap-vm
  annotations:
    napitap.e2e/queues: "%d"
spec:
  nodeName: %s
  automountServiceAccountToken: false
  enableServiceLinks: false
  dnsPolicy: Default
  terminationGracePeriodSeconds: 5
  containers:
  - name: vmm
    image: %s
    imagePullPolicy: Never
`, name, podNamespace, queues, c.nodeName, crihelp.PauseRef)
}

// apply runs kubectl apply with a manifest on stdin.
func (c *cluster) apply(manifest string) {
	c.t.Helper()
	path := filepath.Join(c.root, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(manifest), 0o644); err != nil {
		c.t.Fatal(err)
	}
	c.kubectlMust("apply", "-f", path)
}

// sandboxOf finds the pod's ready sandbox through the CRI, by the pod UID
// label kubelet puts on it.
func (c *cluster) sandboxOf(uid string) ([]string, error) {
	out, err := c.node.CrictlRun("pods", "--label", "io.kubernetes.pod.uid="+uid, "-q")
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(out)), nil
}

// podStatus is the part of a pod's status the test reads.
type podStatus struct {
	Metadata struct {
		UID         string
		Annotations map[string]string
	}
	Status struct {
		Phase             string
		PodIP             string
		ContainerStatuses []struct {
			Name         string
			Ready        bool
			RestartCount int
			ContainerID  string
		}
	}
}

// waitReady waits up to timeout for pod p to be Ready, then fills in its
// uid, sandbox, netns and IP, checking that the apiserver and the CRI agree
// on the IP; it returns the pod's status.
func (c *cluster) waitReady(p *pod, timeout string) *podStatus {
	t := c.t
	t.Helper()
	if _, err := c.kubectl("wait", "-n", podNamespace, "--for=condition=Ready", "pod/"+p.name, "--timeout="+timeout); err != nil {
		c.describe(p.name)
		t.Fatal(err)
	}
	st, err := c.getPod(p.name)
	if err != nil {
		t.Fatal(err)
	}
	p.uid = st.Metadata.UID
	ids, err := c.sandboxOf(p.uid)
	if err != nil || len(ids) != 1 {
		t.Fatalf("pod %s: sandboxes %v (%v), want one", p.name, ids, err)
	}
	p.sandbox = ids[0]
	c.node.Track(p.sandbox)
	sb, err := c.node.InspectSandbox(p.sandbox)
	if err != nil {
		t.Fatal(err)
	}
	p.netns, p.ip = sb.NetNS, sb.IP
	if st.Status.PodIP != p.ip.String() {
		t.Errorf("pod %s: apiserver says IP %s, the CRI %s", p.name, st.Status.PodIP, p.ip)
	}
	return st
}

func (c *cluster) getPod(name string) (*podStatus, error) {
	out, err := c.kubectl("get", "pod", "-n", podNamespace, name, "-o", "json")
	if err != nil {
		return nil, err
	}
	var st podStatus
	return &st, json.Unmarshal([]byte(out), &st)
}
