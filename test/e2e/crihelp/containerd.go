// Package crihelp runs containerd 1.6's CRI plugin (with runc, and crun as
// a second runtime handler) and the test's own napitapd on a node netns of
// the test's own, with a CNI conf dir holding one bridge + napitap
// conflist, for the CRI e2e (driven by crictl) and the real-node e2e
// (driven by kubelet). Everything lives in one temp dir; the only things
// outside are the shim sockets containerd 1.6 always puts under
// /run/containerd/s and the pods' cgroups, which it removes.
package crihelp

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/takeover"
)

const (
	// PauseRef is the locally built pause image, the sandbox image of
	// every pod and, in the node suite, its containers' image too.
	PauseRef = "napicri.local/pause:test"
	criNS    = "k8s.io"
	shimRoot = "/run/containerd/s" // containerd 1.6 puts shim sockets here whatever its config says
)

// Config says what kind of node Start makes.
type Config struct {
	Root   string // NewRoot's temp dir: everything goes in it
	BinDir string // napitap, napitapd, pause, bridge, host-local and loopback (and static, if built)
	Crictl string // BuildCrictl's
	// NetNS is the node netns containerd serves; nil makes one
	// ("napitap-cri-node-*") that is removed when the test ends.
	NetNS *nstest.NetNS
	// Name is the CNI network's name and, with a random suffix, the pods'
	// cgroup parent's; "napicri" if empty.
	Name string
	// Bridge is the bridge plugin's bridge; Name+"0" if empty.
	Bridge string
	// Subnet is host-local's; "10.196.0.0/24" if empty.
	Subnet string
	// NapitapExtra is more JSON members for napitap's config, such as
	// `"groFlushTimeout": 200000`.
	NapitapExtra string
	// HandoffMode is napitap's handoff.mode ("fds", "intercept"); empty
	// leaves it to napitap's default.
	HandoffMode string
	// Queues is napitap's queue count in the first conflist.
	Queues int
	// Conflist, if set, makes the conf dir's one conflist instead of
	// bridge + napitap's (the real-node e2e's Multus).
	Conflist func(*Node) string
	// NapitapdDir, if set, is where another napitapd serves (the
	// DaemonSet's, /run/napitap): the node starts none of its own, and its
	// Socket and StateDir are that napitapd's.
	NapitapdDir string
	// NapitapdStateDir is that napitapd's state dir (the DaemonSet's is
	// /run/napitapd/state, outside NapitapdDir).
	NapitapdStateDir string
	// NapitapPlugin, if set, is the napitap binary the CNI bin dir links to
	// instead of BinDir's (the one the DaemonSet installs).
	NapitapPlugin string
	// NetNSUnderRun puts the pods' netns files in /var/run/netns, as a
	// default containerd does, instead of under the state dir: where a
	// napitapd in a container (the DaemonSet's hostPath) finds them.
	NetNSUnderRun bool
}

// Node is one containerd (CRI plugin + runc) serving a node netns of the
// test's own, with its CNI config, and the napitapd its napitap hands to.
type Node struct {
	t        testing.TB
	cfg      Config
	Root     string // temp dir holding everything below
	NetNS    *nstest.NetNS
	Address  string // containerd's gRPC socket
	CrictlCf string // crictl's config file
	crictl   string
	ConfDir  string // the CNI conf dir
	BinLinks string // the CNI bin dir
	Subnet   string
	Cgroup   string    // cgroup parent of the pods, "/<Name>-<suffix>"
	Socket   string    // napitapd's
	StateDir string    // napitapd's
	Napitapd *Napitapd // nil with Config.NapitapdDir
	proc     *exec.Cmd
	cfgFile  string
	exited   <-chan struct{}
	log      string
	ids      []string // every sandbox seen, for the shim socket names
	// ociBinary is what each runtime handler runs (OCIRuntimes).
	ociBinary map[string]string
}

