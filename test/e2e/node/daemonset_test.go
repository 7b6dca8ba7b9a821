package node

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

// daemonSetImage is what the node e2e builds with make image and sets in
// deploy/ through kustomize's image override, as a user with a registry
// of their own does; a name of the test's, so that no image of the user's
// is replaced.
const (
	daemonSetImage     = "napinode.local/napitap:e2e"
	shippedImage       = "ghcr.io/napitap/napitap:v0.1.0" // deploy/base/kustomization.yaml's
	daemonSetNamespace = "napitap-system"
	// faultsImage is napitap built with faultsTag: a napitapd that refuses
	// every takeover while its state dir holds takeover.FaultFile.
	faultsImage = "napinode.local/napitap:e2e-faults"
	faultsTag   = "napitap_faults"
)

// The DaemonSet's hostPaths (deploy/base/daemonset.yaml), on this machine:
// containerd, and runc under it, resolve hostPath mounts in the machine's
// mount namespace, so whatever the pod writes there lands on the machine.
// claimHost makes them and takes them back.
const (
	hostCNIBin   = "/opt/cni/bin"
	hostSeccomp  = "/var/lib/kubelet/seccomp"
	hostNapitapd = "/run/napitap"
	// napitapd's own dir, which holds its state dir.
	hostNapitapdOwn = "/run/napitapd"
	// Where deploy/overlays/kata installs the shim wrapper and napitapctl.
	hostNapitapBin = "/opt/napitap/bin"
)

// claimHost readies the machine paths the DaemonSet writes to and puts
// them back as they were when the test ends, after the cluster has gone:
// dirs it made are removed, a napitap plugin or profiles already there are
// restored. A napitapd that already serves /run/napitap (the machine's own)
// is not the test's to replace.
func claimHost(t *testing.T) {
	t.Helper()
	sock := filepath.Join(hostNapitapd, "napitapd.sock")
	if _, err := (&handoff.Client{Socket: sock}).List(); err == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a napitapd already serves %s: the DaemonSet's would replace it", sock)
		}
		t.Skipf("a napitapd already serves %s: the DaemonSet's would replace it", sock)
	}
	for _, dir := range []string{hostNapitapd, hostNapitapdOwn} {
		if left := crihelp.ListDir(dir); len(left) > 0 {
			t.Fatalf("%s holds %v (a napitapd's that is not running?): not the test's to remove", dir, left)
		}
	}
	for _, dir := range []string{hostCNIBin, filepath.Join(hostSeccomp, "napitap"), hostNapitapd, hostNapitapdOwn, hostNapitapBin} {
		top := dir
		for !crihelp.Exists(filepath.Dir(top)) {
			top = filepath.Dir(top)
		}
		if crihelp.Exists(top) {
			top = "" // nothing to make
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if top == "" {
			continue
		}
		t.Cleanup(func() {
			if err := os.RemoveAll(top); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		})
	}
	// Files the DaemonSet replaces: put back what was there, or remove them.
	saved := map[string][]byte{}
	files := []string{filepath.Join(hostCNIBin, "napitap")}
	for _, f := range []string{"containerd-shim-kata-napitap-v2", "containerd-shim-kata-go-napitap-v2", "napitapctl"} {
		files = append(files, filepath.Join(hostNapitapBin, f))
	}
	for _, p := range []string{"vmm.json", "virt-launcher.json"} {
		files = append(files, filepath.Join(hostSeccomp, "napitap", p))
	}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			saved[f] = b
		}
	}
	t.Cleanup(func() {
		for _, f := range files {
			b, ok := saved[f]
			if !ok {
				if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
					t.Errorf("cleanup: %v", err)
				}
				continue
			}
			tmp := f + ".napitap-e2e"
			err := os.WriteFile(tmp, b, 0o755)
			if err == nil {
				err = os.Rename(tmp, f)
			}
			if err != nil {
				t.Errorf("cleanup: restore %s: %v", f, err)
			}
		}
		// napitapd's sockets and state, if their dirs stay (they were there).
		for _, dir := range []string{hostNapitapd, hostNapitapdOwn} {
			for name := range crihelp.ListDir(dir) {
				if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
					t.Errorf("cleanup: %v", err)
				}
			}
		}
	})
}

