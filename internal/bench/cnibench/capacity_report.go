package cnibench

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// CapacityRow is what one N gave.
type CapacityRow struct {
	Pods int
	// napitap: each pod's ADD, and from its start to its VM holding every
	// queue with NAPI; TUNSETIFF is each intercepted open by name.
	Add, Del             Series
	ToNAPI, TUNSETIFF    []time.Duration
	Running              int // VMs that came up
	AddFailures          int
	DelFailures          int
	VMFailures           int
	Idle, Holding, After DaemonStats // napitapd before the ADDs, with all N running, after the SIGKILL's restart
	// Takeover is what the new napitapd logs, from its request to
	// serving; TakeoverWall runs from its start. KillToServing runs from
	// the SIGKILL to the next napitapd serving.
	Takeover, TakeoverWall, KillToServing time.Duration
	// The reference tap plugin's ADD and DEL of the N pods at once, and
	// its VMs: from ADD's start to holding every queue, and each queue's
	// TUNSETIFF, the kernel's own (no NAPI, no agent).
	RefAdd, RefDel            Series
	RefToQueues, RefTUNSETIFF []time.Duration
	RefFailures               int
	// The CPU every process spent while the pods started, napitap's and
	// the reference plugin's; with --split, where their ADDs' time went.
	Burst, RefBurst BurstCPU
	Split, RefSplit *SplitSummary
}

// pluginRun is one plugin's share of a row: the reference's or napitap's.
type pluginRun struct {
	name  string
	add   Series
	burst BurstCPU
	split *SplitSummary
}

// byPlugin lists the reference plugin's run, then napitap's, in the order
// every table shows them.
func (w *CapacityRow) byPlugin() []pluginRun {
	return []pluginRun{
		{"tap plugin", w.RefAdd, w.RefBurst, w.RefSplit},
		{"napitap", w.Add, w.Burst, w.Split},
	}
}

// CapacityReport is one run of `napitap-bench capacity`.
type CapacityReport struct {
	CommandLine  string
	Started      time.Time
	Elapsed      time.Duration
	Machine      Machine
	Build        string
	Queues       int
	Rows         []CapacityRow
	FailureCount int
	Failures     []string
	Incomplete   string
}

// meanCPU is the mean CPU (user+sys) of one exec in s.
func meanCPU(s Series) time.Duration {
	if len(s.CPU) == 0 {
		return 0
	}
	var sum time.Duration
	for _, c := range s.CPU {
		sum += c
	}
	return sum / time.Duration(len(s.CPU))
}

// CPUFloor is how long the machine's CPUs needed at the least for what
// every process did while napitap's N pods started (BurstCPU).
func (r *CapacityReport) CPUFloor(row *CapacityRow) time.Duration {
	return row.Burst.Floor(r.Machine.CPUs)
}

// Goals judges issue 46's at the last N: napitap's p99 ADD at most twice
// the burst's all-process floor and at most half the reference plugin's,
// and its CPU per ADD at most 0.4x the reference plugin's.
func (r *CapacityReport) Goals() []Goal {
	if len(r.Rows) == 0 {
		return nil
	}
	z := &r.Rows[len(r.Rows)-1]
	p99, ref, floor := Percentile(z.Add.Wall, 99), Percentile(z.RefAdd.Wall, 99), r.CPUFloor(z)
	// perf's recording costs every process CPU at each switch, the
	// plugins' most.
	underPerf := ""
	if z.Split != nil || z.RefSplit != nil {
		underPerf = ", under perf (--split)"
	}
	goal := func(name string, a, b time.Duration, limit float64) Goal {
		g := Goal{Name: fmt.Sprintf("%s, N=%d%s", name, z.Pods, underPerf), Target: fmt.Sprintf("<= %.1fx", limit)}
		if a > 0 && b > 0 {
			f := Ratio(a, b)
			g.Measured = fmt.Sprintf("%s (%s vs %s)", fmtRatio(f), fmtDur(a), fmtDur(b))
			g.Known, g.Met = true, f <= limit
		}
		return g
	}
	return []Goal{
		goal("napitap ADD p99 / the burst's all-process CPU floor", p99, floor, 2),
		goal("napitap ADD p99 / tap plugin (reference) ADD p99", p99, ref, 0.5),
		goal("napitap CPU per ADD / tap plugin (reference) CPU per ADD", meanCPU(z.Add), meanCPU(z.RefAdd), 0.4),
	}
}

