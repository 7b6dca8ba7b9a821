package cnibench

// `napitap-bench capacity`: N VM pods started at once, as a node full of
// them starts after a drain, against one napitapd beside its
// napitap-fdstore; then, with all N running, a takeover by a new napitapd
// and a SIGKILL of it; then the N stopped and deleted at once. The
// reference tap plugin's ADD and DEL of N pods at once come first, in the
// same run.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
)

// capacityBinaries: the cni bench's, and what runs the VMs and holds
// napitapd's fds across its SIGKILL.
var capacityBinaries = []string{"napitap", "napitapd", "napitapctl", "napitap-fdstore", "tap"}

const (
	capacityIfName = "tap0"
	// vmTimeout bounds how long a VM may take to hold its queues.
	vmTimeout = 2 * time.Minute
)

type capacityOptions struct {
	pods   []int
	queues int
	split  map[int]bool // the Ns whose ADDs perf sched splits
	// napitapConf: keys set in every napitap pod's network config, over
	// the bench's own (the knobs' cost in a burst, threadedNapi's say).
	napitapConf map[string]any
}

func parseCapacityFlags(args []string) (*options, *capacityOptions, error) {
	fs := flag.NewFlagSet("napitap-bench capacity", flag.ContinueOnError)
	o, c := &options{args: args}, &capacityOptions{}
	pods := fs.String("pods", "1,10,50,110", "VM pods started at once, comma-separated, each count in turn")
	fs.IntVar(&c.queues, "queues", 4, "queues per VM pod")
	fs.StringVar(&o.out, "out", "docs/bench", "directory for capacity.md and capacity.svg")
	split := fs.String("split", "", "for these N (comma-separated), record the scheduler's events with `perf sched record` while the pods start, and split each ADD's wall time into on-CPU, waiting to run and blocked, by what it blocked on (perf's own CPU is part of the burst then)")
	napitapConf := fs.String("napitap-conf", "", `JSON object of keys set in each napitap pod's network config, over the bench's (e.g. '{"threadedNapi":false}')`)
	fs.IntVar(&o.napitapdNice, "napitapd-nice", 0, "run napitapd at this nice value (-20..19): how much of an intercepted TUNSETIFF under a burst is waiting for a CPU")
	fs.StringVar(&o.bin, "bin", "", "directory with prebuilt "+strings.Join(capacityBinaries, ", ")+", and best "+launcherBin+" (default: build them into a temp dir)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: napitap-bench capacity [flags]   (as root)\n\n"+
			"For each N: the reference tap plugin's ADD and DEL of N pods at once; then N VM pods at once, each an ADD\n"+
			"of a 4-queue NAPI tap in its own netns and then a VM opening its queues, half by name after handing its seccomp\n"+
			"listener to napitapd as runc does (the agent intercepts their TUNSETIFF), half from napitapd's hand-off\n"+
			"(`napitapctl exec`); with all N\n"+
			"running, napitapd's memory and fds, a takeover by a new napitapd, and a SIGKILL of that one until the next\n"+
			"serves again through napitap-fdstore; then the VMs stopped and the N DELs at once.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.queues < 1 || c.queues > handoff.MaxFDs {
		return nil, nil, fmt.Errorf("--queues %d: want 1..%d (fds mode hands them over in one message)", c.queues, handoff.MaxFDs)
	}
	if o.napitapdNice < -20 || o.napitapdNice > 19 {
		return nil, nil, fmt.Errorf("--napitapd-nice %d: want -20..19", o.napitapdNice)
	}
	for _, f := range strings.Split(*pods, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 500 {
			return nil, nil, fmt.Errorf("--pods: %q is not a pod count in 1..500", f)
		}
		c.pods = append(c.pods, n)
	}
	c.split = map[int]bool{}
	for _, f := range strings.FieldsFunc(*split, func(r rune) bool { return r == ',' }) {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || !slices.Contains(c.pods, n) {
			return nil, nil, fmt.Errorf("--split: %q is not one of --pods", f)
		}
		c.split[n] = true
	}
	if *napitapConf != "" {
		if err := json.Unmarshal([]byte(*napitapConf), &c.napitapConf); err != nil {
			return nil, nil, fmt.Errorf("--napitap-conf: %w", err)
		}
	}
	return o, c, nil
}