// buildImage runs make image, as a user does, into an OCI archive for ctr,
// tagged ref; goflags, if set, is the GOFLAGS of its go build (the
// fault-hook build's tag). It logs the image's size, and removes the image
// from the builder's store when the test ends.
func buildImage(t *testing.T, repo, ref, goflags string) string {
	t.Helper()
	crihelp.RequireTools(t, "make")
	archive := filepath.Join(t.TempDir(), "napitap.tar")
	start := time.Now()
	args := []string{"-C", repo, "image", "IMAGE=" + ref, "IMAGE_ARCHIVE=" + archive}
	if goflags != "" {
		// A bin dir of its own: make build's bin/ stays the shipped build.
		// Only this node's platform: the faults build runs here alone.
		args = append(args, "BIN="+filepath.Join(t.TempDir(), "bin"), "PLATFORMS=linux/"+runtime.GOARCH)
	}
	cmd := exec.Command("make", args...)
	cmd.Env = append(os.Environ(), "GOFLAGS="+goflags)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make image %s: %v\n%s", ref, err, crihelp.Tail(string(out), 3000))
	}
	var size []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(line, "image: ") {
			size = append(size, line)
		}
	}
	t.Logf("make image %s in %v:\n%s", ref, time.Since(start).Round(time.Millisecond), strings.Join(size, "\n"))
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(repo, "hack", "image.sh"), "rm", ref).CombinedOutput(); err != nil {
			t.Logf("cleanup: hack/image.sh rm %s: %v: %s", ref, err, out)
		}
	})
	return archive
}

// startDaemonSetCluster is a Multus node whose napitap comes the way a
// user's does: the controller manager and the scheduler run, the node's
// CNI bin dir takes its napitap from the machine's /opt/cni/bin, pod
// netns files are where a default containerd puts them (/var/run/netns),
// and nothing serves /run/napitap until the DaemonSet's napitapd does.
func startDaemonSetCluster(t *testing.T, cfg crihelp.Config) *cluster {
	t.Helper()
	return startDaemonSetClusterWith(t, cfg, clusterOpts{})
}

// startDaemonSetClusterWith is startDaemonSetCluster with opts (its
// seccompDir and controllers are set here).
func startDaemonSetClusterWith(t *testing.T, cfg crihelp.Config, opts clusterOpts) *cluster {
	t.Helper()
	claimHost(t)
	cfg.NapitapdDir, cfg.NapitapPlugin, cfg.NetNSUnderRun = hostNapitapd, filepath.Join(hostCNIBin, "napitap"), true
	cfg.NapitapdStateDir = filepath.Join(hostNapitapdOwn, "state")
	opts.seccompDir, opts.controllers = hostSeccomp, true
	c := startMultusCluster(t, cfg, opts)
	c.mountNodeSysfs()
	return c
}

// mountNodeSysfs mounts the node netns' sysfs read-write, as a host's /sys
// is for the netns a hostNetwork pod shares. The kernel keeps one sysfs
// superblock per netns, read-only if its first mount was: were runc's
// read-only /sys for the DaemonSet's pod the node netns' first, napitap's
// own sysfs mount there (the plugin setting the NAPI knobs of a Kata tap in
// the node's netns) would be read-only too, which no real node has.
func (c *cluster) mountNodeSysfs() {
	t := c.t
	dir := filepath.Join(c.root, "node-sysfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("nsenter", "--net="+c.node.NetNS.Path(), "--", "mount", "-t", "sysfs", "-o", "rw,nosuid,nodev,noexec",
		"napitap-e2e-node-sysfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount the node netns' sysfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("umount %s: %v", dir, err)
		}
	})
}

// deployDaemonSet builds the image, imports it, applies deploy/ and waits
// for the pod; from then on the node's Napitapd is the pod's napitapd. It
// returns the kustomization's dir and the pod.
func (c *cluster) deployDaemonSet(repo string) (string, *daemonSetPod) {
	t := c.t
	t.Helper()
	c.importImage(repo, daemonSetImage, "")
	start := time.Now()
	dir := c.applyDeploy(repo)
	ds := c.waitDaemonSet("100s")
	t.Logf("DaemonSet pod %s Ready %v after kubectl apply -k; napitapd pid %d", ds.name, time.Since(start).Round(time.Millisecond), ds.pid)
	t.Logf("kubectl get pod:\n%s", c.kubectlMust("get", "pods", "-n", daemonSetNamespace, "-o", "wide"))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.kubectl("describe", "pods", "-n", daemonSetNamespace)
			t.Logf("DaemonSet pod:\n%s\nnapitapd's log:\n%s", out, crihelp.Tail(readFile(c.node.Napitapd.LogPath), 4000))
		}
	})
	c.useDaemonSet(ds)
	return dir, ds
}