// growth is one figure at the first and the last N, and its goal.
type growth struct {
	name        string
	first, last float64
	format      func(float64) string
	// limit is the most the factor may be; 0: none (reported only).
	limit    float64
	limitSay string
}

// Growth says, for each figure, how it grew from the first N to the last
// as a factor, and judges the goals: memory and fds linear or
// better (a factor no more than the pods'), p99 ADD at most 3x.
func (r *CapacityReport) Growth() []Goal {
	if len(r.Rows) < 2 {
		return nil
	}
	a, z := &r.Rows[0], &r.Rows[len(r.Rows)-1]
	podFactor := float64(z.Pods) / float64(a.Pods)
	dur := func(d time.Duration) float64 { return float64(d) }
	fd := func(v float64) string { return fmtDur(time.Duration(v)) }
	fus := func(v float64) string { return fmtMicros(time.Duration(v)) }
	fmib := func(v float64) string { return fmtMiB(int64(v)) }
	fint := func(v float64) string { return fmt.Sprint(int64(v)) }
	linear := fmt.Sprintf("<= %.0fx (linear: %d/%d pods)", podFactor, z.Pods, a.Pods)
	gs := []growth{
		{"napitapd VmRSS, all running", float64(a.Holding.VmRSS), float64(z.Holding.VmRSS), fmib, podFactor, linear},
		{"napitapd open fds, all running", float64(a.Holding.FDs), float64(z.Holding.FDs), fint, podFactor, linear},
		{"napitap ADD p99", dur(Percentile(a.Add.Wall, 99)), dur(Percentile(z.Add.Wall, 99)), fd, 3, "<= 3x"},
		{"napitap ADD p50", dur(Percentile(a.Add.Wall, 50)), dur(Percentile(z.Add.Wall, 50)), fd, 0, ""},
		{"ADD start to all queues with NAPI, p99", dur(Percentile(a.ToNAPI, 99)), dur(Percentile(z.ToNAPI, 99)), fd, 0, ""},
		{"intercepted TUNSETIFF p99", dur(Percentile(a.TUNSETIFF, 99)), dur(Percentile(z.TUNSETIFF, 99)), fus, 0, ""},
		{"tap plugin's VM: native TUNSETIFF p99", dur(Percentile(a.RefTUNSETIFF, 99)), dur(Percentile(z.RefTUNSETIFF, 99)), fus, 0, ""},
		{"napitap DEL p99", dur(Percentile(a.Del.Wall, 99)), dur(Percentile(z.Del.Wall, 99)), fd, 0, ""},
		{"takeover (request to serving)", dur(a.Takeover), dur(z.Takeover), fd, 0, ""},
		{"SIGKILL to serving", dur(a.KillToServing), dur(z.KillToServing), fd, 0, ""},
		{"tap plugin (reference) ADD p99", dur(Percentile(a.RefAdd.Wall, 99)), dur(Percentile(z.RefAdd.Wall, 99)), fd, 0, ""},
	}
	var out []Goal
	for _, g := range gs {
		goal := Goal{Name: fmt.Sprintf("%s, N=%d to N=%d", g.name, a.Pods, z.Pods), Target: "-"}
		if g.first > 0 && g.last > 0 {
			f := g.last / g.first
			goal.Measured = fmt.Sprintf("%s (%s to %s)", fmtRatio(f), g.format(g.first), g.format(g.last))
			if g.limit > 0 {
				goal.Target, goal.Known, goal.Met = g.limitSay, true, f <= g.limit
			}
		} else if g.limit > 0 {
			goal.Target = g.limitSay
		}
		out = append(out, goal)
	}
	return out
}

