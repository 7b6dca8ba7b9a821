// Package cnibench is `napitap-bench cni`: ADD and DEL latency (p50, p99)
// and peak RSS of napitap against the reference tap plugin, each plugin
// exec'd as a runtime does, interleaved in one run; then bursts of pods
// added and deleted concurrently, napitap's with their queues handed to a
// napitapd, and the kernel slab each pod costs.
// It writes cni.md and cni-latency.svg under --out.
package cnibench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/prometheus/procfs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
	"github.com/napitap/napitap/internal/nstest"
)

const (
	cniVersion  = "1.1.0"
	networkName = "napitap-bench"
	// The bench stops early once this many ADD/DEL have failed.
	maxFailures = 20
	// How many failure messages the report quotes.
	quotedFailures = 10
)

// Binaries the cni bench execs; all must be in the bin dir.
var binaries = []string{"napitap", "napitapd", "bridge", "host-local", "tap"}

type options struct {
	iterations, warmup int
	settle             time.Duration
	bursts             []int
	out, bin           string
	args               []string
	// napitapdNice runs napitapd under nice(1) at that value
	// (capacity): 0 is as the DaemonSet runs it.
	napitapdNice int
	// against is another napitap binary (an earlier commit's): every
	// napitap variant runs twice, interleaved, once with each.
	against string
	// only names the variants to run (the reference always runs).
	only []string
}

func parseFlags(args []string) (*options, error) {
	fs := flag.NewFlagSet("napitap-bench cni", flag.ContinueOnError)
	o := &options{args: args}
	fs.IntVar(&o.iterations, "iterations", 200, "interleaved ADD+DEL rounds of every variant")
	fs.IntVar(&o.warmup, "warmup", 3, "unrecorded rounds before the measured ones")
	fs.DurationVar(&o.settle, "settle", 50*time.Millisecond, "pause after each round's ADDs and after its DELs")
	bursts := fs.String("bursts", "1,50,200,500", "pods per concurrent burst, comma-separated (empty: no bursts)")
	fs.StringVar(&o.out, "out", "docs/bench", "directory for cni.md and cni-latency.svg")
	fs.StringVar(&o.bin, "bin", "", "directory with prebuilt "+strings.Join(binaries, ", ")+", and best "+launcherBin+" (default: build them into a temp dir)")
	fs.StringVar(&o.against, "against", "", "another napitap binary (say, an earlier commit's): each napitap variant also runs with it, interleaved, and the report gives this build's ratios to it")
	only := fs.String("variants", "", "comma-separated variant ids to run, of a, b, b4, c, d (default: all; a, the reference, always runs)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: napitap-bench cni [flags]   (as root)\n\n"+
			"ADD/DEL latency and peak RSS: (a) reference tap plugin, (b) napitap 1 plain queue, (b4) napitap 4 NAPI queues,\n"+
			"(c) bridge + napitap 4 NAPI tc-redirect, (d) the same with hand-off to napitapd; then concurrent bursts of napitap\n"+
			"(root qdisc noqueue, then mq) and the reference plugin's multiqueue tap, with the kernel slab per pod.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.against != "" {
		abs, err := filepath.Abs(o.against)
		if err != nil || !isExecutable(abs) {
			return nil, fmt.Errorf("--against %s: not an executable file", o.against)
		}
		o.against = abs
	}
	for _, id := range strings.Split(*only, ",") {
		if id = strings.TrimSpace(id); id != "" {
			o.only = append(o.only, id)
		}
	}
	if o.iterations < 1 || o.warmup < 0 || o.settle < 0 {
		return nil, fmt.Errorf("--iterations must be at least 1, --warmup and --settle at least 0")
	}
	for _, f := range strings.Split(*bursts, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 1000 {
			return nil, fmt.Errorf("--bursts: %q is not a pod count in 1..1000", f)
		}
		o.bursts = append(o.bursts, n)
	}
	return o, nil
}