// CapacityMain runs `napitap-bench capacity` with command-line args.
func CapacityMain(args []string) error {
	opt, copt, err := parseCapacityFlags(args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	b := &bench{opt: opt, suffix: nstest.RandomSuffix(), ctx: ctx, name: "capacity", need: capacityBinaries}
	err = b.capacity(ctx, copt)
	if cerr := b.cleanup(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

func (b *bench) capacity(ctx context.Context, copt *capacityOptions) error {
	rep := &CapacityReport{CommandLine: commandLine(b.name, b.opt.args), Started: time.Now(), Machine: machineInfo(), Queues: copt.queues}
	// napitap-fdstore, the DaemonSet's sidecar, listens before napitapd
	// starts, and every napitapd of the run keeps its copies there.
	var daemonFlags []string
	if err := b.prepare(ctx, func() ([]string, error) {
		holder := filepath.Join(b.daemonDir(), "fdstore.sock")
		daemonFlags = []string{"--fdstore-socket", holder}
		var err error
		b.fdstore, err = b.startFDStore(holder)
		return daemonFlags, err
	}); err != nil {
		return err
	}
	rep.Build = b.build

	most := slices.Max(copt.pods)
	fmt.Fprintf(os.Stderr, "napitap-bench capacity: making %d pod netns\n", most)
	pods := make([]*netNS, most)
	for i := range pods {
		var err error
		if pods[i], err = b.newNetNS(fmt.Sprintf("vm-%03d", i)); err != nil {
			return err
		}
	}
	var loopErr error
	for _, n := range copt.pods {
		row := CapacityRow{Pods: n}
		b.capacityRef(ctx, copt, &row, pods[:n])
		if err := ctx.Err(); err != nil {
			loopErr = err
			break
		}
		if err := b.capacityRound(ctx, copt, &row, pods[:n], daemonFlags); err != nil {
			rep.Rows = append(rep.Rows, row)
			loopErr = err
			break
		}
		fmt.Fprintf(os.Stderr, "napitap-bench capacity: N=%d: ADD p99 %s (tap %s), to NAPI p99 %s, TUNSETIFF p99 %s, napitapd %s %d fds, takeover %s, SIGKILL to serving %s, DEL p99 %s\n",
			n, fmtDur(Percentile(row.Add.Wall, 99)), fmtDur(Percentile(row.RefAdd.Wall, 99)), fmtDur(Percentile(row.ToNAPI, 99)), fmtMicros(Percentile(row.TUNSETIFF, 99)),
			fmtMiB(row.Holding.VmRSS), row.Holding.FDs, fmtDur(row.Takeover), fmtDur(row.KillToServing), fmtDur(Percentile(row.Del.Wall, 99)))
		rep.Rows = append(rep.Rows, row)
		if f := b.failed(); f >= maxFailures {
			loopErr = fmt.Errorf("stopped after %d failures", f)
			break
		}
	}
	if loopErr != nil {
		rep.Incomplete = loopErr.Error()
	}
	rep.Machine.LoadEnd = loadAvg()
	rep.Elapsed = time.Since(rep.Started)
	rep.FailureCount, rep.Failures = b.failed(), b.messages
	md, svg := rep.Markdown(), rep.SVG()
	mdPath, svgPath := filepath.Join(b.opt.out, "capacity.md"), filepath.Join(b.opt.out, "capacity.svg")
	if err := os.WriteFile(mdPath, []byte(md), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(svgPath, []byte(svg), 0o644); err != nil {
		return err
	}
	if split := rep.SplitSVG(); split != "" {
		if err := os.WriteFile(filepath.Join(b.opt.out, "capacity-split.svg"), []byte(split), 0o644); err != nil {
			return err
		}
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "napitap-bench capacity: wrote %s and %s\n", mdPath, svgPath)
	if loopErr != nil {
		return loopErr
	}
	if n := rep.FailureCount; n > 0 {
		return fmt.Errorf("%d failures (see %s)", n, mdPath)
	}
	return nil
}

// startFDStore runs napitap-fdstore on socket, as the DaemonSet's sidecar
// beside napitapd; cleanup stops it by its PID, after every napitapd.
func (b *bench) startFDStore(socket string) (*child, error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o700); err != nil {
		return nil, err
	}
	c, err := startChild("napitap-fdstore", filepath.Join(filepath.Dir(socket), "fdstore.log"),
		filepath.Join(b.binDir, "napitap-fdstore"), "--socket", socket)
	if err != nil {
		return nil, err
	}
	b.onCleanup(c.terminate)
	return c, c.waitFor("socket "+socket, func() bool {
		st, err := os.Stat(socket)
		return err == nil && st.Mode()&os.ModeSocket != 0
	})
}

// capacityRef: the reference plugin's multiqueue tap in every pod at once,
// each pod's VM opening its queues by name as soon as its ADD is back (no
// agent: the kernel's own TUNSETIFF, without NAPI), then the DELs at once.
func (b *bench) capacityRef(ctx context.Context, copt *capacityOptions, row *CapacityRow, pods []*netNS) {
	conf, err := stepConf(step{typ: "tap", conf: map[string]any{"type": "tap", "multiQueue": true}}, nil)
	if err != nil {
		b.fail("tap config: %v", err)
		return
	}
	n := len(pods)
	prefix := fmt.Sprintf("napitap-bench-%s-cap%d-tap-", b.suffix, n)
	vms := make([]*vmPod, n)
	for i := range vms {
		vms[i] = &vmPod{i: i, pod: pods[i], cid: prefix + strconv.Itoa(i), conf: conf, plain: true}
	}
	inv := func(v *vmPod, command string) invocation {
		return invocation{Plugin: "tap", Command: command, ContainerID: v.cid, Netns: v.pod.Path(), IfName: capacityIfName, Conf: v.conf}
	}
	row.RefBurst, row.RefSplit = b.measuredStart(ctx, "tap", vms, inv, copt, nil)
	for _, v := range vms {
		switch {
		case v.add.Err != nil:
			row.RefFailures++
			b.fail("tap ADD %s: %v", v.cid, v.add.Err)
			continue
		case v.vm == nil:
			row.RefFailures++
		default:
			row.RefToQueues = append(row.RefToQueues, v.toNAPI)
			row.RefTUNSETIFF = append(row.RefTUNSETIFF, v.ready.TUNSETIFF...)
			if err := v.vm.stop(); err != nil {
				b.fail("N=%d: VM of %s: %v", n, v.cid, err)
			}
			row.RefBurst.VMs += v.vm.cpu
		}
		row.RefAdd.Add(v.add.Wall, v.add.CPU, v.add.MaxRSS)
		row.RefAdd.SysTotal += v.add.Sys
	}
	_ = b.settle(ctx)
	dels := b.execAll(context.Background(), n, func(i int) invocation { return inv(vms[i], "DEL") })
	b.tallyInto(&row.RefDel, &row.RefFailures, "tap DEL", prefix, dels)
}

// execAll runs n execs at once, each from a goroutine of its own.
func (b *bench) execAll(ctx context.Context, n int, inv func(i int) invocation) []run {
	runs := make([]run, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { runs[i] = b.execNow(ctx, inv(i)) })
	}
	wg.Wait()
	return runs
}

func (b *bench) tallyInto(s *Series, failures *int, what, prefix string, runs []run) {
	for i, r := range runs {
		if r.Err != nil {
			*failures++
			b.fail("%s %s%d: %v", what, prefix, i, r.Err)
			continue
		}
		s.Add(r.Wall, r.CPU, r.MaxRSS)
		s.SysTotal += r.Sys
	}
}

// execNow runs one plugin exec from the host netns at once, not through
// the launcher: a pod's VM starts as soon as its own ADD is done, as the
// kubelet starts a pod's containers, where the launcher answers a batch
// once all of it is done. Its RSS floor is the bench's, so the capacity
// bench reports no plugin RSS.
func (b *bench) execNow(ctx context.Context, inv invocation) run {
	if err := ctx.Err(); err != nil {
		return run{Err: err}
	}
	req := b.request(inv)
	cmd := exec.Command(req.Argv[0], req.Argv[1:]...)
	cmd.Env = append(baseEnv(), req.Env...)
	// Files, not readers and writers: os/exec would copy those through
	// goroutines of the bench's, and under a burst a plugin would wait
	// for the bench to get a CPU before it could read its config.
	stdin, err := launch.FilledPipe(req.Stdin)
	if err != nil {
		return run{Err: err}
	}
	defer stdin.Close()
	stdout, err := launch.MemFile("stdout")
	if err != nil {
		return run{Err: err}
	}
	defer stdout.Close()
	stderr, err := launch.MemFile("stderr")
	if err != nil {
		return run{Err: err}
	}
	defer stderr.Close()
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	var startErr error
	start := time.Now()
	if err := b.host.Do(func(ns.NetNS) error { startErr = cmd.Start(); return nil }); err != nil {
		return run{Err: err}
	}
	if startErr != nil {
		return run{Err: fmt.Errorf("start %s %s: %w", inv.Plugin, inv.Command, startErr)}
	}
	_ = cmd.Wait()
	pid := cmd.Process.Pid
	res := launch.Res{Wall: time.Since(start), Status: -1, Stdout: launch.ReadAll(stdout), Stderr: launch.ReadAll(stderr)}
	if ps := cmd.ProcessState; ps != nil {
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			res.Sys = time.Duration(syscall.TimevalToNsec(ru.Stime))
			res.CPU = time.Duration(syscall.TimevalToNsec(ru.Utime)) + res.Sys
			res.MaxRSS = ru.Maxrss * 1024
		}
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			res.Signal = ws.Signal().String()
		} else {
			res.Status = ps.ExitCode()
		}
	}
	r := toRun(inv, res)
	r.Pid = pid
	return r
}

