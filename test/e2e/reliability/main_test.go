// Package reliability puts napitap, napitapd and the reference plugins
// through faults (a pod netns vanishing mid-ADD, SIGKILL of the plugin or
// of napitapd, napitapd down, racing and repeated ADDs), churn and GC after
// a runtime crash, on real kernel objects with the real binaries, and
// checks after each that the node is either consistent or as it was.
//
// Environment: NAPITAP_CHURN_CYCLES sets TestChurn's cycle count (default
// 1000); NAPITAP_DEBUG=1 logs how long each node comparison took to
// settle.
package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Getenv(idleEnv) != "" {
		os.Exit(holdIdle())
	}
	cnitest.MainWithBinaries(m, &binDir, append([]string{
		"github.com/napitap/napitap/plugins/napitap",
		"github.com/napitap/napitap/cmd/napitapd",
		"github.com/napitap/napitap/cmd/napitapctl",
	}, cnitest.ReferencePlugins...)...)
}

// ---------------------------------------------------------------------------
// napitapd, the binary, as a child process stopped by PID.

type daemon struct {
	t        testing.TB
	dir      string // short: it holds the socket
	Socket   string
	StateDir string
	logPath  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// newDaemon starts napitapd on a socket and state dir of the test's own.
// The periodic sweep is pushed out of the test's reach: what the tests
// prove is that DEL, GC and the sweep at start-up release, not the timer.
func newDaemon(t testing.TB) *daemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "napitap-rel-")
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{t: t, dir: dir, Socket: filepath.Join(dir, "napitapd.sock"), StateDir: filepath.Join(dir, "state"), logPath: filepath.Join(dir, "napitapd.log")}
	t.Cleanup(func() {
		d.Stop()
		if t.Failed() {
			b, _ := os.ReadFile(d.logPath)
			t.Logf("napitapd log (tail):\n%s", tail(string(b), 6000))
		}
		os.RemoveAll(dir)
	})
	d.Start()
	return d
}

func (d *daemon) Client() *handoff.Client { return &handoff.Client{Socket: d.Socket} }

// Start runs napitapd and waits until it answers.
func (d *daemon) Start() {
	d.t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd != nil {
		d.t.Fatal("napitapd is already running")
	}
	log, err := os.OpenFile(d.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		d.t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(binDir, "napitapd"), "--socket", d.Socket, "--state-dir", d.StateDir, "--sweep-interval", "1h",
		"--seccomp-socket", filepath.Join(d.dir, "seccomp.sock"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		d.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	d.cmd, d.done = cmd, done
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := d.Client().List(); err == nil {
			return
		}
		select {
		case <-done:
			d.cmd = nil
			d.t.Fatalf("napitapd exited at start: %s", tailFile(d.logPath, 2000))
		default:
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("napitapd (pid %d) does not answer on %s", cmd.Process.Pid, d.Socket)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Kill SIGKILLs napitapd, as the OOM killer or a node crash would.
func (d *daemon) Kill() { d.signal(syscall.SIGKILL) }

// Stop ends napitapd with SIGTERM, if it runs.
func (d *daemon) Stop() { d.signal(syscall.SIGTERM) }

func (d *daemon) signal(sig syscall.Signal) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return
	}
	_ = syscall.Kill(d.cmd.Process.Pid, sig)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.done
	}
	d.cmd = nil
}

// PID is napitapd's PID, 0 when it is down.
func (d *daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.cmd == nil {
		return 0
	}
	return d.cmd.Process.Pid
}

// ---------------------------------------------------------------------------
// Pod network namespaces that a test may delete itself.

type podNS struct {
	Name, Path string
}

// newPodNS makes the netns napitap-<role>-<random>. Unlike nstest.New it
// tolerates the test deleting it (fault 1); whatever is left goes at the end.
func newPodNS(t testing.TB, role string) *podNS {
	t.Helper()
	name := "napitap-" + role + "-" + nstest.RandomSuffix()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	p := &podNS{Name: name, Path: filepath.Join("/run/netns", name)}
	t.Cleanup(func() {
		if p.Exists() {
			if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", name, err, out)
			}
		}
	})
	return p
}

