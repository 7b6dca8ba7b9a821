package cri

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
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

const (
	pauseRef   = "napicri.local/pause:test"
	criNS      = "k8s.io"
	confFile   = "10-napicri.conflist"
	bridgeName = "napicri0"
	shimRoot   = "/run/containerd/s" // containerd 1.6 puts shim sockets here whatever its config says
)

// node is one containerd (CRI plugin + runc) serving a node netns of the
// test's own, with its CNI config, and the napitapd its napitap hands to.
type node struct {
	t        *testing.T
	root     string // temp dir holding everything below
	netns    *nstest.NetNS
	address  string // containerd's gRPC socket
	crictlCf string
	crictl   string
	confDir  string
	subnet   string
	cgroup   string // cgroup_parent of the pods, "/napicri-<suffix>"
	socket   string // napitapd's
	stateDir string // napitapd's
	proc     *exec.Cmd
	exited   chan struct{}
	log      string
	ids      []string // every sandbox started, for the shim socket names
}

// newRoot makes the temp dir everything lives in (short: it holds unix
// sockets) and removes it when the test ends, unmounting first whatever
// containerd left mounted in it (pod netns files, /dev/shm, rootfs).
func newRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "napicri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, m := range mountsUnder(dir) {
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

// mountsUnder lists mount points under dir, deepest first.
func mountsUnder(dir string) []string {
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

// ensureCgroups makes sure runc finds a cgroup mount at /sys/fs/cgroup
// (v1 hierarchies or cgroup2). If there is none it mounts cgroup2 there,
// says so, and unmounts it when the test ends.
func ensureCgroups(t *testing.T) {
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

// removeCgroups removes the pods' cgroup parent, in every hierarchy, after
// runc has removed the pods' own (or leaves them behind on failure).
func removeCgroups(t *testing.T, parent string) {
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
  netns_mounts_under_state_dir = true
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

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[8]q
    conf_dir = %[9]q
    max_conf_num = 1
    conf_template = ""
`

// startNode makes the node netns, the CNI bin and conf dirs, napitapd and
// containerd (in the node netns), and imports the pause image. Everything
// is stopped and removed when the test ends, failure or not.
func startNode(t *testing.T, root, crictl string, firstQueues int) *node {
	t.Helper()
	suffix := nstest.RandomSuffix()
	n := &node{
		t:       t,
		root:    root,
		netns:   nstest.New(t, "cri-node"),
		address: filepath.Join(root, "containerd.sock"),
		crictl:  crictl,
		confDir: filepath.Join(root, "cni", "conf"),
		subnet:  "10.196.0.0/24",
		cgroup:  "/napicri-" + suffix,
		log:     filepath.Join(root, "containerd.log"),
	}
	n.netns.Run(t, setLoUp)
	t.Cleanup(func() { removeCgroups(t, n.cgroup) })

	// containerd 1.6 takes one CNI bin_dir: links to what the test built.
	// loopback is what containerd itself sets up lo with.
	binLinks := filepath.Join(root, "cni", "bin")
	for _, dir := range []string{binLinks, n.confDir, filepath.Join(root, "logs")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, plugin := range []string{"napitap", "bridge", "host-local", "loopback"} {
		if err := os.Symlink(filepath.Join(binDir, plugin), filepath.Join(binLinks, plugin)); err != nil {
			t.Fatal(err)
		}
	}
	n.socket, n.stateDir = startNapitapd(t, filepath.Join(root, "napitapd"))
	n.writeConflist(firstQueues)

	cfg := filepath.Join(root, "containerd.toml")
	conf := fmt.Sprintf(containerdConfig,
		filepath.Join(root, "root"), filepath.Join(root, "state"), n.address, n.address+".ttrpc",
		filepath.Join(root, "opt"), pauseRef, filepath.Join(root, "runc"), binLinks, n.confDir)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	n.crictlCf = filepath.Join(root, "crictl.yaml")
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%[1]s\nimage-endpoint: unix://%[1]s\ntimeout: 20\n", n.address)
	if err := os.WriteFile(n.crictlCf, []byte(crictlConf), 0o644); err != nil {
		t.Fatal(err)
	}

	shimsBefore := listDir(shimRoot)
	runBefore := !exists("/run/containerd")
	sBefore := !exists(shimRoot)
	logFile, err := os.Create(n.log)
	if err != nil {
		t.Fatal(err)
	}
	// nsenter --net only: `ip netns exec` would also remount /sys in a
	// mount namespace of its own, /sys/fs/cgroup would vanish and runc fail.
	n.proc = exec.Command("nsenter", "--net="+n.netns.Path(), "--", "containerd", "--config", cfg, "--log-level", "info")
	n.proc.Stdout, n.proc.Stderr = logFile, logFile
	// Should the test binary die (a go test timeout runs no cleanups),
	// containerd gets SIGTERM. The parent-death signal follows the thread
	// that forked, and ns.Do ends the threads it locks, so fork from a
	// thread held until containerd exits.
	n.proc.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	start := time.Now()
	n.exited = make(chan struct{})
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := n.proc.Start()
		started <- err
		if err == nil {
			_ = n.proc.Wait()
		}
		logFile.Close()
		close(n.exited)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.teardown()
		n.cleanShimSockets(shimsBefore, runBefore, sBefore)
		if t.Failed() {
			b, _ := os.ReadFile(n.log)
			t.Logf("containerd log (last 6000 bytes):\n%s", tail(string(b), 6000))
		}
	})

	if err := n.waitReady(20 * time.Second); err != nil {
		t.Fatalf("containerd did not get ready: %v", err)
	}
	t.Logf("containerd %s ready in %v (pid %d, node netns %s)", containerdVersion(), time.Since(start).Round(time.Millisecond), n.proc.Process.Pid, n.netns.Name)

	archive := filepath.Join(root, "pause.tar")
	if err := writePauseArchive(archive, filepath.Join(binDir, "pause"), pauseRef); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "ctr", "--address", n.address, "-n", criNS, "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v: %s", err, out)
	}
	// The CRI plugin learns of the image through containerd's events.
	if err := poll(10*time.Second, func() error {
		_, err := n.crictlRun("inspecti", pauseRef)
		return err
	}); err != nil {
		t.Fatalf("pause image not visible to CRI: %v", err)
	}
	return n
}

func setLoUp() error {
	out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s", err, out)
	}
	return nil
}

// napitapConf is the conflist of one queue count: bridge (its own bridge,
// host-local with its data in the temp dir) then napitap with tc-redirect,
// handing the queues to the test's napitapd.
func (n *node) napitapConf(queues int) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "napicri",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true,
     "ipam": {"type": "host-local", "subnet": %q, "dataDir": %q}},
    {"type": "napitap", "queues": %d, "wiring": "tc-redirect",
     "handoff": {"socket": %q, "required": true}}
  ]
}
`, bridgeName, n.subnet, filepath.Join(n.root, "cni", "ipam"), queues, n.socket)
}

// writeConflist replaces the one conflist of the conf dir atomically
// (containerd ignores *.tmp and reloads on the rename).
func (n *node) writeConflist(queues int) {
	n.t.Helper()
	tmp := filepath.Join(n.confDir, confFile+".tmp")
	if err := os.WriteFile(tmp, []byte(n.napitapConf(queues)), 0o644); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.confDir, confFile)); err != nil {
		n.t.Fatal(err)
	}
}