// fmtMicros prints a latency in microseconds up to 10 ms: an intercepted
// TUNSETIFF takes about a hundred.
func fmtMicros(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	if d >= 10*time.Millisecond {
		return fmtDur(d)
	}
	return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond))
}

func pq(s []time.Duration, f func(time.Duration) string) string {
	return f(Percentile(s, 50)) + " / " + f(Percentile(s, 99))
}

// Markdown renders the report.
func (r *CapacityReport) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	runHead{"capacity", "failures", r.FailureCount, r.Incomplete, r.CommandLine, r.Machine, r.Started, r.Elapsed, r.Build}.markdown(p)

	p("Method: for each N, first the reference `tap` plugin (multiQueue) ADDs N pods at once, each pod's VM opening its %d queues by name as soon as its ADD is back ", r.Queues)
	p("(`vm plain tap0 %d`: the kernel's own `TUNSETIFF`, no agent, no NAPI), then DELs them at once. ", r.Queues)
	p("Then N VM pods start at once, one goroutine each, as a node full of VMs starts after a drain: napitap's ADD of a %d-queue NAPI tap ", r.Queues)
	p("in the pod's own netns (exec'd as libcni does, from a throwaway \"host\" netns), then, as soon as that ADD is back, the pod's VM: ")
	p("half of them (intercept mode) `napitap-bench-launcher vm runc SOCKET tap0 %d`, which installs the seccomp filter and hands its listener to napitapd ", r.Queues)
	p("as runc does for a container whose profile names napitapd's socket as `listenerPath` (on Kubernetes no process stands between the VMM and the agent), ")
	p("then opens the queues by name as QEMU's ")
	p("`ifname=tap0,queues=%d` does (napitapd's seccomp agent intercepts each `TUNSETIFF`), the other half (fds mode) `vm fds %d` under ", r.Queues, r.Queues)
	p("`napitapctl exec`, which fetches the queues napitapd holds. Each VM checks every queue with `TUNGETIFF` for `IFF_NAPI` and says when it holds them all: ")
	p("\"to NAPI\" runs from its pod's ADD's start to then. One napitapd serves, beside a napitap-fdstore as in the DaemonSet. ")
	p("With all N running: napitapd's VmRSS and open fds; a takeover by a new napitapd on the same paths (the time it logs, from its request to serving; ")
	p("its process start-up on top in brackets); then a SIGKILL of it and the next napitapd started at once, timed from the SIGKILL to serving, everything ")
	p("taken back from napitap-fdstore. After each, napitapd must list all N. Then the VMs are stopped and the N DELs run at once. ")
	p("p50/p99 are nearest-rank: with fewer than 100 samples p99 is the maximum. Everything runs as root, so no per-uid quota applies here.\n\n")

	p("| N | ADD p50 / p99 | tap plugin ADD p50 / p99 | ADD p99 vs tap | to NAPI p50 / p99 | tap plugin: to queues p50 / p99 | intercepted TUNSETIFF p50 / p99 | tap plugin: native TUNSETIFF p50 / p99 | napitapd VmRSS, fds (idle) | napitapd VmRSS, fds (N running) | takeover | SIGKILL to serving | DEL p50 / p99 | tap plugin DEL p50 / p99 | DEL p99 vs tap | CPU per ADD: napitap, tap plugin (ratio) | all-process floor | failures |\n")
	p("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Rows {
		w := &r.Rows[i]
		p("| %d | %s | %s | %s | %s | %s | %s | %s | %s, %d | %s, %d | %s (%s) | %s | %s | %s | %s | %s, %s (%s) | %s | %d |\n", w.Pods,
			pq(w.Add.Wall, fmtDur), pq(w.RefAdd.Wall, fmtDur), fmtRatio(Ratio(Percentile(w.Add.Wall, 99), Percentile(w.RefAdd.Wall, 99))),
			pq(w.ToNAPI, fmtDur), pq(w.RefToQueues, fmtDur), pq(w.TUNSETIFF, fmtMicros), pq(w.RefTUNSETIFF, fmtMicros),
			fmtMiB(w.Idle.VmRSS), w.Idle.FDs, fmtMiB(w.Holding.VmRSS), w.Holding.FDs,
			fmtDur(w.Takeover), fmtDur(w.TakeoverWall), fmtDur(w.KillToServing),
			pq(w.Del.Wall, fmtDur), pq(w.RefDel.Wall, fmtDur), fmtRatio(Ratio(Percentile(w.Del.Wall, 99), Percentile(w.RefDel.Wall, 99))),
			fmtDur(meanCPU(w.Add)), fmtDur(meanCPU(w.RefAdd)), fmtRatio(Ratio(meanCPU(w.Add), meanCPU(w.RefAdd))), fmtDur(r.CPUFloor(w)),
			w.AddFailures+w.VMFailures+w.DelFailures+w.RefFailures)
	}
	p("\n\"CPU per ADD\" is the mean user+sys of one ADD process at that N, its children included (wait4's rusage: the tap plugin's `ip` commands); at an N that --split names, perf's recording adds to it. The all-process floor is below.\n\n")
	r.burstCPUMarkdown(p)
	r.splitMarkdown(p)
	if g := r.Goals(); len(g) > 0 {
		p("## Goals (issue 46)\n\n")
		goalsMarkdown(p, "goal", g)
	}

	if g := r.Growth(); len(g) > 0 {
		p("## Growth from N=%d to N=%d\n\n", r.Rows[0].Pods, r.Rows[len(r.Rows)-1].Pods)
		goalsMarkdown(p, "figure", g)
	}
	failuresMarkdown(p, r.FailureCount, r.Failures)
	return b.String()
}