func (p *podNS) Exists() bool {
	_, err := os.Stat(p.Path)
	return err == nil
}

// Delete runs `ip netns del`, as a runtime tearing the sandbox down does.
func (p *podNS) Delete() error {
	if out, err := exec.Command("ip", "netns", "del", p.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", p.Name, err, out)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Network configs.

// tapConf is napitap's part of a network config.
type tapConf struct {
	Queues   int
	Wiring   string // "" lets napitap choose: tc-redirect when chained
	Handoff  string // "off", "optional" or "required"
	KataDan  bool
	IPAM     bool // host-local on the tap; standalone only
	CNIVer   string
	Chained  bool // after the bridge plugin
	Subnet   string
	HostBr   string // the bridge plugin's bridge in the host netns
	MACInCfg string
}

func (c tapConf) version() string {
	if c.CNIVer == "" {
		return "1.1.0"
	}
	return c.CNIVer
}

// fixture is one "node": a host netns with libcni (cnitest.Env), napitapd,
// a DAN dir and the host-local data dir.
type fixture struct {
	t       testing.TB
	env     *cnitest.Env
	d       *daemon
	danDir  string
	ipamDir string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	env := cnitest.NewEnv(t, binDir)
	f := &fixture{t: t, env: env, d: newDaemon(t), danDir: filepath.Join(env.DataDir, "dans"), ipamDir: filepath.Join(env.DataDir, "ipam")}
	return f
}

// plugins renders the conflist's plugins for c.
func (f *fixture) plugins(c tapConf) []string {
	var out []string
	if c.Chained {
		subnet, br := c.Subnet, c.HostBr
		if subnet == "" {
			subnet = f.env.Subnet
		}
		if br == "" {
			br = "napibr-" + f.env.Suffix
		}
		out = append(out, fmt.Sprintf(`{"type":"bridge","bridge":%q,"isGateway":true,"ipam":{"type":"host-local","subnet":%q,"dataDir":%q}}`, br, subnet, f.ipamDir))
	}
	nt := map[string]any{"type": "napitap", "queues": c.Queues}
	if c.Wiring != "" {
		nt["wiring"] = c.Wiring
	}
	switch c.Handoff {
	case "off":
		nt["handoff"] = map[string]any{"disabled": true}
	case "optional":
		nt["handoff"] = map[string]any{"socket": f.d.Socket}
	case "required":
		nt["handoff"] = map[string]any{"socket": f.d.Socket, "required": true}
	default:
		f.t.Fatalf("handoff %q", c.Handoff)
	}
	if c.KataDan {
		nt["kataDan"] = map[string]any{"enabled": true, "dir": f.danDir}
	}
	if c.IPAM {
		subnet := c.Subnet
		if subnet == "" {
			subnet = "10.198.0.0/24"
		}
		nt["ipam"] = map[string]any{"type": "host-local", "subnet": subnet, "dataDir": f.ipamDir}
	}
	if c.MACInCfg != "" {
		nt["mac"] = c.MACInCfg
	}
	b, _ := json.Marshal(nt)
	return append(out, string(b))
}

// list is the conflist of c under the network name.
func (f *fixture) list(name string, c tapConf) *libcni.NetworkConfigList {
	f.t.Helper()
	raw := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s]}`, c.version(), name, strings.Join(f.plugins(c), ","))
	list, err := libcni.ConfListFromBytes([]byte(raw))
	if err != nil {
		f.t.Fatalf("conflist %s: %v", raw, err)
	}
	return list
}

// expect is what nodecheck should find for an attachment of c.
func (f *fixture) expect(c tapConf, containerID, ifName string) nodecheck.Expect {
	wiring := "none"
	if c.Chained {
		wiring = "tc-redirect"
		if c.Wiring != "" {
			wiring = c.Wiring
		}
	}
	tapName := ifName
	if wiring != "none" {
		tapName = "tap" + ifName[3:]
	}
	want := nodecheck.Expect{ContainerID: containerID, IfName: ifName, TapName: tapName, Queues: c.Queues, NAPI: true, Wiring: wiring}
	if wiring == "bridge" {
		want.Bridge = "br-" + tapName
	}
	if c.KataDan {
		// In the node's netns, a port of the bridge plugin's bridge.
		want.Wiring, want.TapName, want.NodeNetns = config.WiringNodeBridge, config.NodeTapName(containerID, ifName), f.env.Host.Path()
		if want.Bridge = c.HostBr; want.Bridge == "" {
			want.Bridge = "napibr-" + f.env.Suffix
		}
	}
	if c.Handoff != "off" {
		want.Socket, want.Held = f.d.Socket, c.Queues
	}
	return want
}

func rt(containerID string, p *podNS, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: p.Path, IfName: ifName}
}

// check runs CHECK of the chain as libcni does, every plugin with the
// final result as prevResult, except that in bridge wiring the previous
// plugin's own CHECK disagrees by design (its interface gave its MAC and
// addresses to the guest): there only napitap's CHECK runs. It works for
// attachments made without libcni, which has no cached result for them.
func (f *fixture) check(list *libcni.NetworkConfigList, c tapConf, r *libcni.RuntimeConf, final *current.Result) error {
	for i := range list.Plugins {
		if c.Wiring == "bridge" && i < len(list.Plugins)-1 {
			continue
		}
		conf, err := pluginConf(list, i, final)
		if err != nil {
			return err
		}
		if _, err := f.exec(context.Background(), list.Plugins[i].Network.Type, "CHECK", conf, r); err != nil {
			return fmt.Errorf("%s: %w", list.Plugins[i].Network.Type, err)
		}
	}
	return nil
}

// pluginConf is plugin i of list as a runtime hands it over: with the
// list's name and version and prev as prevResult (nil: none).
func pluginConf(list *libcni.NetworkConfigList, i int, prev *current.Result) ([]byte, error) {
	var plugin map[string]any
	if err := json.Unmarshal(list.Plugins[i].Bytes, &plugin); err != nil {
		return nil, err
	}
	plugin["cniVersion"], plugin["name"] = list.CNIVersion, list.Name
	if prev != nil {
		versioned, err := prev.GetAsVersion(list.CNIVersion)
		if err != nil {
			return nil, err
		}
		raw, err := json.Marshal(versioned)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, err
		}
		plugin["prevResult"] = m
	}
	return json.Marshal(plugin)
}

// pluginCmd is a plugin binary set up as a runtime execs it: CNI_* in the
// environment, conf on stdin, its own process group (so that what it
// forks can be waited for after it is killed).
func (f *fixture) pluginCmd(plugin, command string, conf []byte, r *libcni.RuntimeConf) (*exec.Cmd, *bytes.Buffer, *bytes.Buffer) {
	cmd := exec.Command(filepath.Join(binDir, plugin))
	cmd.Env = append(os.Environ(),
		"CNI_COMMAND="+command,
		"CNI_CONTAINERID="+r.ContainerID,
		"CNI_NETNS="+r.NetNS,
		"CNI_IFNAME="+r.IfName,
		"CNI_PATH="+binDir,
		"CNI_ARGS=",
	)
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, &stdout, &stderr
}

// startInHost starts cmd from the host netns (the plugin inherits the
// netns of the thread that forks it).
func (f *fixture) startInHost(cmd *exec.Cmd) error {
	return f.env.InHost(cmd.Start)
}

// exec runs a plugin to the end and returns its stdout, or its CNI error.
func (f *fixture) exec(ctx context.Context, plugin, command string, conf []byte, r *libcni.RuntimeConf) ([]byte, error) {
	cmd, stdout, stderr := f.pluginCmd(plugin, command, conf, r)
	if err := f.startInHost(cmd); err != nil {
		return nil, err
	}
	err := cmd.Wait()
	waitGroupGone(cmd.Process.Pid, 10*time.Second)
	if err != nil {
		return stdout.Bytes(), pluginError(plugin, command, err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

func pluginError(plugin, command string, err error, stdout, stderr []byte) error {
	var cniErr types.Error
	if json.Unmarshal(stdout, &cniErr) == nil && (cniErr.Code != 0 || cniErr.Msg != "") {
		return &cniErr
	}
	return fmt.Errorf("%s %s: %v: stdout %q stderr %q", plugin, command, err, stdout, stderr)
}

// execAdd runs napitap's ADD alone after prev (the previous plugin's
// result, nil when standalone) and returns the result it printed.
func (f *fixture) execAdd(list *libcni.NetworkConfigList, prev *current.Result, r *libcni.RuntimeConf) (*current.Result, error) {
	conf, err := pluginConf(list, len(list.Plugins)-1, prev)
	if err != nil {
		return nil, err
	}
	out, err := f.exec(context.Background(), "napitap", "ADD", conf, r)
	if err != nil {
		return nil, err
	}
	return parseResult(out)
}

func parseResult(out []byte) (*current.Result, error) {
	res, err := current.NewResult(out)
	if err != nil {
		return nil, fmt.Errorf("result %q: %w", out, err)
	}
	return current.NewResultFromResult(res)
}

// execDelChain runs DEL of every plugin of list, last first, each with
// final as prevResult (nil: none, as libcni sends after an ADD that never
// completed). afterNapitap, if not nil, runs between napitap's DEL and the
// previous plugins'.
func (f *fixture) execDelChain(list *libcni.NetworkConfigList, final *current.Result, r *libcni.RuntimeConf, afterNapitap func()) error {
	for i := len(list.Plugins) - 1; i >= 0; i-- {
		conf, err := pluginConf(list, i, final)
		if err != nil {
			return err
		}
		if _, err := f.exec(context.Background(), list.Plugins[i].Network.Type, "DEL", conf, r); err != nil {
			return fmt.Errorf("DEL %s: %w", list.Plugins[i].Network.Type, err)
		}
		if i == len(list.Plugins)-1 && afterNapitap != nil {
			afterNapitap()
		}
	}
	return nil
}

// execAddPrev runs the plugins before napitap (the bridge plugin) and
// returns their result, the prevResult napitap gets.
func (f *fixture) execAddPrev(list *libcni.NetworkConfigList, r *libcni.RuntimeConf) (*current.Result, error) {
	var prev *current.Result
	for i := 0; i < len(list.Plugins)-1; i++ {
		conf, err := pluginConf(list, i, prev)
		if err != nil {
			return nil, err
		}
		out, err := f.exec(context.Background(), list.Plugins[i].Network.Type, "ADD", conf, r)
		if err != nil {
			return nil, err
		}
		if prev, err = parseResult(out); err != nil {
			return nil, err
		}
	}
	return prev, nil
}

// primeHost runs the bridge plugin once, ADD and DEL, so that its bridge
// in the host netns (which its DEL keeps by design) is in every baseline.
func (f *fixture) primeHost(c tapConf) {
	f.t.Helper()
	c.Chained = true
	list := f.list("napitap-prime", c)
	list.Plugins = list.Plugins[:1]
	p := newPodNS(f.t, "prime")
	r := rt("prime-"+nstest.RandomSuffix(), p, "eth0")
	if _, err := f.env.Add(list, r); err != nil {
		f.t.Fatalf("priming the bridge plugin: %v", err)
	}
	if err := f.env.Del(list, r); err != nil {
		f.t.Fatalf("priming the bridge plugin: DEL: %v", err)
	}
	if err := p.Delete(); err != nil {
		f.t.Fatal(err)
	}
}

// waitGroupGone waits until no process is left in process group pgid: a
// plugin killed mid-ADD may have forked host-local, which runs on.
func waitGroupGone(pgid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for {
		if !groupAlive(pgid) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func groupAlive(pgid int) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:])
		if len(fields) > 2 && fields[2] == strconv.Itoa(pgid) && fields[0] != "Z" {
			return true
		}
	}
	return false
}

// inNetns runs fn in the netns at path.
func inNetns(path string, fn func() error) error {
	return ns.WithNetNSPath(path, func(ns.NetNS) error { return fn() })
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	return tail(string(b), n)
}

func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}