// vmPod is one VM pod: its ADD, then its VM.
type vmPod struct {
	i      int
	pod    *netNS
	cid    string
	fds    bool // fds mode: the VM gets its queues from napitapd's hand-off
	plain  bool // the reference plugin's pod: its VM opens the tap itself, no agent
	conf   []byte
	add    run
	toNAPI time.Duration
	ready  launch.VMReady
	vm     *vmProc
}

// capacityRound starts len(pods) VM pods at once, measures napitapd
// holding them, takes it over, SIGKILLs it, then stops and deletes them.
func (b *bench) capacityRound(ctx context.Context, copt *capacityOptions, row *CapacityRow, pods []*netNS, daemonFlags []string) error {
	n := len(pods)
	prefix := fmt.Sprintf("napitap-bench-%s-cap%d-vm-", b.suffix, n)
	confs := map[string][]byte{}
	vms := make([]*vmPod, n)
	for i := range vms {
		v := &vmPod{i: i, pod: pods[i], cid: prefix + strconv.Itoa(i), fds: i%2 == 1}
		if confs[v.mode()] == nil {
			extra := map[string]any{"handoff": map[string]any{"socket": b.daemon.socket, "mode": v.mode(), "required": true}}
			maps.Copy(extra, copt.napitapConf)
			conf, err := stepConf(step{typ: "napitap", conf: napitapConf(copt.queues, true, extra)}, nil)
			if err != nil {
				return err
			}
			confs[v.mode()] = conf
		}
		v.conf, vms[i] = confs[v.mode()], v
	}
	inv := func(v *vmPod, command string) invocation {
		return invocation{Plugin: "napitap", Command: command, ContainerID: v.cid, Netns: v.pod.Path(), IfName: capacityIfName, Conf: v.conf}
	}

	var err error
	if row.Idle, err = b.daemon.stats(); err != nil {
		b.fail("N=%d: napitapd stats: %v", n, err)
	}
	row.Burst, row.Split = b.measuredStart(ctx, "napitap", vms, inv, copt, []int{b.daemon.pid(), b.fdstore.cmd.Process.Pid})
	running := 0
	for _, v := range vms {
		if v.add.Err != nil {
			row.AddFailures++
			b.fail("N=%d: napitap ADD %s: %v", n, v.cid, v.add.Err)
			continue
		}
		row.Add.Add(v.add.Wall, v.add.CPU, v.add.MaxRSS)
		row.Add.SysTotal += v.add.Sys
		if v.vm == nil {
			row.VMFailures++
			continue
		}
		running++
		row.ToNAPI = append(row.ToNAPI, v.toNAPI)
		row.TUNSETIFF = append(row.TUNSETIFF, v.ready.TUNSETIFF...)
	}
	row.Running = running

	// With all N running: what napitapd holds, then a takeover and a
	// SIGKILL, each checked to lose nothing.
	if row.Holding, err = b.daemon.stats(); err != nil {
		b.fail("N=%d: napitapd stats: %v", n, err)
	}
	b.checkHeld(fmt.Sprintf("N=%d, all running", n), prefix, n-row.AddFailures)
	if row.Takeover, row.TakeoverWall, err = b.takeover(daemonFlags); err != nil {
		b.fail("N=%d: takeover: %v", n, err)
	} else {
		b.checkHeld(fmt.Sprintf("N=%d, after the takeover", n), prefix, n-row.AddFailures)
	}
	if row.KillToServing, err = b.killAndRestart(daemonFlags); err != nil {
		b.fail("N=%d: SIGKILL and restart: %v", n, err)
	} else {
		b.checkHeld(fmt.Sprintf("N=%d, after the SIGKILL", n), prefix, n-row.AddFailures)
	}
	if row.After, err = b.daemon.stats(); err != nil {
		b.fail("N=%d: napitapd stats: %v", n, err)
	}

	// The runtime stops the VMs, then the kubelet deletes the pods.
	for _, v := range vms {
		if v.vm != nil {
			if err := v.vm.stop(); err != nil {
				b.fail("N=%d: VM of %s: %v", n, v.cid, err)
			}
			row.Burst.VMs += v.vm.cpu
		}
	}
	_ = b.settle(ctx)
	dels := b.execAll(context.Background(), n, func(i int) invocation { return inv(vms[i], "DEL") })
	b.tallyInto(&row.Del, &row.DelFailures, "napitap DEL", prefix, dels)
	b.checkHeld(fmt.Sprintf("N=%d, after DEL", n), prefix, 0)
	for _, pod := range pods {
		if links, err := linksOf(pod); err != nil || len(links) > 0 {
			b.fail("N=%d: pod netns %s after DEL: links %v, err %v", n, pod.Name, links, err)
		}
	}
	return ctx.Err()
}