// Main runs the benchmark with command-line args.
func Main(args []string) error {
	if os.Getenv(launcherEnv) == "1" {
		return launch.Main(args)
	}
	opt, err := parseFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	b := &bench{opt: opt, suffix: nstest.RandomSuffix(), ctx: ctx, name: "cni", need: binaries}
	err = b.run(ctx)
	if cerr := b.cleanup(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// bench is one run: what it made (to undo) and what it measured.
type bench struct {
	opt      *options
	name     string   // the subcommand: cni or capacity
	need     []string // the binaries it execs
	suffix   string
	tmp      string
	binDir   string
	build    string
	host     *netNS
	daemon   *daemon
	fdstore  *child // capacity: the napitap-fdstore every napitapd of the run keeps its copies in
	launcher *launcher
	daemons  int // napitapds started, for their log files' names

	undo []func() error // LIFO
	ctx  context.Context

	mu       sync.Mutex
	failures int
	messages []string
}

func (b *bench) onCleanup(fn func() error) { b.undo = append(b.undo, fn) }

// cleanup undoes everything in reverse, whatever failed before.
func (b *bench) cleanup() error {
	var errs []error
	for i := len(b.undo) - 1; i >= 0; i-- {
		if err := b.undo[i](); err != nil {
			fmt.Fprintf(os.Stderr, "napitap-bench %s: cleanup: %v\n", b.name, err)
			errs = append(errs, err)
		}
	}
	b.undo = nil
	return errors.Join(errs...)
}

func (b *bench) fail(format string, a ...any) {
	if b.ctx != nil && b.ctx.Err() != nil {
		return // interrupted: what fails now is the interruption's doing
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if len(b.messages) < quotedFailures {
		b.messages = append(b.messages, fmt.Sprintf(format, a...))
	}
	fmt.Fprintf(os.Stderr, "napitap-bench "+b.name+": FAIL: "+format+"\n", a...)
}

func (b *bench) failed() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.failures
}

// prepare checks the machine, and makes the temp dir, the binaries, the
// host netns (lo up), the launcher and napitapd: what every subcommand
// runs on. beforeDaemon, if set, starts what napitapd needs first and
// returns napitapd's extra flags.
func (b *bench) prepare(ctx context.Context, beforeDaemon func() ([]string, error)) error {
	if os.Geteuid() != 0 {
		return errors.New("needs root (network namespaces, taps)")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("needs /dev/net/tun: %w", err)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("needs ip (iproute2) for ip netns")
	}
	if err := os.MkdirAll(b.opt.out, 0o755); err != nil {
		return err
	}
	var err error
	if b.tmp, err = os.MkdirTemp("", "napitap-bench-"+b.name+"-"); err != nil {
		return err
	}
	b.onCleanup(func() error { return os.RemoveAll(b.tmp) })
	if err := b.binaries(ctx); err != nil {
		return err
	}
	if b.host, err = b.newNetNS("host"); err != nil {
		return err
	}
	if err := b.host.Do(func(ns.NetNS) error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		return fmt.Errorf("host netns %s: lo up: %w", b.host.Name, err)
	}
	if b.launcher, err = b.startLauncher(); err != nil {
		return err
	}
	var flags []string
	if beforeDaemon != nil {
		if flags, err = beforeDaemon(); err != nil {
			return err
		}
	}
	b.daemon, err = b.startDaemon(flags...)
	return err
}

func (b *bench) run(ctx context.Context) error {
	rep := &Report{
		CommandLine: commandLine(b.name, b.opt.args),
		Started:     time.Now(),
		Machine:     machineInfo(),
		Iterations:  b.opt.iterations,
		Warmup:      b.opt.warmup,
		Settle:      b.opt.settle,
	}
	if err := b.prepare(ctx, nil); err != nil {
		return err
	}
	rep.Build = b.build

	variants, err := b.variants()
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "napitap-bench cni: %d variants, %d warm-up + %d iterations, bins in %s\n", len(variants), b.opt.warmup, b.opt.iterations, b.binDir)
	loopErr := b.interleaved(ctx, variants)
	for _, v := range variants {
		rep.Variants = append(rep.Variants, *v.res)
	}
	rep.RSSFloor = b.launcherHWM()
	if loopErr == nil {
		b.checkLeftovers(variants)
		if rep.DaemonIdle, err = b.daemon.stats(); err != nil {
			b.fail("napitapd stats: %v", err)
		}
		if len(b.opt.bursts) > 0 {
			rep.Bursts, loopErr = b.bursts(ctx)
			rep.BurstRSSFloor = b.launcherHWM()
		}
	}

	if loopErr != nil {
		rep.Incomplete = loopErr.Error()
	}
	rep.Machine.LoadEnd = loadAvg()
	rep.Elapsed = time.Since(rep.Started)
	rep.FailureCount, rep.Failures = b.failed(), b.messages
	md, svg := rep.Markdown(), rep.SVG()
	if err := os.WriteFile(filepath.Join(b.opt.out, "cni.md"), []byte(md), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.opt.out, "cni-latency.svg"), []byte(svg), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "napitap-bench cni: wrote %s and %s\n", filepath.Join(b.opt.out, "cni.md"), filepath.Join(b.opt.out, "cni-latency.svg"))
	if loopErr != nil {
		return loopErr
	}
	if n := rep.FailureCount; n > 0 {
		return fmt.Errorf("%d ADD/DEL failures (see %s)", n, filepath.Join(b.opt.out, "cni.md"))
	}
	return nil
}