// NewRoot makes the temp dir everything lives in (short: it holds unix
// sockets) and removes it when the test ends, unmounting first whatever
// containerd left mounted in it (pod netns files, /dev/shm, rootfs).
func NewRoot(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range MountsUnder(dir) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("umount %s: %v", m, err)
			} else {
				t.Logf("cleanup: unmounted leftover %s", m)
			}
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}

// MountsUnder lists mount points under dir, deepest first.
func MountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, unescapeMount(fields[4]))
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func unescapeMount(s string) string {
	r := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`)
	return r.Replace(s)
}

// EnsureCgroups makes sure runc finds a cgroup mount at /sys/fs/cgroup
// (v1 hierarchies or cgroup2). If there is none it mounts cgroup2 there,
// says so, and unmounts it when the test ends.
func EnsureCgroups(t testing.TB) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kinds []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		fields := strings.Fields(line)
		sep := strings.Index(line, " - ")
		if len(fields) < 5 || sep < 0 || !strings.HasPrefix(fields[4], "/sys/fs/cgroup") {
			continue
		}
		fstype := strings.Fields(line[sep+3:])[0]
		if fstype == "cgroup" || fstype == "cgroup2" {
			kinds = append(kinds, fstype+" at "+fields[4])
		}
	}
	if len(kinds) > 0 {
		t.Logf("cgroups for runc: %s", strings.Join(kinds, ", "))
		return
	}
	if err := os.MkdirAll("/sys/fs/cgroup", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""); err != nil {
		t.Fatalf("no cgroup mount at /sys/fs/cgroup and mounting cgroup2 there failed: %v", err)
	}
	t.Log("no cgroup mount at /sys/fs/cgroup: mounted cgroup2 there for runc (unmounted at the end)")
	t.Cleanup(func() {
		if err := unix.Unmount("/sys/fs/cgroup", unix.MNT_DETACH); err != nil {
			t.Errorf("umount /sys/fs/cgroup: %v", err)
		}
	})
}

// RemoveCgroups removes the pods' cgroup parent, in every hierarchy, after
// runc has removed the pods' own (or leaves them behind on failure).
func RemoveCgroups(t testing.TB, parent string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", parent))
	if fi, err := os.Stat(filepath.Join("/sys/fs/cgroup", parent)); err == nil && fi.IsDir() {
		dirs = append(dirs, filepath.Join("/sys/fs/cgroup", parent))
	}
	for _, top := range dirs {
		var all []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				all = append(all, p)
			}
			return nil
		})
		for i := len(all) - 1; i >= 0; i-- {
			if err := os.Remove(all[i]); err != nil {
				t.Errorf("rmdir cgroup %s: %v", all[i], err)
			}
		}
	}
}

const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = %[3]q

[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = %[12]t
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "runc"
        Root = %[7]q
        SystemdCgroup = false

    # crun, CRI-O's (and so OpenShift's) OCI runtime, under the same shim:
    # pods ask for it with crictl runp --runtime crun.
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.crun.options]
        BinaryName = %[11]q
        Root = %[10]q
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q
    max_conf_num = 1
    conf_template = ""
`

// Start makes the CNI bin and conf dirs, napitapd and containerd (in the
// node netns), and imports the pause image. Everything is stopped and
// removed when the test ends, failure or not.
func Start(t testing.TB, cfg Config) *Node {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "napicri"
	}
	if cfg.Bridge == "" {
		cfg.Bridge = cfg.Name + "0"
	}
	if cfg.Subnet == "" {
		cfg.Subnet = "10.196.0.0/24"
	}
	if cfg.Queues == 0 {
		cfg.Queues = 1
	}
	if cfg.NetNS == nil {
		cfg.NetNS = nstest.New(t, "cri-node")
	}
	root := cfg.Root
	n := &Node{
		t:        t,
		cfg:      cfg,
		Root:     root,
		NetNS:    cfg.NetNS,
		Address:  filepath.Join(root, "containerd.sock"),
		crictl:   cfg.Crictl,
		ConfDir:  filepath.Join(root, "cni", "conf"),
		BinLinks: filepath.Join(root, "cni", "bin"),
		Subnet:   cfg.Subnet,
		Cgroup:   "/" + cfg.Name + "-" + nstest.RandomSuffix(),
		log:      filepath.Join(root, "containerd.log"),
	}
	n.NetNS.Run(t, setLoUp)
	t.Cleanup(func() { RemoveCgroups(t, n.Cgroup) })

	// containerd 1.6 takes one CNI bin_dir: links to what the test built.
	// loopback is what containerd itself sets up lo with.
	for _, dir := range []string{n.BinLinks, n.ConfDir, filepath.Join(root, "logs")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, plugin := range []string{"napitap", "bridge", "host-local", "loopback", "static"} {
		target := filepath.Join(cfg.BinDir, plugin)
		if plugin == "napitap" && cfg.NapitapPlugin != "" {
			target = cfg.NapitapPlugin
		}
		if _, err := os.Stat(target); plugin == "static" && err != nil {
			continue // built only by suites whose networks use it
		}
		if err := os.Symlink(target, filepath.Join(n.BinLinks, plugin)); err != nil {
			t.Fatal(err)
		}
	}
	if cfg.NapitapdDir != "" {
		n.Socket, n.StateDir = filepath.Join(cfg.NapitapdDir, "napitapd.sock"), cfg.NapitapdStateDir
	} else {
		// In the node netns, as the DaemonSet's hostNetwork runs it: a Kata
		// DAN tap is there (DESIGN.md fact 18).
		d := StartNapitapd(t, filepath.Join(cfg.BinDir, "napitapd"), filepath.Join(root, "napitapd"), n.NetNS.Path())
		n.Socket, n.StateDir = d.Socket, d.StateDir
		n.Napitapd = d
	}
	n.WriteConflist(cfg.Queues)

	n.ociBinary = map[string]string{"runc": "runc", "crun": crunBinary(t, root)}
	cfgFile := filepath.Join(root, "containerd.toml")
	conf := fmt.Sprintf(containerdConfig,
		filepath.Join(root, "root"), filepath.Join(root, "state"), n.Address, n.Address+".ttrpc",
		filepath.Join(root, "opt"), PauseRef, filepath.Join(root, "runc"), n.BinLinks, n.ConfDir,
		filepath.Join(root, "crun"), n.ociBinary["crun"], !cfg.NetNSUnderRun)
	if err := os.WriteFile(cfgFile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	n.CrictlCf = filepath.Join(root, "crictl.yaml")
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%[1]s\nimage-endpoint: unix://%[1]s\ntimeout: 20\n", n.Address)
	if err := os.WriteFile(n.CrictlCf, []byte(crictlConf), 0o644); err != nil {
		t.Fatal(err)
	}

	shimsBefore := ListDir(shimRoot)
	runBefore := !Exists("/run/containerd")
	sBefore := !Exists(shimRoot)
	n.cfgFile = cfgFile
	start := time.Now()
	if err := n.startContainerd(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.teardown()
		n.cleanShimSockets(shimsBefore, runBefore, sBefore)
		if t.Failed() {
			b, _ := os.ReadFile(n.log)
			t.Logf("containerd log (last 6000 bytes):\n%s", Tail(string(b), 6000))
		}
	})

	if err := n.waitReady(20 * time.Second); err != nil {
		t.Fatalf("containerd did not get ready: %v", err)
	}
	t.Logf("containerd %s ready in %v (pid %d, node netns %s)", ContainerdVersion(), time.Since(start).Round(time.Millisecond), n.proc.Process.Pid, n.NetNS.Name)

	archive := filepath.Join(root, "pause.tar")
	if err := WritePauseArchive(archive, filepath.Join(cfg.BinDir, "pause"), PauseRef); err != nil {
		t.Fatal(err)
	}
	n.ImportImage(archive, PauseRef)
	return n
}

// ImportImage imports a docker-archive tar holding ref into the CRI's
// namespace and waits until the CRI plugin sees it.
func (n *Node) ImportImage(archive, ref string) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.Address, "-n", criNS, "images", "import", archive).CombinedOutput(); err != nil {
		n.t.Fatalf("ctr images import %s: %v: %s", archive, err, out)
	}
	// The CRI plugin learns of the image through containerd's events.
	if err := Poll(10*time.Second, func() error {
		_, err := n.CrictlRun("inspecti", ref)
		return err
	}); err != nil {
		n.t.Fatalf("image %s not visible to CRI: %v", ref, err)
	}
}