// mode is how v's VM gets its queues: napitap's handoff mode, or plain
// for the reference plugin's pod.
func (v *vmPod) mode() string {
	switch {
	case v.plain:
		return "plain"
	case v.fds:
		return "fds"
	}
	return "intercept"
}

// startPods starts every pod at once: its ADD, then its VM as soon as the
// ADD is back, as the kubelet starts a pod's containers; "to NAPI" runs
// from the ADD's start to the VM holding its queues.
func (b *bench) startPods(ctx context.Context, vms []*vmPod, inv func(*vmPod, string) invocation, queues int) {
	var wg sync.WaitGroup
	for _, v := range vms {
		wg.Go(func() {
			start := time.Now()
			if v.add = b.execNow(ctx, inv(v, "ADD")); v.add.Err != nil {
				return
			}
			var err error
			if v.vm, v.ready, err = b.startVM(v, queues); err != nil {
				b.fail("N=%d: VM of %s (%s): %v", len(vms), v.cid, v.mode(), err)
				return
			}
			v.toNAPI = time.Unix(0, v.ready.At).Sub(start)
		})
	}
	wg.Wait()
}

// measuredStart starts the pods (startPods) and accounts for the CPU every
// process spent meanwhile; for an N of --split it also splits each ADD's
// wall time from the scheduler's events. The VMs' CPU is theirs to add
// when they stop (vmProc.cpu).
func (b *bench) measuredStart(ctx context.Context, kind string, vms []*vmPod, inv func(*vmPod, string) invocation, copt *capacityOptions, daemons []int) (BurstCPU, *SplitSummary) {
	var rec *schedRecord
	if copt.split[len(vms)] {
		var err error
		if rec, err = startSchedRecord(filepath.Join(b.tmp, fmt.Sprintf("sched-%s-%d.data", kind, len(vms)))); err != nil {
			b.fail("N=%d: %v", len(vms), err)
		}
	}
	start := markCPU(daemons...)
	b.startPods(ctx, vms, inv, copt.queues)
	var c BurstCPU
	c.since(start, markCPU(daemons...))
	for _, v := range vms {
		c.Plugins += v.add.CPU
	}
	if rec == nil {
		return c, nil
	}
	var err error
	if c.Perf, err = rec.stop(); err != nil {
		b.fail("N=%d: %v", len(vms), err)
		return c, nil
	}
	var pids []int
	for _, v := range vms {
		pids = append(pids, v.add.Pid)
	}
	splits, kthreads, err := rec.split(pids)
	if err != nil {
		b.fail("N=%d: %v", len(vms), err)
		return c, nil
	}
	c.KernelThreads = kthreads
	return c, summarize(vms, splits)
}