// importImage builds ref (buildImage) and imports it into the node's
// containerd.
func (c *cluster) importImage(repo, ref, goflags string) {
	archive := buildImage(c.t, repo, ref, goflags)
	start := time.Now()
	c.node.ImportImage(archive, ref)
	c.t.Logf("ctr images import of %s: %v", ref, time.Since(start).Round(time.Millisecond))
}

// useDaemonSet makes ds's napitapd the node's.
func (c *cluster) useDaemonSet(ds *daemonSetPod) {
	c.node.Napitapd = &crihelp.Napitapd{Socket: c.node.Socket, StateDir: c.node.StateDir,
		SeccompSocket: filepath.Join(hostNapitapd, "seccomp.sock"), LogPath: ds.log, Pid: ds.pid}
}

// daemonSetPod is the DaemonSet's pod on the node.
type daemonSetPod struct {
	name        string
	containerID string
	pid         int // napitapd's, in the machine's pid namespace (hostPID)
	log         string
	servingAt   time.Time        // when napitapd said it serves, after a rollout or a restart
	took        time.Duration    // its takeover's, from request to serving (tookOver=true)
	allowWarn   []*regexp.Regexp // warnings events caused that its log may hold
	supervisor  int              // the container's process, napitapd --supervise, whose child pid is
}