// binaries finds or builds every plugin the bench execs.
func (b *bench) binaries(ctx context.Context) error {
	if b.opt.bin != "" {
		dir, err := filepath.Abs(b.opt.bin)
		if err != nil {
			return err
		}
		for _, name := range b.need {
			if !isExecutable(filepath.Join(dir, name)) {
				return fmt.Errorf("--bin %s: no executable %s", dir, name)
			}
		}
		b.binDir, b.build = dir, "prebuilt, --bin "+dir
		// A plugin built with cgo pays the dynamic loader on every exec,
		// which the bench's own builds never do.
		if dyn := dynamicallyLinked(dir, b.need); len(dyn) > 0 {
			b.build += " (dynamically linked: " + strings.Join(dyn, ", ") + ")"
		}
		if !isExecutable(filepath.Join(dir, launcherBin)) {
			b.build += " (no " + launcherBin + " there: the bench re-execs itself to launch plugins, a higher RSS floor)"
		}
		return nil
	}
	b.binDir = filepath.Join(b.tmp, "bin")
	start := time.Now()
	fmt.Fprintf(os.Stderr, "napitap-bench %s: building %s ...\n", b.name, strings.Join(b.need, ", "))
	desc, err := buildAll(ctx, b.binDir)
	if err != nil {
		return err
	}
	b.build = desc
	fmt.Fprintf(os.Stderr, "napitap-bench %s: built in %s\n", b.name, time.Since(start).Round(time.Millisecond))
	return nil
}

// launcherHWM is the launcher's VmHWM: the floor of the RSS it reports.
func (b *bench) launcherHWM() int64 {
	st, err := procStats(b.launcher.pid())
	if err != nil {
		b.fail("launcher stats: %v", err)
	}
	return st.VmHWM
}

// --- network namespaces

// netNS is a pod's or the host's netns of the run.
type netNS = nstest.NetNS

// newNetNS makes /run/netns/napitap-bench-<suffix>-<role>; cleanup deletes it.
func (b *bench) newNetNS(role string) (*netNS, error) {
	n, err := nstest.Add("napitap-bench-" + b.suffix + "-" + role)
	if err != nil {
		return nil, err
	}
	b.onCleanup(n.Delete)
	return n, nil
}

// linksOf lists the links of a netns other than lo.
func linksOf(n *netNS) ([]string, error) {
	var names []string
	err := n.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				names = append(names, l.Attrs().Name+"/"+l.Type())
			}
		}
		return nil
	})
	return names, err
}