// checkHeld: napitapd lists want attachments of the round's, each fds-mode
// one holding its queues or handed them over.
func (b *bench) checkHeld(when, prefix string, want int) {
	list, err := (&handoff.Client{Socket: b.daemon.socket}).List()
	if err != nil {
		b.fail("%s: napitapd list: %v", when, err)
		return
	}
	got := 0
	for _, a := range list {
		if strings.HasPrefix(a.Key.ContainerID, prefix) {
			got++
		}
	}
	if got != want {
		b.fail("%s: napitapd lists %d attachments, want %d", when, got, want)
	}
}

var tookRE = regexp.MustCompile(`tookOver=true took=(\S+)`)

// takeover starts a new napitapd on the running one's paths and waits for
// the old one to exit 0. took is what the new one logs, from its request
// to serving; wall runs from its start (its process start-up included).
func (b *bench) takeover(flags []string) (took, wall time.Duration, err error) {
	old := b.daemon
	old.replaced = true
	start := time.Now()
	next, err := b.startDaemon(flags...)
	if err != nil {
		return 0, 0, err
	}
	wall = time.Since(start)
	b.daemon = next
	select {
	case <-old.done:
	case <-time.After(30 * time.Second):
		return 0, wall, fmt.Errorf("the old napitapd (pid %d) did not exit 30 s after the new one served", old.pid())
	}
	if old.err != nil {
		return 0, wall, fmt.Errorf("the old napitapd (pid %d) exited with %v, want 0: %s", old.pid(), old.err, old.logTail())
	}
	m := tookRE.FindStringSubmatch(next.logText())
	if m == nil {
		return 0, wall, fmt.Errorf("the new napitapd (pid %d) serves but logged no tookOver=true: %s", next.pid(), next.logTail())
	}
	if took, err = time.ParseDuration(m[1]); err != nil {
		return 0, wall, fmt.Errorf("the new napitapd's took=%s: %w", m[1], err)
	}
	if log := next.logText(); strings.Contains(log, "is lost") || strings.Contains(log, "not taken") {
		return took, wall, fmt.Errorf("the new napitapd (pid %d) lost something: %s", next.pid(), next.logTail())
	}
	return took, wall, nil
}