// applyDeploy writes a kustomization of the test's own that takes deploy/
// as it is and sets the image, checks that the two render alike but for
// the image, and applies it with kubectl apply -k. It returns its dir.
func (c *cluster) applyDeploy(repo string) string {
	t := c.t
	t.Helper()
	dir := filepath.Join(c.root, "deploy-e2e")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, filepath.Join(repo, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.SplitN(daemonSetImage, ":", 2)
	k := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
images:
  - name: %s
    newName: %s
    newTag: %s
`, rel, strings.SplitN(shippedImage, ":", 2)[0], ref[0], ref[1])
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	shipped := c.kubectlMust("kustomize", filepath.Join(repo, "deploy"))
	ours := c.kubectlMust("kustomize", dir)
	if want := strings.ReplaceAll(shipped, shippedImage, daemonSetImage); ours != want {
		t.Fatalf("deploy/ with the image set differs in more than the image:\n%s\nwant:\n%s", ours, want)
	}
	c.kubectlMust("apply", "-k", dir)
	return dir
}

// waitDaemonSet waits until the DaemonSet's pod on the node is Ready and
// returns it.
func (c *cluster) waitDaemonSet(timeout string) *daemonSetPod {
	t := c.t
	t.Helper()
	if _, err := c.kubectl("rollout", "status", "-n", daemonSetNamespace, "ds/napitap", "--timeout="+timeout); err != nil {
		out, _ := c.kubectl("describe", "-n", daemonSetNamespace, "ds,pods")
		t.Fatalf("%v\n%s", err, out)
	}
	out := c.kubectlMust("get", "pods", "-n", daemonSetNamespace, "-l", "app.kubernetes.io/name=napitap", "-o", "json")
	var list struct {
		Items []struct {
			Metadata struct {
				Name, UID string
			}
			Spec   struct{ NodeName string }
			Status struct {
				ContainerStatuses []struct {
					Name, ContainerID string
					Ready             bool
					RestartCount      int
				}
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Spec.NodeName != c.nodeName {
		t.Fatalf("DaemonSet pods %+v, want one on node %s", list.Items, c.nodeName)
	}
	item := list.Items[0]
	p := &daemonSetPod{name: item.Metadata.Name}
	for _, cs := range item.Status.ContainerStatuses {
		if cs.Name == "napitapd" {
			p.containerID = strings.TrimPrefix(cs.ContainerID, "containerd://")
			// The kubelet names a container's log by its restart count.
			p.log = filepath.Join(c.root, "kubelet", "pod-logs", daemonSetNamespace+"_"+item.Metadata.Name+"_"+item.Metadata.UID,
				"napitapd", fmt.Sprintf("%d.log", cs.RestartCount))
		}
	}
	var info struct {
		Info struct{ Pid int }
	}
	if err := json.Unmarshal([]byte(c.node.Crictl("inspect", p.containerID)), &info); err != nil || info.Info.Pid == 0 {
		t.Fatalf("crictl inspect %s: pid %d (%v)", p.containerID, info.Info.Pid, err)
	}
	// napitapd --supervise serves from its child.
	p.pid = info.Info.Pid
	err := crihelp.Poll(30*time.Second, func() error {
		child, err := childNamed(info.Info.Pid, "napitapd")
		if err == nil {
			p.supervisor, p.pid = info.Info.Pid, child
		}
		return err
	})
	if err != nil {
		t.Fatalf("pod %s: napitapd --supervise, pid %d: %v", p.name, info.Info.Pid, err)
	}
	return p
}

// socketServer is the pid of the process that listens on the unix socket
// path, as the kernel says (SO_PEERCRED of a connection to it).
func socketServer(path string) (int, error) {
	// The hand-off socket is SOCK_SEQPACKET, the agent's SOCK_STREAM.
	conn, err := net.Dial("unixpacket", path)
	if errors.Is(err, unix.EPROTOTYPE) {
		conn, err = net.Dial("unix", path)
	}
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("SO_PEERCRED on %s: %w", path, cerr)
	}
	return int(cred.Pid), nil
}

// listensOn: pid holds the listening unix socket bound to path, as its
// netns' /proc/net/unix and its fds say.
func listensOn(pid int, path string) error {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		return err
	}
	var inode string
	for _, line := range strings.Split(string(b), "\n") {
		// Num RefCount Protocol Flags Type St Inode Path; Flags 00010000
		// is __SO_ACCEPTCON, a listening socket.
		f := strings.Fields(line)
		if len(f) == 8 && f[7] == path && f[3] == "00010000" {
			inode = f[6]
		}
	}
	if inode == "" {
		return fmt.Errorf("nothing listens on %s in its netns", path)
	}
	fds, err := (&crihelp.Napitapd{Pid: pid}).Fds()
	if err != nil {
		return err
	}
	for _, fd := range fds {
		if fd == "socket:["+inode+"]" {
			return nil
		}
	}
	return fmt.Errorf("it does not hold the socket listening on %s (inode %s)", path, inode)
}

// procStatus reads the named fields of /proc/<pid>/status.
func procStatus(pid int, fields ...string) (map[string]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		for _, f := range fields {
			if ok && k == f {
				out[k] = strings.TrimSpace(v)
			}
		}
	}
	return out, nil
}

// capMask is the effective capability set of exactly caps.
func capMask(caps ...int) string {
	var m uint64
	for _, c := range caps {
		m |= 1 << c
	}
	return fmt.Sprintf("%016x", m)
}

func sha256File(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// TestTheShippedDaemonSetRunsOnTheNode builds the image with make image,
// imports it into the node's containerd and applies deploy/ with kubectl
// apply -k, the image set by kustomize and nothing else changed. The
// controller manager makes the DaemonSet's pod and the scheduler places it;
// it becomes Ready under its own securityContext; its init containers
// install napitap into the machine's /opt/cni/bin and the seccomp profiles
// into the kubelet's seccomp dir; and the process serving the machine's
// /run/napitap sockets is the pod's napitapd. A pod on the shipped
// napitap-standalone NAD ("fds" mode) gets NAPI queues from it through
// napitapctl exec. kubectl delete -k leaves the plugin, the profiles and
// the attachment's state on the node (deploy/README.md, "Removal"), and a
// fresh apply -k serves that attachment: napitapctl exec gets its queues
// reopened with NAPI, and the pod's DEL leaves nothing.
func TestTheShippedDaemonSetRunsOnTheNode(t *testing.T) {
	testStart := time.Now()
	repo, err := crihelp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	c := startDaemonSetCluster(t, crihelp.Config{Name: "napinodeds", Subnet: multusSubnet})
	dir, ds := c.deployDaemonSet(repo)

	checks := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"the install-cni init container installed the image's napitap into the machine's CNI bin dir", func(t *testing.T) {
			got, err := sha256File(filepath.Join(hostCNIBin, "napitap"))
			if err != nil {
				t.Fatal(err)
			}
			want, err := sha256File(filepath.Join(repo, "bin", "napitap"))
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("%s/napitap has sha256 %s, the image's (bin/napitap) %s", hostCNIBin, got, want)
			}
			log := c.kubectlMust("logs", "-n", daemonSetNamespace, ds.name, "-c", "install-cni")
			t.Logf("install-cni: %s", log)
			if !strings.Contains(log, want) {
				t.Errorf("install-cni's log names no sha256 %s", want)
			}
		}},
		{"the install-seccomp-profiles init container installed the profiles where the kubelet reads them", func(t *testing.T) {
			for _, name := range []string{"vmm.json", "virt-launcher.json"} {
				var profile struct{ ListenerPath string }
				b, err := os.ReadFile(filepath.Join(c.kubeletRoot, "seccomp", "napitap", name))
				if err == nil {
					err = json.Unmarshal(b, &profile)
				}
				if err != nil || profile.ListenerPath != filepath.Join(hostNapitapd, "seccomp.sock") {
					t.Errorf("napitap/%s in the kubelet's seccomp dir: listenerPath %q (%v), want %s/seccomp.sock", name, profile.ListenerPath, err, hostNapitapd)
				}
			}
		}},
		{"the process serving the machine's napitapd socket is the pod's napitapd", func(t *testing.T) {
			sock := filepath.Join(hostNapitapd, "napitapd.sock")
			if pid, err := socketServer(sock); err != nil || pid != ds.pid {
				t.Errorf("%s is served by pid %d (%v), want the pod's napitapd, pid %d", sock, pid, err, ds.pid)
			}
			// The agent's socket takes a listener or logs a refusal: ask
			// the kernel who holds it instead of connecting.
			sock = filepath.Join(hostNapitapd, "seccomp.sock")
			if err := listensOn(ds.pid, sock); err != nil {
				t.Errorf("the pod's napitapd, pid %d: %v", ds.pid, err)
			}
			if atts, err := (&handoff.Client{Socket: c.node.Socket}).List(); err != nil {
				t.Errorf("napitapctl list over %s: %v (%d attachments)", c.node.Socket, err, len(atts))
			}
		}},
		{"napitapd runs with the five capabilities, seccomp and no privilege", func(t *testing.T) {
			st, err := procStatus(ds.pid, "CapEff", "CapBnd", "Seccomp", "Name")
			if err != nil {
				t.Fatal(err)
			}
			caps := capMask(unix.CAP_NET_ADMIN, unix.CAP_SETGID, unix.CAP_SETUID, unix.CAP_SYS_ADMIN, unix.CAP_SYS_PTRACE)
			if st["Name"] != "napitapd" || st["CapEff"] != caps || st["CapBnd"] != caps || st["Seccomp"] != "2" {
				t.Errorf("pid %d: %v, want napitapd with CapEff and CapBnd %s and Seccomp 2 (filter)", ds.pid, st, caps)
			}
			restarts := c.kubectlMust("get", "pods", "-n", daemonSetNamespace, ds.name, "-o", "jsonpath={.status.containerStatuses[0].restartCount}")
			if n, err := strconv.Atoi(restarts); err != nil || n != 0 {
				t.Errorf("napitapd restarted %s times", restarts)
			}
		}},
	}
	for _, tc := range checks {
		t.Run(tc.name, tc.check)
	}
	if t.Failed() {
		return
	}
	c.checkDaemonSetLog(ds)

	// fds mode: a pod on the shipped napitap-standalone NAD, whose two
	// queues the pod's napitapd holds for napitapctl exec. cni-args lets
	// GRO merge the probe's segments (DESIGN.md fact 10).
	c.kubectlMust("apply", "-n", podNamespace, "-f", filepath.Join(repo, "deploy", "examples", "napitap-standalone.yaml"))
	p := &multusPod{pod: pod{name: "vm-fds"}, nad: "napitap-standalone", subnet: "10.199.0.0/24",
		want: nodecheck.Expect{IfName: "net1", TapName: "net1", Queues: 2, NAPI: true, Wiring: "none", Held: 2}}
	c.apply(c.multusManifest(p.name, fmt.Sprintf(`[{"name":%q,"interface":%q,"cni-args":{"groFlushTimeout":%d}}]`, p.nad, p.want.IfName, groFlushTimeout)))
	c.waitMultusPod(p)
	if err := nodecheck.Present(p.netns, p.want); err != nil {
		t.Fatalf("pod %s: %v", p.name, err)
	}
	c.fetchAndProbeIf(&p.pod, p.want.IfName, p.want.TapName)
	c.checkMetrics(ds)

	// Removal: kubectl delete -k takes napitapd away and leaves the plugin,
	// the profiles and the attachment's state on the node
	// (deploy/README.md, "Removal"); a fresh apply serves that attachment:
	// its queues reopen on fetch, and DEL goes through.
	start := time.Now()
	c.kubectlMust("delete", "-k", dir, "--wait", "--timeout=120s")
	t.Logf("kubectl delete -k: %v", time.Since(start).Round(time.Millisecond))
	if pid, err := socketServer(c.node.Socket); err == nil {
		t.Errorf("after kubectl delete -k, pid %d still serves %s", pid, c.node.Socket)
	}
	stays := []string{filepath.Join(hostCNIBin, "napitap"), filepath.Join(hostSeccomp, "napitap", "vmm.json"), filepath.Join(hostSeccomp, "napitap", "virt-launcher.json")}
	for _, f := range stays {
		if !crihelp.Exists(f) {
			t.Errorf("kubectl delete -k removed %s", f)
		}
	}
	if state := crihelp.AttachmentStates(c.node.StateDir); len(state) != 1 {
		t.Errorf("napitapd's state after kubectl delete -k: %v, want pod %s's attachment", state, p.name)
	}
	start = time.Now()
	c.kubectlMust("apply", "-k", dir)
	again := c.waitDaemonSet("100s")
	c.useDaemonSet(again)
	t.Logf("DaemonSet re-applied: pod %s Ready in %v, napitapd pid %d", again.name, time.Since(start).Round(time.Millisecond), again.pid)
	if pid, err := socketServer(c.node.Socket); err != nil || pid != again.pid || again.pid == ds.pid {
		t.Errorf("after the re-apply %s is served by pid %d (%v), want the new pod's napitapd, pid %d (the first was %d)", c.node.Socket, pid, err, again.pid, ds.pid)
	}
	p.want.Held = 0 // the fds closed with the first napitapd
	if err := nodecheck.Present(p.netns, p.want); err != nil {
		t.Errorf("pod %s after the re-apply: %v", p.name, err)
	}
	c.fetchAndProbeIf(&p.pod, p.want.IfName, p.want.TapName)
	c.kubectlMust("delete", "pod", "-n", podNamespace, p.name, "--wait", "--timeout=120s")
	if err := crihelp.Poll(30*time.Second, func() error { return nodecheck.Gone(p.netns, p.want) }); err != nil {
		t.Errorf("pod %s after kubectl delete: %v", p.name, err)
	}
	if atts, err := (&handoff.Client{Socket: c.node.Socket}).List(); err != nil || len(atts) > 0 {
		t.Errorf("the re-applied napitapd after the pod went holds %+v (%v), want nothing", atts, err)
	}
	if left := crihelp.AttachmentStates(c.node.StateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", c.node.StateDir, left)
	}
	c.checkDaemonSetLog(again)

	// Kata nodes: the overlay's init containers install the image's shim
	// wrapper (under both names) and napitapctl on the node, and its
	// RuntimeClasses run only where Kata is.
	start = time.Now()
	c.applyOverlay(repo, "kata")
	kata := c.completeRollout(again, c.waitNewPod(again), start, "kubectl apply -k deploy/overlays/kata")
	t.Logf("deploy/overlays/kata applied: pod %s Ready in %v", kata.name, time.Since(start).Round(time.Millisecond))
	for name, src := range map[string]string{
		"containerd-shim-kata-napitap-v2":    filepath.Join(repo, "deploy", "kata", "containerd-shim-kata-napitap-v2"),
		"containerd-shim-kata-go-napitap-v2": filepath.Join(repo, "deploy", "kata", "containerd-shim-kata-napitap-v2"),
		"napitapctl":                         filepath.Join(repo, "bin", "napitapctl"),
	} {
		p := filepath.Join(hostNapitapBin, name)
		got, err := sha256File(p)
		want, werr := sha256File(src)
		st, serr := os.Stat(p)
		if err != nil || werr != nil || serr != nil || got != want || st.Mode().Perm() != 0o755 {
			t.Errorf("%s: sha256 %s, mode %v (%v %v %v); want the image's %s (sha256 %s), 0755", p, got, st.Mode(), err, werr, serr, src, want)
		}
	}
	for _, rc := range []string{"kata-napitap", "kata-go-napitap"} {
		if sel := c.kubectlMust("get", "runtimeclass", rc, "-o", "jsonpath={.scheduling.nodeSelector}"); !strings.Contains(sel, `"katacontainers.io/kata-runtime":"true"`) {
			t.Errorf("RuntimeClass %s: nodeSelector %s", rc, sel)
		}
	}
	c.checkDaemonSetLog(kata)
	t.Logf("whole run: %v", time.Since(testStart).Round(time.Second))
}

// applyOverlay applies deploy/overlays/NAME with the test's image, as
// applyDeploy applies deploy/.
func (c *cluster) applyOverlay(repo, name string) {
	t := c.t
	t.Helper()
	dir := filepath.Join(c.root, "deploy-e2e-"+name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, filepath.Join(repo, "deploy", "overlays", name))
	if err != nil {
		t.Fatal(err)
	}
	ref := strings.SplitN(daemonSetImage, ":", 2)
	k := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\nimages:\n  - name: %s\n    newName: %s\n    newTag: %s\n",
		rel, strings.SplitN(shippedImage, ":", 2)[0], ref[0], ref[1])
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	c.kubectlMust("apply", "-k", dir)
}

// checkDaemonSetLog fails the test on any warning or error napitapd in the
// DaemonSet's pod logged.
func (c *cluster) checkDaemonSetLog(ds *daemonSetPod) {
	c.checkLogClean("napitapd", readFile(ds.log), ds.allowWarn...)
}

// checkMetrics scrapes napitapd's /metrics where the DaemonSet serves it,
// the node's address (status.hostIP) and port 9695, from the node's netns:
// its gauges say what napitapctl list says.
func (c *cluster) checkMetrics(ds *daemonSetPod) {
	t := c.t
	t.Helper()
	hostIP, body, err := c.scrapeMetrics(ds)
	if err != nil {
		t.Errorf("scraping napitapd's metrics on %s:9695: %v", hostIP, err)
		return
	}
	atts, err := (&handoff.Client{Socket: c.node.Socket}).List()
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, a := range atts {
		held += a.Held
	}
	var excerpt []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "napitapd_") {
			excerpt = append(excerpt, line)
		}
	}
	t.Logf("napitapd's /metrics on %s:9695 (napitapd_ lines):\n%s", hostIP, strings.Join(excerpt, "\n"))
	for _, want := range []string{
		fmt.Sprintf("napitapd_attachments %d", len(atts)),
		fmt.Sprintf("napitapd_held_queues %d", held),
		`napitapd_build_info{version="`,
		`napitapd_handoff_requests_total{op="fetch",result="ok"}`,
	} {
		if !slices.Contains(excerpt, want) && !slices.ContainsFunc(excerpt, func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("napitapd's /metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("the whole answer:\n%s", crihelp.Tail(string(body), 3000))
	}
}

// scrapeMetrics reads napitapd's /metrics where the DaemonSet serves it,
// the pod's hostIP and port 9695, from the node's netns; it returns the
// address and the answer.
func (c *cluster) scrapeMetrics(ds *daemonSetPod) (string, []byte, error) {
	hostIP := c.kubectlMust("get", "pod", "-n", daemonSetNamespace, ds.name, "-o", "jsonpath={.status.hostIP}")
	var body []byte
	var conn net.Conn
	// Dialed here, on this thread in the node's netns: net/http would
	// dial from a goroutine of its own, in whatever netns its thread is.
	err := ns.WithNetNSPath(c.node.NetNS.Path(), func(ns.NetNS) (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort(hostIP, "9695"), 10*time.Second)
		return err
	})
	if err != nil {
		return hostIP, nil, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	req, _ := http.NewRequest(http.MethodGet, "http://"+net.JoinHostPort(hostIP, "9695")+"/metrics", nil)
	if err := req.Write(conn); err != nil {
		return hostIP, nil, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return hostIP, nil, err
	}
	defer resp.Body.Close()
	if body, err = io.ReadAll(resp.Body); err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, body)
	}
	return hostIP, body, err
}