// StartPinned starts cmd with SIGTERM as its parent-death signal: should
// the test binary die (a go test timeout runs no cleanups), the process
// gets SIGTERM. The parent-death signal follows the thread that forked,
// and ns.Do ends the threads it locks, so it forks from a thread held until
// the process exits. The channel closes when it has exited and done (if
// not nil) has run.
func StartPinned(cmd *exec.Cmd, done func()) (<-chan struct{}, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	exited := make(chan struct{})
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
		}
		if done != nil {
			done()
		}
		close(exited)
	}()
	return exited, <-started
}

// startContainerd starts containerd in the node netns, its output
// appended to its log.
func (n *Node) startContainerd() error {
	logFile, err := os.OpenFile(n.log, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// nsenter --net only: `ip netns exec` would also remount /sys in a
	// mount namespace of its own, /sys/fs/cgroup would vanish and runc fail.
	n.proc = exec.Command("nsenter", "--net="+n.NetNS.Path(), "--", "containerd", "--config", n.cfgFile, "--log-level", "info")
	n.proc.Stdout, n.proc.Stderr = logFile, logFile
	n.exited, err = StartPinned(n.proc, func() { logFile.Close() })
	return err
}

// RestartContainerd stops containerd with SIGTERM, as systemctl restart
// does (the shims, and the containers under them, run on), and starts it
// again; it returns how long containerd was gone.
func (n *Node) RestartContainerd() time.Duration {
	t := n.t
	t.Helper()
	start := time.Now()
	_ = n.proc.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(20 * time.Second):
		t.Fatalf("containerd (pid %d) ignored SIGTERM for 20s", n.proc.Process.Pid)
	}
	if err := n.startContainerd(); err != nil {
		t.Fatal(err)
	}
	if err := n.waitReady(20 * time.Second); err != nil {
		t.Fatalf("containerd did not get ready after its restart: %v", err)
	}
	return time.Since(start)
}