// killAndRestart SIGKILLs napitapd and starts the next at once, as the
// kubelet restarts a killed container; the time runs from the SIGKILL to
// the next one serving, everything taken back from napitap-fdstore.
func (b *bench) killAndRestart(flags []string) (time.Duration, error) {
	old := b.daemon
	old.replaced = true
	start := time.Now()
	if err := old.cmd.Process.Kill(); err != nil {
		return 0, fmt.Errorf("SIGKILL napitapd (pid %d): %w", old.pid(), err)
	}
	<-old.done
	next, err := b.startDaemon(flags...)
	if err != nil {
		return 0, err
	}
	took := time.Since(start)
	b.daemon = next
	if log := next.logText(); !strings.Contains(log, "fd holder: recovered") || strings.Contains(log, "is lost") || strings.Contains(log, "not taken") {
		return took, fmt.Errorf("the napitapd started after the SIGKILL (pid %d) did not recover everything from napitap-fdstore: %s", next.pid(), next.logTail())
	}
	return took, nil
}

// vmProc is a running VM.
type vmProc struct {
	cmd    *exec.Cmd
	stdin  *os.File // closing it stops the VM
	stderr bytes.Buffer
	done   chan struct{}
	err    error
	cpu    time.Duration // user+sys, once it has exited
	once   sync.Once
}