// --- plugin execs

// run is one plugin process.
type run struct {
	Pid    int // set by execNow
	Wall   time.Duration
	CPU    time.Duration // user+sys
	Sys    time.Duration
	MaxRSS int64 // bytes
	Stdout []byte
	Err    error
}

type invocation struct {
	Plugin, Command, ContainerID, Netns, IfName string
	Conf                                        []byte
	// Exe, if set, is the plugin's binary, else Plugin in the bin dir.
	Exe string
}

// exec runs one plugin through the launcher, from the host netns, as
// libcni's invoke.RawExec does: CNI_* in the environment, the config on
// stdin, the result on stdout.
func (b *bench) exec(ctx context.Context, inv invocation) run {
	if err := ctx.Err(); err != nil {
		return run{Err: err}
	}
	res, err := b.launcher.batch([]launch.Req{b.request(inv)})
	if err != nil {
		return run{Err: err}
	}
	return toRun(inv, res.Results[0])
}

// request is the exec of inv: the environment is invoke.Args.AsEnv's, the
// bench's own with the CNI_* variables set; the launcher adds the rest of
// it (baseEnv) to the CNI_* ones sent here.
func (b *bench) request(inv invocation) launch.Req {
	var env []string
	for _, kv := range (&invoke.Args{
		Command:     inv.Command,
		ContainerID: inv.ContainerID,
		NetNS:       inv.Netns,
		IfName:      inv.IfName,
		Path:        b.binDir,
	}).AsEnv() {
		if strings.HasPrefix(kv, "CNI_") {
			env = append(env, kv)
		}
	}
	exe := inv.Exe
	if exe == "" {
		exe = filepath.Join(b.binDir, inv.Plugin)
	}
	return launch.Req{Argv: []string{exe}, Env: env, Stdin: inv.Conf}
}

// baseEnv is the bench's environment without CNI_* variables.
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_") {
			env = append(env, kv)
		}
	}
	return env
}

func toRun(inv invocation, res launch.Res) run {
	r := run{Wall: res.Wall, CPU: res.CPU, Sys: res.Sys, MaxRSS: res.MaxRSS, Stdout: res.Stdout}
	switch {
	case res.Err != "":
		r.Err = errors.New(res.Err)
	case res.Signal != "":
		r.Err = pluginError(fmt.Errorf("killed by %s", res.Signal), res.Stdout, res.Stderr)
	case res.Status != 0:
		r.Err = pluginError(fmt.Errorf("exit status %d", res.Status), res.Stdout, res.Stderr)
	case inv.Command == "ADD" && !json.Valid(res.Stdout):
		r.Err = fmt.Errorf("ADD printed no JSON result: %q", trim(res.Stdout))
	}
	return r
}

// pluginError prefers the CNI error the plugin printed.
func pluginError(err error, stdout, stderr []byte) error {
	var cniErr types.Error
	if json.Unmarshal(stdout, &cniErr) == nil && cniErr.Msg != "" {
		return fmt.Errorf("%v: CNI error %d: %s %s (stderr %q)", err, cniErr.Code, cniErr.Msg, cniErr.Details, trim(stderr))
	}
	return fmt.Errorf("%v: stdout %q, stderr %q", err, trim(stdout), trim(stderr))
}

func trim(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 400 {
		s = s[:400] + "..."
	}
	return s
}

// --- napitapd and napitap-fdstore