// capacitySeries is one line of the plot.
type capacitySeries struct {
	label, color string
	dash         bool
	pick         func(*CapacityRow) time.Duration
}

// SVG plots latency against N: napitap's ADD and its VMs' time to NAPI
// against the reference plugin's ADD, p99 solid and p50 dashed, and the
// CPU floor.
func (r *CapacityReport) SVG() string {
	p99 := func(f func(*CapacityRow) []time.Duration, q float64) func(*CapacityRow) time.Duration {
		return func(w *CapacityRow) time.Duration { return Percentile(f(w), q) }
	}
	add := func(w *CapacityRow) []time.Duration { return w.Add.Wall }
	ref := func(w *CapacityRow) []time.Duration { return w.RefAdd.Wall }
	toNAPI := func(w *CapacityRow) []time.Duration { return w.ToNAPI }
	del := func(w *CapacityRow) []time.Duration { return w.Del.Wall }
	lines := []capacitySeries{
		{"napitap ADD p99", "#2f6fb0", false, p99(add, 99)},
		{"napitap ADD p50", "#2f6fb0", true, p99(add, 50)},
		{"ADD start to VM's queues with NAPI p99", "#3a9a4a", false, p99(toNAPI, 99)},
		{"napitap DEL p99", "#c07a2a", false, p99(del, 99)},
		{"tap plugin (reference) ADD p99", "#9e9e9e", false, p99(ref, 99)},
		{"tap plugin (reference) ADD p50", "#9e9e9e", true, p99(ref, 50)},
		{"tap plugin: ADD start to VM's queues p99", "#7fbf8a", false, p99(func(w *CapacityRow) []time.Duration { return w.RefToQueues }, 99)},
		{"all-process CPU floor of napitap's burst", "#222", true, func(w *CapacityRow) time.Duration { return r.CPUFloor(w) }},
	}
	const (
		left, top, plotW, plotH = 70, 50, 520, 300
		legendW                 = 300
	)
	width, height := left+plotW+30+legendW, top+plotH+60
	var hi time.Duration
	maxN := 1
	for i := range r.Rows {
		maxN = max(maxN, r.Rows[i].Pods)
		for _, l := range lines {
			hi = max(hi, l.pick(&r.Rows[i]))
		}
	}
	step, ticks := niceTicks(hi)
	yOf := func(d time.Duration) float64 {
		return top + plotH - float64(d)/float64(step*time.Duration(ticks))*plotH
	}
	// niceTicks works on durations, with a floor of 1 µs: count pods in ms.
	msStep, nTicks := niceTicks(time.Duration(maxN) * time.Millisecond)
	nStep := max(int(msStep/time.Millisecond), 1)
	xOf := func(n int) float64 { return left + float64(n)/float64(nStep*nTicks)*plotW }

	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="10" y="20" font-size="15" font-weight="bold">napitap-bench capacity: N VM pods at once, %d queues each</text>`+"\n", r.Queues)
	p(`<text x="10" y="38" fill="#555">%s, %d CPUs, %s</text>`+"\n", xmlEscape(r.Machine.Kernel), r.Machine.CPUs, r.Started.UTC().Format("2006-01-02"))
	for t := 0; t <= ticks; t++ {
		y := yOf(step * time.Duration(t))
		p(`<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+plotW, y)
		p(`<text x="%d" y="%.1f" text-anchor="end" fill="#555">%s</text>`+"\n", left-6, y+4, tickLabel(step*time.Duration(t)))
	}
	for t := 0; t <= nTicks; t++ {
		n := nStep * t
		x := xOf(n)
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x, top, x, top+plotH)
		p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%d</text>`+"\n", x, top+plotH+16, n)
	}
	p(`<text x="%d" y="%d" text-anchor="middle" fill="#555">N VM pods started at once</text>`+"\n", left+plotW/2, top+plotH+36)
	p(`<text x="16" y="%d" fill="#555" transform="rotate(-90 16 %d)" text-anchor="middle">ms</text>`+"\n", top+plotH/2, top+plotH/2)
	for i, l := range lines {
		var pts []string
		for k := range r.Rows {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(r.Rows[k].Pods), yOf(l.pick(&r.Rows[k]))))
		}
		dash := ""
		if l.dash {
			dash = ` stroke-dasharray="5,4"`
		}
		p(`<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), l.color, dash)
		for _, pt := range pts {
			x, y, _ := strings.Cut(pt, ",")
			p(`<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", x, y, l.color)
		}
		ly := top + 10 + i*20
		p(`<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>`+"\n", left+plotW+30, ly, left+plotW+60, ly, l.color, dash)
		p(`<text x="%d" y="%d">%s</text>`+"\n", left+plotW+66, ly+4, xmlEscape(l.label))
	}
	p("</svg>\n")
	return b.String()
}

// burstCPUMarkdown: the CPU every process spent while the pods started.
func (r *CapacityReport) burstCPUMarkdown(p func(string, ...any)) {
	p("## The burst's CPU, every process\n\n")
	p("From the first ADD's start to the last VM holding its queues: the machine's busy time (user, nice, system, irq and softirq of every CPU in /proc/stat, ")
	p("in 10 ms ticks), and what of it each part spent: the plugins (wait4's rusage, their children included: the `ip` commands of the tap plugin), ")
	p("the VMs (rusage at their exit, `napitapctl exec` included for fds mode), napitapd and napitap-fdstore (/proc/PID/stat, ticks), the bench itself (getrusage) ")
	p("and perf (with --split); the rest is kernel threads (the taps' NAPI threads, RCU, netns work), softirqs and anything else that ran. ")
	p("The floor is the busy time over the %d CPUs: the burst cannot end sooner.\n\n", r.Machine.CPUs)
	p("| N | pods of | window | machine busy | floor | plugins | VMs | napitapd, fdstore | bench | perf | rest | ADD p99 / floor |\n")
	p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Rows {
		w := &r.Rows[i]
		for _, k := range w.byPlugin() {
			c, floor := k.burst, k.burst.Floor(r.Machine.CPUs)
			share := func(d time.Duration) string {
				if c.Machine <= 0 {
					return fmtDur(d)
				}
				return fmt.Sprintf("%s (%.0f%%)", fmtDur(d), 100*float64(d)/float64(c.Machine))
			}
			p("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", w.Pods, k.name, fmtDur(c.Window), fmtDur(c.Machine), fmtDur(floor),
				share(c.Plugins), share(c.VMs), share(c.Daemons), share(c.Bench), share(c.Perf), share(c.Rest()),
				fmtRatio(Ratio(Percentile(k.add.Wall, 99), floor)))
		}
	}
	p("\n")
	for i := range r.Rows {
		w := &r.Rows[i]
		for _, k := range w.byPlugin() {
			if len(k.burst.KernelThreads) == 0 {
				continue
			}
			var parts []string
			var sum time.Duration
			for _, kt := range kernelThreads {
				if d := k.burst.KernelThreads[kt.name]; d > 0 {
					parts = append(parts, fmt.Sprintf("%s %s", kt.name, fmtDur(d)))
					sum += d
				}
			}
			p("- N=%d, %s: the kernel's threads ran %s while perf recorded (%s).\n", w.Pods, k.name, fmtDur(sum), strings.Join(parts, ", "))
		}
	}
	p("\n")
}

// splitMarkdown: where the ADDs' time went, for the Ns of --split.
func (r *CapacityReport) splitMarkdown(p func(string, ...any)) {
	rows := r.splitRows()
	if len(rows) == 0 {
		return
	}
	p("## Where an ADD's time goes\n\n")
	p("`perf sched record -a -g` while the pods start, read back with `perf sched timehist --state`: each thread's time is on a CPU, waiting to run ")
	p("(woken or preempted, no CPU yet) or blocked, the reason read off the kernel stack it slept in. A process's life, from its first to its last ")
	p("scheduler event, counts each instant once: on CPU if any of its threads ran, else waiting if any was runnable, else blocked for the first ")
	p("reason in the order of the columns (a Go program's idle threads always sleep in a futex, so a futex counts only when nothing else waited). ")
	p("Means per ADD, in brackets the share of the life; \"wall\" is the bench's, fork to reaped.\n\n")
	reasons := splitReasons(rows)
	p("| N | ADDs | wall | life | on CPU | waiting to run |")
	for _, k := range reasons {
		p(" blocked: %s |", k)
	}
	p("\n|---:|---|---:|---:|---:|---:|%s\n", strings.Repeat("---:|", len(reasons)))
	for _, s := range rows {
		m := s.mean
		pct := func(d time.Duration) string {
			if m.Life <= 0 {
				return fmtDur(d)
			}
			return fmt.Sprintf("%s (%.0f%%)", fmtDur(d), 100*float64(d)/float64(m.Life))
		}
		p("| %d | %s | %s | %s | %s | %s |", s.pods, s.label, fmtDur(m.Wall), fmtDur(m.Life), pct(m.OnCPU), pct(m.Runnable))
		for _, k := range reasons {
			p(" %s |", pct(blocked(m, k, reasons)))
		}
		p("\n")
	}
	p("\n![where an ADD's time goes](capacity-split.svg)\n\n")
}

type splitRow struct {
	pods  int
	label string
	mean  SplitMean
}

func (r *CapacityReport) splitRows() []splitRow {
	var rows []splitRow
	for i := range r.Rows {
		w := &r.Rows[i]
		for _, k := range w.byPlugin() {
			if k.split == nil {
				continue
			}
			rows = append(rows,
				splitRow{w.Pods, fmt.Sprintf("%s, all %d", k.name, k.split.All.ADDs), k.split.All},
				splitRow{w.Pods, fmt.Sprintf("%s, slowest %d", k.name, k.split.Slowest.ADDs), k.split.Slowest})
			for _, mode := range slices.Sorted(maps.Keys(k.split.Modes)) {
				m := k.split.Modes[mode]
				rows = append(rows, splitRow{w.Pods, fmt.Sprintf("%s, %s mode %d", k.name, mode, m.ADDs), m})
			}
		}
	}
	return rows
}

// splitReasons: the blocking reasons that take at least 1% of some row's
// life, in blockReasons' order; the others make restReason.
func splitReasons(rows []splitRow) []string {
	var out []string
	for _, br := range blockReasons {
		for _, s := range rows {
			if s.mean.Life > 0 && s.mean.Blocked[br.name]*100 >= s.mean.Life {
				out = append(out, br.name)
				break
			}
		}
	}
	return append(out, restReason)
}

// restReason is every blocking reason splitReasons leaves out, together.
const restReason = "anything else"

// blocked is what m spent blocked for reason, restReason summing those
// that are not in shown.
func blocked(m SplitMean, reason string, shown []string) time.Duration {
	if reason != restReason {
		return m.Blocked[reason]
	}
	var d time.Duration
	for k, v := range m.Blocked {
		if !slices.Contains(shown, k) {
			d += v
		}
	}
	return d
}

// SplitSVG draws each split row as a bar of its mean life, stacked: on
// CPU, waiting to run, then each blocking reason. Empty without --split.
func (r *CapacityReport) SplitSVG() string {
	rows := r.splitRows()
	if len(rows) == 0 {
		return ""
	}
	reasons := splitReasons(rows)
	palette := []string{"#8e6bbf", "#c07a2a", "#3a9a4a", "#d4b106", "#7fbf8a", "#5aa0d8", "#b05050", "#999", "#ccc", "#e0e0e0", "#f0f0f0"}
	parts := []string{"on CPU", "waiting to run"}
	parts = append(parts, reasons...)
	colors := map[string]string{"on CPU": "#2f6fb0", "waiting to run": "#e06c3a"}
	for i, k := range reasons {
		colors[k] = palette[i%len(palette)]
	}
	value := func(m SplitMean, part string) time.Duration {
		switch part {
		case "on CPU":
			return m.OnCPU
		case "waiting to run":
			return m.Runnable
		}
		return blocked(m, part, reasons)
	}
	const left, top, plotW, barH, gap, legendW = 230, 50, 520, 18, 8, 260
	var hi time.Duration
	for _, s := range rows {
		hi = max(hi, s.mean.Life)
	}
	step, ticks := niceTicks(hi)
	xOf := func(d time.Duration) float64 { return left + float64(d)/float64(step*time.Duration(ticks))*plotW }
	plotH := len(rows) * (barH + gap)
	width, height := left+plotW+30+legendW, top+max(plotH, 20*len(parts))+50
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="10" y="20" font-size="15" font-weight="bold">Where an ADD's time goes under a burst (perf sched), mean per ADD</text>` + "\n")
	p(`<text x="10" y="38" fill="#555">%s, %d CPUs, %s</text>`+"\n", xmlEscape(r.Machine.Kernel), r.Machine.CPUs, r.Started.UTC().Format("2006-01-02"))
	for t := 0; t <= ticks; t++ {
		x := xOf(step * time.Duration(t))
		p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, top+plotH)
		p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x, top+plotH+16, tickLabel(step*time.Duration(t)))
	}
	p(`<text x="%d" y="%d" text-anchor="middle" fill="#555">ms</text>`+"\n", left+plotW/2, top+plotH+34)
	for i, s := range rows {
		y := top + i*(barH+gap)
		p(`<text x="%d" y="%d" text-anchor="end">N=%d, %s</text>`+"\n", left-6, y+barH-4, s.pods, xmlEscape(s.label))
		var at time.Duration
		for _, part := range parts {
			d := value(s.mean, part)
			if d <= 0 {
				continue
			}
			p(`<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"><title>%s: %s</title></rect>`+"\n",
				xOf(at), y, xOf(at+d)-xOf(at), barH, colors[part], xmlEscape(part), fmtDur(d))
			at += d
		}
	}
	for i, part := range parts {
		ly := top + 10 + i*20
		p(`<rect x="%d" y="%d" width="14" height="12" fill="%s"/>`+"\n", left+plotW+30, ly-10, colors[part])
		p(`<text x="%d" y="%d">%s</text>`+"\n", left+plotW+50, ly, xmlEscape(part))
	}
	p("</svg>\n")
	return b.String()
}