// startVM starts v's VM in its pod netns: in intercept mode the launcher's
// `vm runc`, which hands its seccomp listener to napitapd as runc does on
// Kubernetes and opens the tap by name; in fds
// mode its `vm fds` under `napitapctl exec`, which fetches the queues from
// napitapd; for the reference plugin's pod, `vm plain`, the tap opened by
// name with no agent. It returns once the VM holds every queue (with NAPI
// but for plain); cleanup stops it.
func (b *bench) startVM(v *vmPod, queues int) (*vmProc, launch.VMReady, error) {
	var ready launch.VMReady
	self, env := b.launcher.path, os.Environ()
	opener := []string{self}
	if filepath.Base(self) != launcherBin {
		opener, env = []string{self, "cni"}, append(env, launcherEnv+"=1")
	}
	ctl := filepath.Join(b.binDir, "napitapctl")
	var argv []string
	switch {
	case v.plain:
		argv = append(opener, "vm", "plain", capacityIfName, strconv.Itoa(queues))
	case v.fds:
		argv = append([]string{ctl, "--socket", b.daemon.socket, "exec", "--container", v.cid, "--ifname", capacityIfName, "--"}, opener...)
		argv = append(argv, "vm", "fds", strconv.Itoa(queues))
	default:
		argv = append(opener, "vm", "runc", b.daemon.seccomp, capacityIfName, strconv.Itoa(queues))
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, ready, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, ready, err
	}
	defer outR.Close()
	p := &vmProc{cmd: exec.Command(argv[0], argv[1:]...), stdin: inW, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = inR, outW, &p.stderr
	// Its own process group: a ^C for the bench must not reach the VMs
	// before the bench stops them.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var startErr error
	err = v.pod.Do(func(ns.NetNS) error { startErr = p.cmd.Start(); return nil })
	inR.Close()
	outW.Close()
	if err == nil {
		err = startErr
	}
	if err != nil {
		inW.Close()
		return nil, ready, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	go func() {
		p.err = p.cmd.Wait()
		if ps := p.cmd.ProcessState; ps != nil {
			p.cpu = ps.UserTime() + ps.SystemTime()
		}
		close(p.done)
	}()
	b.mu.Lock()
	b.onCleanup(p.stop)
	b.mu.Unlock()

	_ = outR.SetReadDeadline(time.Now().Add(vmTimeout))
	line, err := bufio.NewReader(outR).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &ready)
	}
	if err == nil && ready.Queues != queues {
		err = fmt.Errorf("it holds %d queues, want %d", ready.Queues, queues)
	}
	if err != nil {
		_ = p.stop()
		return nil, ready, fmt.Errorf("%s: no ready line: %w (stderr %q)", strings.Join(argv, " "), err, trim(p.stderr.Bytes()))
	}
	return p, ready, nil
}

// stop closes the VM's stdin, which ends it, and waits; after 10 s it
// kills it by its PID.
func (p *vmProc) stop() error {
	var err error
	p.once.Do(func() {
		p.stdin.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			err = fmt.Errorf("VM pid %d did not exit 10 s after its stdin closed; killed", p.cmd.Process.Pid)
		}
	})
	return err
}