// Pid is containerd's.
func (n *Node) Pid() int { return n.proc.Process.Pid }

func setLoUp() error {
	out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	return nil
}

// NetworkName is the CNI network's name (the conflist's).
func (n *Node) NetworkName() string { return n.cfg.Name }

// ConfFile is the one conflist of the conf dir.
func (n *Node) ConfFile() string { return filepath.Join(n.ConfDir, "10-"+n.cfg.Name+".conflist") }

// Conflist is the conflist of one queue count: bridge (its own bridge,
// host-local with its data in the temp dir) then napitap with tc-redirect,
// handing the queues to the test's napitapd.
func (n *Node) Conflist(queues int) string {
	return n.ConflistVersion("1.0.0", queues)
}

// ConflistVersion is Conflist with another cniVersion (containerd 1.6's
// libcni knows 1.0.0 at most; GC needs 1.1.0).
func (n *Node) ConflistVersion(cniVersion string, queues int) string {
	extra, mode := "", ""
	if n.cfg.HandoffMode != "" {
		mode = fmt.Sprintf(`"mode": %q, `, n.cfg.HandoffMode)
	}
	if n.cfg.NapitapExtra != "" {
		extra = ",\n     " + n.cfg.NapitapExtra
	}
	return fmt.Sprintf(`{
  "cniVersion": %q,
  "name": %q,
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true,
     "ipam": {"type": "host-local", "subnet": %q, "dataDir": %q}},
    {"type": "napitap", "queues": %d, "wiring": "tc-redirect",
     "handoff": {%s"socket": %q, "required": true}%s}
  ]
}
`, cniVersion, n.cfg.Name, n.cfg.Bridge, n.Subnet, filepath.Join(n.Root, "cni", "ipam"), queues, mode, n.Socket, extra)
}