// useQueues switches the node's CNI config to a napitap with this many
// queues and waits until the CRI plugin has loaded it: containerd 1.6 has
// no per-pod CNI config and napitap takes per-pod queues only from
// args.cni (Multus), so a per-pod queue count means a node config change,
// made the way a CNI DaemonSet makes it.
func (n *node) useQueues(queues int) {
	n.t.Helper()
	n.writeConflist(queues)
	var loaded int
	err := poll(10*time.Second, func() (err error) {
		loaded, err = n.loadedQueues()
		if err == nil && loaded != queues {
			err = fmt.Errorf("CRI still has the conflist with %d queues", loaded)
		}
		return err
	})
	if err != nil {
		n.t.Fatalf("switching to %d queues: %v", queues, err)
	}
}

// loadedQueues reads the napitap queue count of the conflist the CRI
// plugin has loaded, from `crictl info` (containerd's cniconfig).
func (n *node) loadedQueues() (int, error) {
	out, err := n.crictlRun("info")
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
		if net.Config.Name != "napicri" {
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
	return 0, errors.New("CRI has no napicri network loaded")
}

func (n *node) waitReady(timeout time.Duration) error {
	return poll(timeout, func() error {
		select {
		case <-n.exited:
			return errExited
		default:
		}
		out, err := n.crictlRun("info")
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

// poll calls fn until it succeeds, the timeout passes, or containerd
// exits; it returns fn's last error.
func poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || errors.Is(err, errExited) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// crictlRun runs crictl against this node's containerd, bounded.
func (n *node) crictlRun(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, n.crictl, append([]string{"--config", n.crictlCf}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("crictl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func (n *node) crictlMust(args ...string) string {
	n.t.Helper()
	out, err := n.crictlRun(args...)
	if err != nil {
		n.t.Fatal(err)
	}
	return strings.TrimSpace(string(out))
}

// teardown removes whatever pods are left (stopp runs CNI DEL), stops
// containerd by PID, then, should anything have gone wrong, kills the
// shims this containerd started and whatever runc still runs under the
// test's runc root.
func (n *node) teardown() {
	t := n.t
	select {
	case <-n.exited:
	default:
		if out, err := n.crictlRun("pods", "-q"); err == nil && len(strings.TrimSpace(string(out))) > 0 {
			t.Logf("cleanup: removing leftover pods %q", strings.Fields(string(out)))
			if _, err := n.crictlRun(append([]string{"stopp"}, strings.Fields(string(out))...)...); err != nil {
				t.Logf("cleanup: %v", err)
			}
			if _, err := n.crictlRun("rmp", "--force", "--all"); err != nil {
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
	for _, pid := range shimsOf(n.address) {
		t.Errorf("cleanup: killing leftover shim pid %d", pid)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	runcRoot := filepath.Join(n.root, "runc", criNS) // the shim appends the namespace
	if ids, _ := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); len(strings.TrimSpace(string(ids))) > 0 {
		for _, id := range strings.Fields(string(ids)) {
			t.Errorf("cleanup: deleting leftover runc container %s", id)
			_ = exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
		}
	}
}

// shimsOf finds containerd-shim processes started for this containerd
// (their -address is its socket).
func shimsOf(address string) []int {
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

// shimSocket is where containerd 1.6's runc shim listens for a task:
// /run/containerd/s/<sha256(address/namespace/id)>.
func shimSocket(address, id string) string {
	d := sha256.Sum256([]byte(filepath.Join(address, criNS, id)))
	return filepath.Join(shimRoot, hex.EncodeToString(d[:]))
}

// cleanShimSockets removes the shim sockets of this containerd that are
// still there, and /run/containerd/s and /run/containerd if the test made
// them and they are empty.
func (n *node) cleanShimSockets(before map[string]bool, madeRun, madeS bool) {
	for name := range listDir(shimRoot) {
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

func (n *node) ownsShimSocket(name string) bool {
	for _, id := range n.sandboxIDs() {
		if filepath.Base(shimSocket(n.address, id)) == name {
			return true
		}
	}
	return false
}

// sandboxIDs are the ids of every sandbox this node ran.
func (n *node) sandboxIDs() []string { return n.ids }

func listDir(dir string) map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		out[e.Name()] = true
	}
	return out
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func containerdVersion() string {
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

// startNapitapd runs the test's napitapd binary on a socket in dir and
// stops it by PID when the test ends; it returns the socket and state dir.
func startNapitapd(t *testing.T, dir string) (string, string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	socket, state := filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "state")
	log, err := os.Create(filepath.Join(dir, "napitapd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "napitapd"), "--socket", socket, "--state-dir", state)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(log.Name())
			t.Logf("napitapd log:\n%s", tail(string(b), 4000))
		}
	})
	if err := poll(5*time.Second, func() error { _, err := os.Stat(socket); return err }); err != nil {
		t.Fatalf("napitapd did not create %s", socket)
	}
	return socket, state
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}