// child is a daemon of the run (napitapd, napitap-fdstore), its output in
// a log file, in a process group of its own: a ^C for the bench must not
// take it down before the bench has released what it holds.
type child struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func startChild(name, log string, argv ...string) (*child, error) {
	logf, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	c := &child{name: name, cmd: exec.Command(argv[0], argv[1:]...), log: log, done: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() { c.err = c.cmd.Wait(); close(c.done) }()
	return c, nil
}

// waitFor polls ready for 10 s, failing early if the child exits.
func (c *child) waitFor(what string, ready func() bool) error {
	for deadline := time.Now().Add(10 * time.Second); !ready(); {
		select {
		case <-c.done:
			return fmt.Errorf("%s exited at start: %v: %s", c.name, c.err, c.logTail())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %s after 10 s: %s", c.name, what, c.logTail())
		}
	}
	return nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// terminate sends SIGTERM to the child's PID, then SIGKILL after 5 s.
func (c *child) terminate() error {
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
		return nil
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s (pid %d) ignored SIGTERM for 5 s; killed", c.name, c.pid())
	}
}

func (c *child) logText() string {
	b, _ := os.ReadFile(c.log)
	return string(b)
}

func (c *child) logTail() string {
	s := c.logText()
	if len(s) > 1000 {
		s = s[len(s)-1000:]
	}
	return strings.TrimSpace(s)
}

type daemon struct {
	*child
	socket, seccomp string
	// replaced: a takeover or a SIGKILL was meant to end it.
	replaced bool
}

// daemonDir is where every napitapd of the run has its sockets and state:
// a second one started there takes over from the first.
func (b *bench) daemonDir() string { return filepath.Join(b.tmp, "napitapd") }

// startDaemon runs a napitapd, with flags, on the sockets and state dir of
// the run's own; cleanup stops it by its PID. Started while another
// serves there, it takes everything over from it.
func (b *bench) startDaemon(flags ...string) (*daemon, error) {
	dir := b.daemonDir()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	b.daemons++
	d := &daemon{socket: filepath.Join(dir, "napitapd.sock"), seccomp: filepath.Join(dir, "seccomp.sock")}
	// A sweep lists every attachment's netns and tap; keep it out of the timings.
	argv := append([]string{filepath.Join(b.binDir, "napitapd"), "--socket", d.socket, "--state-dir", filepath.Join(dir, "state"), "--sweep-interval", "24h",
		"--seccomp-socket", d.seccomp}, flags...)
	if b.opt.napitapdNice != 0 {
		// nice(1) execs napitapd in the same process, every thread
		// started from one at that value.
		argv = append([]string{"nice", "-n", strconv.Itoa(b.opt.napitapdNice)}, argv...)
	}
	var err error
	if d.child, err = startChild("napitapd", filepath.Join(dir, fmt.Sprintf("napitapd-%d.log", b.daemons)), argv...); err != nil {
		return nil, err
	}
	b.onCleanup(d.stop)
	serving := func() bool { return strings.Contains(d.logText(), "msg=serving") }
	if err := d.waitFor("socket "+d.socket, serving); err != nil {
		return nil, err
	}
	return d, nil
}

// stop ends napitapd (terminate), unless a takeover or a SIGKILL did.
func (d *daemon) stop() error {
	if !d.alive() {
		if d.replaced {
			return nil
		}
		return fmt.Errorf("napitapd had exited: %v: %s", d.err, d.logTail())
	}
	return d.terminate()
}

// stats reads napitapd's VmRSS, VmHWM and open fds from /proc.
func (d *daemon) stats() (DaemonStats, error) {
	return procStats(d.pid())
}

func procStats(pid int) (DaemonStats, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return DaemonStats{}, err
	}
	st, err := p.NewStatus()
	if err != nil {
		return DaemonStats{}, err
	}
	fds, err := p.FileDescriptorsLen()
	return DaemonStats{VmRSS: int64(st.VmRSS), VmHWM: int64(st.VmHWM), FDs: fds}, err
}

// --- machine

func commandLine(sub string, args []string) string {
	parts := []string{"napitap-bench", sub}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$\\;&|<>*?") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

func machineInfo() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), CPUModel: "unknown", LoadStart: loadAvg()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel, m.KernelVersion = unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:])
	}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if cpus, err := fs.CPUInfo(); err == nil && len(cpus) > 0 {
			m.CPUModel = cpus[0].ModelName
		}
	}
	return m
}

func loadAvg() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "?"
}