// WriteConflist replaces the one conflist of the conf dir atomically
// (containerd ignores *.tmp and reloads on the rename).
func (n *Node) WriteConflist(queues int) {
	n.t.Helper()
	conf := n.Conflist(queues)
	if n.cfg.Conflist != nil {
		conf = n.cfg.Conflist(n)
	}
	tmp := n.ConfFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(conf), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, n.ConfFile()); err != nil {
		n.t.Fatal(err)
	}
}

// UseQueues switches the node's CNI config to a napitap with this many
// queues and waits until the CRI plugin has loaded it: containerd 1.6 has
// no per-pod CNI config and napitap takes per-pod queues only from
// args.cni (Multus), so a per-pod queue count means a node config change,
// made the way a CNI DaemonSet makes it.
func (n *Node) UseQueues(queues int) {
	n.t.Helper()
	n.WriteConflist(queues)
	var loaded int
	err := Poll(10*time.Second, func() (err error) {
		loaded, err = n.LoadedQueues()
		if err == nil && loaded != queues {
			err = fmt.Errorf("CRI still has the conflist with %d queues", loaded)
		}
		return err
	})
	if err != nil {
		n.t.Fatalf("switching to %d queues: %v", queues, err)
	}
}

// LoadedQueues reads the napitap queue count of the conflist the CRI
// plugin has loaded, from `crictl info` (containerd's cniconfig).
func (n *Node) LoadedQueues() (int, error) {
	out, err := n.CrictlRun("info")
	if err != nil {
		return 0, err
	}
	var info struct {
		CNIConfig struct {
			Networks []struct {
				Config struct {
					Name   string
					Source string
				}
			}
		} `json:"cniconfig"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return 0, fmt.Errorf("crictl info: %v", err)
	}
	for _, net := range info.CNIConfig.Networks {
		if net.Config.Name != n.cfg.Name {
			continue
		}
		var list struct {
			Plugins []struct {
				Type   string
				Queues int
			}
		}
		if err := json.Unmarshal([]byte(net.Config.Source), &list); err != nil {
			return 0, err
		}
		for _, p := range list.Plugins {
			if p.Type == "napitap" {
				return p.Queues, nil
			}
		}
	}
	return 0, fmt.Errorf("CRI has no %s network loaded", n.cfg.Name)
}

func (n *Node) waitReady(timeout time.Duration) error {
	return Poll(timeout, func() error {
		select {
		case <-n.exited:
			return errExited
		default:
		}
		out, err := n.CrictlRun("info")
		if err != nil {
			return err
		}
		var info struct {
			Status struct {
				Conditions []struct {
					Type    string
					Status  bool
					Reason  string
					Message string
				}
			}
		}
		if err := json.Unmarshal(out, &info); err != nil {
			return err
		}
		for _, c := range info.Status.Conditions {
			if !c.Status {
				return fmt.Errorf("%s: %s %s", c.Type, c.Reason, c.Message)
			}
		}
		if len(info.Status.Conditions) == 0 {
			return errors.New("no conditions yet")
		}
		return nil
	})
}

var errExited = errors.New("containerd exited")

// Poll calls fn until it succeeds, the timeout passes, or containerd
// exits; it returns fn's last error.
func Poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CrictlRun runs crictl against this node's containerd, bounded.
func (n *Node) CrictlRun(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.crictl, append([]string{"--config", n.CrictlCf}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("crictl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Crictl is CrictlRun that fails the test on error; it returns the
// trimmed output.
func (n *Node) Crictl(args ...string) string {
	n.t.Helper()
	out, err := n.CrictlRun(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// teardown removes whatever pods are left (stopp runs CNI DEL), stops
// containerd by PID, then, should anything have gone wrong, kills the
// shims this containerd started and whatever runc or crun still runs
// under the test's roots.
func (n *Node) teardown() {
	t := n.t
	select {
	case <-n.exited:
	default:
		if out, err := n.CrictlRun("pods", "-q"); err == nil && len(strings.TrimSpace(string(out))) > 0 {
			n.ids = append(n.ids, strings.Fields(string(out))...)
			t.Logf("cleanup: removing leftover pods %q", strings.Fields(string(out)))
			if _, err := n.CrictlRun(append([]string{"stopp"}, strings.Fields(string(out))...)...); err != nil {
				t.Logf("cleanup: %v", err)
			}
			if _, err := n.CrictlRun("rmp", "--force", "--all"); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
		_ = n.proc.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("containerd (pid %d) ignored SIGTERM for 10s: killing it", n.proc.Process.Pid)
			_ = n.proc.Process.Kill()
			<-n.exited
		}
	}
	for _, pid := range ShimsOf(n.Address) {
		t.Errorf("cleanup: killing leftover shim pid %d", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for _, rt := range OCIRuntimes {
		root := filepath.Join(n.Root, rt, criNS) // the shim appends the namespace
		if !Exists(root) {
			continue
		}
		bin := n.ociBinary[rt]
		if ids, _ := exec.Command(bin, "--root", root, "list", "-q").Output(); len(strings.TrimSpace(string(ids))) > 0 {
			for _, id := range strings.Fields(string(ids)) {
				t.Errorf("cleanup: deleting leftover %s container %s", rt, id)
				if out, err := exec.Command(bin, "--root", root, "delete", "--force", id).CombinedOutput(); err != nil {
					t.Errorf("cleanup: %s delete %s: %v: %s", rt, id, err, out)
				}
			}
		}
	}
}

// crunBinary is the crun the crun handler runs: crun itself, or, where
// cgroups are hybrid with controllers on the cgroup2 side (this CI's
// machine: hugetlb), a wrapper that runs it in a mount namespace of its
// own with an empty tmpfs over /sys/fs/cgroup/unified. crun 1.8 refuses
// such a hybrid ("cgroups in hybrid mode not supported, drop all
// controllers from cgroupv2"); without the cgroup2 mount it manages the v1
// hierarchies, as runc does there. Mounts propagate into that namespace
// (slave), never out of it.
func crunBinary(t testing.TB, root string) string {
	t.Helper()
	var fs unix.Statfs_t
	controllers, _ := os.ReadFile("/sys/fs/cgroup/unified/cgroup.controllers")
	if unix.Statfs("/sys/fs/cgroup", &fs) != nil || fs.Type != unix.TMPFS_MAGIC || len(strings.TrimSpace(string(controllers))) == 0 {
		return "crun"
	}
	wrapper := filepath.Join(root, "crun-v1")
	script := `#!/bin/sh
exec unshare --mount --propagation slave -- sh -c 'mount -t tmpfs -o size=4k napitap-crun-v1 /sys/fs/cgroup/unified && exec crun "$@"' crun "$@"
`
	if err := os.WriteFile(wrapper, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("cgroup2 at /sys/fs/cgroup/unified has controllers (%s), which crun refuses in a hybrid: the crun handler runs %s (crun without that mount)",
		strings.TrimSpace(string(controllers)), wrapper)
	return wrapper
}

// OCIRuntimes are the node's runtime handlers, each named after its OCI
// runtime binary: runc, the default, and crun (crictl runp --runtime crun).
var OCIRuntimes = []string{"runc", "crun"}

// ShimsOf finds containerd-shim processes started for this containerd
// (their -address is its socket).
func ShimsOf(address string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if !strings.Contains(args[0], "containerd-shim") {
			continue
		}
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-address" && args[i+1] == address {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// ShimSocket is where containerd 1.6's runc shim listens for a task:
// /run/containerd/s/<sha256(address/namespace/id)>.
func ShimSocket(address, id string) string {
	d := sha256.Sum256([]byte(filepath.Join(address, criNS, id)))
	return filepath.Join(shimRoot, hex.EncodeToString(d[:]))
}

// cleanShimSockets removes the shim sockets of this containerd that are
// still there, and /run/containerd/s and /run/containerd if the test made
// them and they are empty.
func (n *Node) cleanShimSockets(before map[string]bool, madeRun, madeS bool) {
	for name := range ListDir(shimRoot) {
		if before[name] {
			continue
		}
		path := filepath.Join(shimRoot, name)
		if n.ownsShimSocket(name) {
			if err := os.Remove(path); err != nil {
				n.t.Errorf("remove shim socket %s: %v", path, err)
			}
		}
	}
	if madeS {
		_ = os.Remove(shimRoot) // only if empty
	}
	if madeRun {
		_ = os.Remove("/run/containerd")
	}
}

func (n *Node) ownsShimSocket(name string) bool {
	for _, id := range n.sandboxIDs() {
		if filepath.Base(ShimSocket(n.Address, id)) == name {
			return true
		}
	}
	return false
}

// sandboxIDs are the ids of every sandbox this node ran.
func (n *Node) sandboxIDs() []string { return n.ids }

// Track records a sandbox's id, whose shim socket cleanup then removes
// should containerd leave it behind.
func (n *Node) Track(ids ...string) { n.ids = append(n.ids, ids...) }

// TrackAll records every sandbox containerd knows now (a runtime other
// than the test, such as kubelet, makes them).
func (n *Node) TrackAll() {
	if out, err := n.CrictlRun("pods", "-q"); err == nil {
		n.Track(strings.Fields(string(out))...)
	}
}

// ListDir returns the names in dir (none if it cannot be read).
func ListDir(dir string) map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

// AttachmentStates lists what napitapd's state dir at dir holds besides
// napitapd's own lock and takeover socket: attachments' state files, and
// any leftover of writing one.
func AttachmentStates(dir string) []string {
	var out []string
	for name := range ListDir(dir) {
		if name != takeover.LockName && name != takeover.SocketName {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Exists reports whether path exists (a dangling symlink does).
func Exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// ContainerdVersion is what `containerd --version` says.
func ContainerdVersion() string {
	out, err := exec.Command("containerd", "--version").Output()
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(out))
	if len(f) >= 3 {
		return f[2]
	}
	return strings.TrimSpace(string(out))
}

// Napitapd is a napitapd started by StartNapitapd.
type Napitapd struct {
	Socket        string // the hand-off socket
	StateDir      string
	SeccompSocket string // where napitapctl launch and runc send seccomp listeners
	LogPath       string
	Pid           int
	Flags         []string // beyond the paths above
	Netns         string   // where it runs; empty: the test's
}

// StartNapitapd runs the napitapd binary bin with its sockets, state and log
// in dir (never napitapd's node-wide defaults under /run/napitap, which a
// real napitapd or another test may own) and stops it by PID when the test
// ends. flags are napitapd's beyond its paths.
func StartNapitapd(t testing.TB, bin, dir, netns string, flags ...string) *Napitapd {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	d := &Napitapd{
		Socket:        filepath.Join(dir, "napitapd.sock"),
		StateDir:      filepath.Join(dir, "state"),
		SeccompSocket: filepath.Join(dir, "seccomp.sock"),
		LogPath:       filepath.Join(dir, "napitapd.log"),
		Flags:         flags,
		Netns:         netns,
	}
	log, err := os.Create(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"--socket", d.Socket, "--state-dir", d.StateDir, "--seccomp-socket", d.SeccompSocket}, flags...)...)
	if netns != "" {
		// nsenter execs napitapd: the pid stays napitapd's.
		cmd = exec.Command("nsenter", append([]string{"--net=" + netns, "--"}, cmd.Args...)...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.Pid = cmd.Process.Pid
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("napitapd log:\n%s", Tail(string(b), 4000))
		}
	})
	err = Poll(5*time.Second, func() error {
		for _, s := range []string{d.Socket, d.SeccompSocket} {
			if _, err := os.Stat(s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("napitapd did not create its sockets: %v", err)
	}
	return d
}

// Tail is the last n bytes of s.
func Tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
