package cnibench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Machine describes where the numbers were taken.
type Machine struct {
	CPUs          int
	Kernel        string // uname -r
	KernelVersion string // uname -v
	CPUModel      string
	GoVersion     string
	LoadStart     string // /proc/loadavg when the run began
	LoadEnd       string // and when it ended
}

// VariantResult is one configuration measured in the interleaved loop.
type VariantResult struct {
	ID, Label string
	Plugins   []string // plugin types, in chain order
	Config    string   // the plugin configs as the bench wrote them
	Reference bool     // the baseline the ratios are taken against
	// TwinOf is, for a variant run with --against's napitap, the id of
	// the same variant with this build's.
	TwinOf string
	// Add and Del time the whole chain; AddSteps and DelSteps each plugin
	// exec of it alone, in chain order (DEL runs them in reverse).
	Add, Del                 Series
	AddSteps, DelSteps       []Series
	AddFailures, DelFailures int
}

// Step returns the index of plugin typ in the chain, or -1.
func (v *VariantResult) Step(typ string) int {
	for i, p := range v.Plugins {
		if p == typ {
			return i
		}
	}
	return -1
}

// Chained reports whether the variant is more than one plugin.
func (v *VariantResult) Chained() bool { return len(v.Plugins) > 1 }

// DaemonStats is napitapd's memory and fds at one moment.
type DaemonStats struct {
	VmRSS, VmHWM int64 // bytes
	FDs          int
}

// BurstResult is one burst of pods of one kind added, then deleted,
// concurrently.
type BurstResult struct {
	Kind, Label              string // burstKind's id and label
	Pods                     int
	AddWall, DelWall         time.Duration
	Add, Del                 Series
	AddFailures, DelFailures int
	// Handoff: napitapd held the pods' queues. Holding is napitapd while it
	// holds the burst's attachments; HeldAttachments and HeldQueues are
	// what its list op reported then.
	Handoff                     bool
	Holding                     DaemonStats
	HeldAttachments, HeldQueues int
	After                       DaemonStats // after the DEL burst
	// The kernel's slab, settled, before the ADD burst, while the pods
	// are held and after the DEL burst: what the taps cost the kernel,
	// system-wide, so noisy on a busy machine.
	SlabBefore, SlabHolding, SlabAfter Slab
}

// Slab is the kernel's slab memory as /proc/meminfo reports it, in bytes.
type Slab struct {
	Total         int64 // Slab
	Unreclaimable int64 // SUnreclaim
}

// SlabPerPod is the kernel slab each pod of the burst added.
func (b *BurstResult) SlabPerPod() int64 {
	return perPod(b.SlabBefore.Total, b.SlabHolding.Total, b.Pods)
}

// SUnreclaimPerPod is the unreclaimable part of SlabPerPod.
func (b *BurstResult) SUnreclaimPerPod() int64 {
	return perPod(b.SlabBefore.Unreclaimable, b.SlabHolding.Unreclaimable, b.Pods)
}

// SlabLeftPerPod is the slab per pod still there after DEL: a leak shows
// here, along with whatever else the machine did meanwhile.
func (b *BurstResult) SlabLeftPerPod() int64 {
	return perPod(b.SlabBefore.Total, b.SlabAfter.Total, b.Pods)
}

func perPod(before, after int64, pods int) int64 {
	if pods == 0 || before == 0 || after == 0 {
		return 0
	}
	return (after - before) / int64(pods)
}

// Report is everything one run measured.
type Report struct {
	CommandLine        string
	Started            time.Time
	Elapsed            time.Duration
	Machine            Machine
	Build              string
	Iterations, Warmup int
	Settle             time.Duration
	Variants           []VariantResult
	Bursts             []BurstResult
	DaemonIdle         DaemonStats // napitapd before any burst, after the interleaved loop
	// RSSFloor is the launcher's VmHWM after the interleaved loop, and
	// BurstRSSFloor after the bursts: every peak RSS reported is at least
	// the floor of its phase (see package launch), so one at or below it
	// is only a bound.
	RSSFloor, BurstRSSFloor int64
	FailureCount            int
	Failures                []string // the first few, verbatim
	Incomplete              string   // why the run stopped early, if it did
}

// Goal is one target from the issue, checked against the run.
type Goal struct {
	Name, Measured, Target string
	Met, Known             bool
}

func (r *Report) Variant(id string) *VariantResult {
	for i := range r.Variants {
		if r.Variants[i].ID == id {
			return &r.Variants[i]
		}
	}
	return nil
}

func (r *Report) reference() *VariantResult {
	for i := range r.Variants {
		if r.Variants[i].Reference {
			return &r.Variants[i]
		}
	}
	return nil
}

// NapitapPeakRSS is the largest ru_maxrss of any napitap exec, bursts included.
func (r *Report) NapitapPeakRSS() int64 {
	var peak int64
	for i := range r.Variants {
		v := &r.Variants[i]
		if s := v.Step("napitap"); s >= 0 {
			peak = max(peak, v.AddSteps[s].MaxRSS, v.DelSteps[s].MaxRSS)
		}
	}
	for _, b := range r.Bursts {
		peak = max(peak, b.Add.MaxRSS, b.Del.MaxRSS)
	}
	return peak
}

// Goals checks the run against the targets: napitap with 4 NAPI
// queues, standalone, against the reference plugin in the same run.
func (r *Report) Goals() []Goal {
	var goals []Goal
	ref, b4 := r.reference(), r.Variant("b4")
	ratioGoal := func(name string, target float64, pick func(*VariantResult) Series) {
		g := Goal{Name: name, Target: "<= " + fmtRatio(target)}
		if ref != nil && b4 != nil {
			a, n := pick(ref), pick(b4)
			if len(a.Wall) > 0 && len(n.Wall) > 0 {
				ratio := Ratio(Percentile(n.Wall, 50), Percentile(a.Wall, 50))
				g.Measured = fmt.Sprintf("%s (%s vs %s)", fmtRatio(ratio), fmtDur(Percentile(n.Wall, 50)), fmtDur(Percentile(a.Wall, 50)))
				g.Met, g.Known = ratio <= target, true
			}
		}
		goals = append(goals, g)
	}
	// Issue 13's targets: a leaner ADD than the reference's by 0.6x, and
	// a DEL no slower.
	ratioGoal("napitap 4-queue ADD p50 / tap ADD p50", 0.6, func(v *VariantResult) Series { return v.Add })
	ratioGoal("napitap 4-queue DEL p50 / tap DEL p50", 1.0, func(v *VariantResult) Series { return v.Del })

	g := Goal{Name: "napitap plugin peak RSS (any exec)", Target: "< 30 MiB"}
	if peak := r.NapitapPeakRSS(); peak > 0 {
		g.Measured, g.Met, g.Known = fmtMiB(peak), peak < 30*mib, true
		if peak <= max(r.RSSFloor, r.BurstRSSFloor) {
			g.Measured = "<= " + g.Measured + " (at the launcher's floor)"
		}
	}
	goals = append(goals, g)

	// The largest burst of napitap as configured by default.
	var biggest *BurstResult
	for i := range r.Bursts {
		if bu := &r.Bursts[i]; bu.Kind == "napitap" && (biggest == nil || bu.Pods > biggest.Pods) {
			biggest = bu
		}
	}
	g = Goal{Name: "napitapd memory holding the largest burst (VmHWM)", Target: "< 50 MiB"}
	if biggest != nil && biggest.Holding.VmHWM > 0 {
		g.Name = fmt.Sprintf("napitapd memory holding %d attachments (VmHWM)", biggest.Pods)
		g.Measured = fmt.Sprintf("%s (VmRSS %s, %d fds)", fmtMiB(biggest.Holding.VmHWM), fmtMiB(biggest.Holding.VmRSS), biggest.Holding.FDs)
		g.Met, g.Known = biggest.Holding.VmHWM < 50*mib, true
	}
	goals = append(goals, g)

	g = Goal{Name: "kernel slab per 4-queue tap, default config", Target: "<= 0.50 MiB"}
	if biggest != nil && biggest.SlabPerPod() != 0 {
		g.Name += fmt.Sprintf(" (%d-pod burst)", biggest.Pods)
		g.Measured = fmtSlab(biggest.SlabPerPod())
		g.Met, g.Known = biggest.SlabPerPod() <= mib/2, true
	}
	goals = append(goals, g)

	g = Goal{Name: "failures of the largest burst, default config", Target: "0"}
	if biggest != nil {
		g.Name = fmt.Sprintf("failures of the %d-pod burst, default config", biggest.Pods)
		g.Measured = fmt.Sprint(biggest.AddFailures + biggest.DelFailures)
		g.Met, g.Known = biggest.AddFailures+biggest.DelFailures == 0, true
	}
	goals = append(goals, g)
	return goals
}

// SlabRatio is a kind's slab per pod over the reference tap plugin's, in
// the bursts of pods pods; NaN when either is missing.
func (r *Report) SlabRatio(kind string, pods int) float64 {
	var of, ref int64
	for i := range r.Bursts {
		if bu := &r.Bursts[i]; bu.Pods == pods {
			if bu.Kind == kind {
				of = bu.SlabPerPod()
			}
			if bu.Kind == "tap" {
				ref = bu.SlabPerPod()
			}
		}
	}
	if ref == 0 || of == 0 {
		return math.NaN()
	}
	return float64(of) / float64(ref)
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }

	runHead{"cni", "ADD/DEL failures", r.FailureCount, r.Incomplete, r.CommandLine, r.Machine, r.Started, r.Elapsed, r.Build}.markdown(p)

	p("Method: every plugin is exec'd by the bench with `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_PATH` ")
	p("and the config on stdin, as libcni's invoke does, from a throwaway \"host\" netns. A latency is the wall time of one plugin ")
	p("process from fork to reaped exit; CPU is its user+sys; peak RSS is `ru_maxrss` from wait4, which also covers ")
	p("children it reaped (the `ip` commands of the tap plugin). The plugins are forked by a small launcher process, not by the bench: ")
	p("a child's `ru_maxrss` starts at its parent's RSS high-water mark (exec after vfork folds the parent's `hiwater_rss` into it), so the bench's own RSS ")
	p("would hide the plugins'. The launcher's VmHWM is the floor (%s after the interleaved loop, %s after the bursts): a peak RSS at or below it is only an upper bound, shown as `<=`. ",
		fmtMiB(r.RSSFloor), fmtMiB(r.BurstRSSFloor))
	p("The launcher's stdin for a plugin is a pipe that already holds the config, stdout a memory file, so no copying goroutine can hold a plugin up. ")
	p("The variants are interleaved: each of the %d iterations (after %d unrecorded warm-up rounds) runs ADD of every variant, pauses %s, ", r.Iterations, r.Warmup, r.Settle)
	p("runs DEL of every variant and pauses again, the order rotating per iteration (DEL in reverse). A DEL right after its own ADD would wait ")
	p("for that ADD's RCU callbacks (closing a queue fd queues some; deleting a netdevice waits in `rcu_barrier()` for all). ")
	p("Each variant has one pod netns of its own, reused across iterations, so netns creation and the kernel's asynchronous netns ")
	p("teardown stay out of the timings. p50/p99 are nearest-rank: with fewer than 100 samples p99 is the maximum.\n\n")

	ref := r.reference()
	var refAdd, refDel time.Duration
	if ref != nil {
		refAdd, refDel = Percentile(ref.Add.Wall, 50), Percentile(ref.Del.Wall, 50)
	}

	p("## Standalone tap: reference plugin vs napitap\n\n")
	p("| variant | ADD p50 | ADD p99 | DEL p50 | DEL p99 | ADD CPU p50 | DEL CPU p50 | peak RSS | ADD p50 vs ref | DEL p50 vs ref | failures |\n")
	p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Variants {
		v := &r.Variants[i]
		if v.Chained() {
			continue
		}
		add, del := Percentile(v.Add.Wall, 50), Percentile(v.Del.Wall, 50)
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", v.Label,
			fmtDur(add), fmtDur(Percentile(v.Add.Wall, 99)), fmtDur(del), fmtDur(Percentile(v.Del.Wall, 99)),
			fmtDur(Percentile(v.Add.CPU, 50)), fmtDur(Percentile(v.Del.CPU, 50)),
			rssOver(max(v.Add.MaxRSS, v.Del.MaxRSS), r.RSSFloor),
			fmtRatio(Ratio(add, refAdd)), fmtRatio(Ratio(del, refDel)), v.AddFailures+v.DelFailures)
	}
	p("\n")

	chained := false
	for i := range r.Variants {
		chained = chained || r.Variants[i].Chained()
	}
	if chained {
		p("## Chained after bridge (host-local IPAM), napitap's exec timed alone\n\n")
		p("The bridge part is the same in (c) and (d); the napitap columns time napitap's own exec within the chain. ")
		p("Ratios are napitap's share against the reference tap plugin's standalone ADD/DEL.\n\n")
		p("| variant | chain ADD p50 | chain ADD p99 | napitap ADD p50 | napitap ADD p99 | bridge ADD p50 | chain DEL p50 | chain DEL p99 | napitap DEL p50 | napitap DEL p99 | bridge DEL p50 | napitap peak RSS | bridge peak RSS | napitap ADD p50 vs ref | napitap DEL p50 vs ref | failures |\n")
		p("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for i := range r.Variants {
			v := &r.Variants[i]
			if !v.Chained() {
				continue
			}
			n, br := v.Step("napitap"), v.Step("bridge")
			step := func(steps []Series, i int) Series {
				if i < 0 || i >= len(steps) {
					return Series{}
				}
				return steps[i]
			}
			nAdd, nDel, bAdd, bDel := step(v.AddSteps, n), step(v.DelSteps, n), step(v.AddSteps, br), step(v.DelSteps, br)
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %d |\n", v.Label,
				fmtDur(Percentile(v.Add.Wall, 50)), fmtDur(Percentile(v.Add.Wall, 99)), fmtDur(Percentile(nAdd.Wall, 50)), fmtDur(Percentile(nAdd.Wall, 99)), fmtDur(Percentile(bAdd.Wall, 50)),
				fmtDur(Percentile(v.Del.Wall, 50)), fmtDur(Percentile(v.Del.Wall, 99)), fmtDur(Percentile(nDel.Wall, 50)), fmtDur(Percentile(nDel.Wall, 99)), fmtDur(Percentile(bDel.Wall, 50)),
				rssOver(max(nAdd.MaxRSS, nDel.MaxRSS), r.RSSFloor), rssOver(max(bAdd.MaxRSS, bDel.MaxRSS), r.RSSFloor),
				fmtRatio(Ratio(Percentile(nAdd.Wall, 50), refAdd)), fmtRatio(Ratio(Percentile(nDel.Wall, 50), refDel)), v.AddFailures+v.DelFailures)
		}
		p("\n")
	}

	r.againstMarkdown(p)

	p("## Configs\n\n")
	for i := range r.Variants {
		v := &r.Variants[i]
		p("- %s: `%s`\n", v.Label, v.Config)
	}
	p("\n")

	p("## Goals\n\n")
	goalsMarkdown(p, "goal", r.Goals())

	if len(r.Bursts) > 0 {
		r.burstsMarkdown(p)
	}

	failuresMarkdown(p, r.FailureCount, r.Failures)
	return b.String()
}

// runHead is what every report of the bench starts with.
type runHead struct {
	sub, failureWhat string
	failures         int
	incomplete       string
	commandLine      string
	machine          Machine
	started          time.Time
	elapsed          time.Duration
	build            string
}

// markdown writes the title, the FAILED and INCOMPLETE banners, the
// command line and the machine table.
func (h runHead) markdown(p func(string, ...any)) {
	p("# napitap-bench %s\n\n", h.sub)
	if h.failures > 0 {
		p("**FAILED: %d %s; the numbers below are not valid.**\n\n", h.failures, h.failureWhat)
	}
	if h.incomplete != "" {
		p("**INCOMPLETE: the run stopped early (%s); the numbers below cover what ran.**\n\n", h.incomplete)
	}
	p("```\n%s\n```\n\n", h.commandLine)
	m := h.machine
	p("| machine | |\n|---|---|\n")
	p("| nproc | %d |\n| kernel | %s `%s` |\n| CPU | %s |\n| Go | %s |\n", m.CPUs, m.Kernel, m.KernelVersion, m.CPUModel, m.GoVersion)
	p("| load average (1/5/15 min) | start %s, end %s |\n", m.LoadStart, m.LoadEnd)
	p("| date | %s, %s |\n| binaries | %s |\n\n", h.started.UTC().Format(time.RFC3339), h.elapsed.Round(time.Second), h.build)
}

// goalsMarkdown writes goals as a table, first column headed first. A
// goal whose Target is "-" is a figure without one: no verdict.
func goalsMarkdown(p func(string, ...any), first string, goals []Goal) {
	p("| %s | measured | target | |\n|---|---|---|---|\n", first)
	for _, g := range goals {
		verdict := ""
		switch {
		case g.Known && g.Met:
			verdict = "met"
		case g.Known:
			verdict = "**missed**"
		case g.Target != "-":
			verdict = "not measured"
		}
		measured := g.Measured
		if measured == "" {
			measured = "-"
		}
		p("| %s | %s | %s | %s |\n", g.Name, measured, g.Target, verdict)
	}
	p("\n")
}

// failuresMarkdown quotes the first failures, and counts the rest.
func failuresMarkdown(p func(string, ...any), count int, quoted []string) {
	if count == 0 {
		return
	}
	p("## Failures (%d)\n\n", count)
	for _, f := range quoted {
		p("- `%s`\n", strings.ReplaceAll(f, "`", "'"))
	}
	if len(quoted) < count {
		p("- ... %d more\n", count-len(quoted))
	}
	p("\n")
}

// burstsMarkdown renders the bursts: slab per pod by kind and size first,
// then every burst in full.
func (r *Report) burstsMarkdown(p func(string, ...any)) {
	p("## Bursts: kernel slab, napitapd, latency\n\n")
	p("N pods, each with a pod netns of its own, ADDed at once, then DELeted at once: the launcher prepares all N execs, then forks them ")
	p("back to back (Go serialises forks under `syscall.ForkLock` anyway, so N goroutines would fork no faster) and reaps them as they exit. ")
	p("Wall is from the first fork to the last exit. Each pod is a standalone 4-queue tap: napitap's with its queues handed to napitapd, ")
	p("once as configured by default (root qdisc `noqueue`) and once with `\"rootQdisc\": \"mq\"` (the kernel's default), and the reference plugin's ")
	p("multiqueue tap, which opens no queue and is up with the kernel's default qdisc. For each N the three kinds run one after the other, ")
	p("in an order rotating with N.\n\n")
	p("Kernel slab per pod is the growth of `Slab` (and of its unreclaimable part, `SUnreclaim`) in /proc/meminfo from before the ADD burst ")
	p("to while holding the pods, divided by the pods; each reading is taken once two reads 250 ms apart agree within 256 KiB (at most 10 s). ")
	p("It is system-wide, so noisy on a busy machine, and a 1-pod burst says little; \"left after DEL\" is what had not come back after the DEL burst.\n\n")

	var sizes []int
	var kinds []string
	labels := map[string]string{}
	slab := map[string]map[int]*BurstResult{}
	for i := range r.Bursts {
		bu := &r.Bursts[i]
		if !slices.Contains(sizes, bu.Pods) {
			sizes = append(sizes, bu.Pods)
		}
		if slab[bu.Kind] == nil {
			kinds, labels[bu.Kind], slab[bu.Kind] = append(kinds, bu.Kind), bu.Label, map[int]*BurstResult{}
		}
		slab[bu.Kind][bu.Pods] = bu
	}
	p("| kernel slab per pod (SUnreclaim) |")
	for _, n := range sizes {
		p(" %d pods |", n)
	}
	p(" vs reference, %d pods |\n|---|", sizes[len(sizes)-1])
	for range sizes {
		p("---:|")
	}
	p("---:|\n")
	for _, k := range kinds {
		p("| %s |", labels[k])
		for _, n := range sizes {
			if bu := slab[k][n]; bu != nil {
				p(" %s (%s) |", fmtSlab(bu.SlabPerPod()), fmtSlab(bu.SUnreclaimPerPod()))
			} else {
				p(" - |")
			}
		}
		p(" %s |\n", fmtRatio(r.SlabRatio(k, sizes[len(sizes)-1])))
	}
	p("\n")

	p("CPU is the sum of the plugins' user+sys; divided by wall x nproc it says how much of the machine the burst kept busy; sys is the kernel's part ")
	p("of it (the kernel splits user and sys by tick sampling, so only a sum over many execs means much). napitapd was measured (`/proc/<pid>/status`, ")
	p("`/proc/<pid>/fd`) while it held the N attachments; idle before the bursts it had VmRSS %s, VmHWM %s, %d fds.\n\n",
		fmtMiB(r.DaemonIdle.VmRSS), fmtMiB(r.DaemonIdle.VmHWM), r.DaemonIdle.FDs)
	p("| pods | kind | ADD wall | ADD p50 | ADD p99 | ADD CPU | ADD failures | DEL wall | DEL p50 | DEL p99 | DEL CPU | DEL failures | plugin peak RSS | napitapd VmRSS holding | napitapd VmHWM | napitapd fds holding | attachments / queues held | napitapd fds after DEL | kernel slab per pod | SUnreclaim per pod | slab per pod left after DEL |\n")
	p("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, bu := range r.Bursts {
		daemon := "- | - | - | - | -"
		if bu.Handoff {
			daemon = fmt.Sprintf("%s | %s | %d | %d / %d | %d", fmtMiB(bu.Holding.VmRSS), fmtMiB(bu.Holding.VmHWM), bu.Holding.FDs, bu.HeldAttachments, bu.HeldQueues, bu.After.FDs)
		}
		p("| %d | %s | %s | %s | %s | %s | %d | %s | %s | %s | %s | %d | %s | %s | %s | %s | %s |\n", bu.Pods, bu.Kind,
			fmtDur(bu.AddWall), fmtDur(Percentile(bu.Add.Wall, 50)), fmtDur(Percentile(bu.Add.Wall, 99)), r.cpuShare(bu.Add, bu.AddWall), bu.AddFailures,
			fmtDur(bu.DelWall), fmtDur(Percentile(bu.Del.Wall, 50)), fmtDur(Percentile(bu.Del.Wall, 99)), r.cpuShare(bu.Del, bu.DelWall), bu.DelFailures,
			rssOver(max(bu.Add.MaxRSS, bu.Del.MaxRSS), r.BurstRSSFloor), daemon,
			fmtSlab(bu.SlabPerPod()), fmtSlab(bu.SUnreclaimPerPod()), fmtSlab(bu.SlabLeftPerPod()))
	}
	p("\n")
}

// rssOver prints a peak RSS, or the bound it is under when it does not
// clear the launcher's floor.
func rssOver(v, floor int64) string {
	if floor > 0 && v > 0 && v <= floor {
		return "<= " + fmtMiB(floor)
	}
	return fmtMiB(v)
}

// cpuShare is the CPU a burst's execs used, and that over wall x nproc.
func (r *Report) cpuShare(s Series, wall time.Duration) string {
	var sum time.Duration
	for _, c := range s.CPU {
		sum += c
	}
	if sum == 0 {
		return "-"
	}
	out := fmtDur(sum)
	if wall > 0 && r.Machine.CPUs > 0 {
		out += fmt.Sprintf(" (%.0f%%)", 100*float64(sum)/float64(wall)/float64(r.Machine.CPUs))
	}
	if s.SysTotal > 0 {
		out += fmt.Sprintf(", sys %.0f%%", 100*float64(s.SysTotal)/float64(sum))
	}
	return out
}

// barRow is one row of the latency chart.
type barRow struct {
	Label    string
	Class    string // ref, napitap, chain
	P50, P99 time.Duration
}

func (r *Report) chartRows(del bool) []barRow {
	pick := func(v *VariantResult, steps bool, i int) Series {
		switch {
		case steps && del:
			return v.DelSteps[i]
		case steps:
			return v.AddSteps[i]
		case del:
			return v.Del
		default:
			return v.Add
		}
	}
	var rows, chains []barRow
	for i := range r.Variants {
		v := &r.Variants[i]
		class := "napitap"
		if v.Reference {
			class = "ref"
		}
		if !v.Chained() {
			s := pick(v, false, 0)
			rows = append(rows, barRow{v.Label, class, Percentile(s.Wall, 50), Percentile(s.Wall, 99)})
			continue
		}
		if n := v.Step("napitap"); n >= 0 {
			s := pick(v, true, n)
			rows = append(rows, barRow{v.Label + ": napitap exec", class, Percentile(s.Wall, 50), Percentile(s.Wall, 99)})
		}
		s := pick(v, false, 0)
		chains = append(chains, barRow{v.Label + ": whole chain", "chain", Percentile(s.Wall, 50), Percentile(s.Wall, 99)})
	}
	return append(rows, chains...)
}

// SVG renders ADD and DEL latency as horizontal bars: the bar is p50, the
// whisker runs to p99.
func (r *Report) SVG() string {
	add, del := r.chartRows(false), r.chartRows(true)
	const (
		labelW  = 390
		panelW  = 300
		gap     = 40
		rowH    = 24
		top     = 56
		bottomH = 56
	)
	rows := max(len(add), len(del))
	width := labelW + 2*panelW + gap + 20
	height := top + rows*rowH + bottomH
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="10" y="20" font-size="15" font-weight="bold">napitap-bench cni: plugin exec latency (bar p50, whisker p99)</text>` + "\n")
	p(`<text x="10" y="38" fill="#555">%s, %d CPUs, %d iterations, %s</text>`+"\n", xmlEscape(r.Machine.Kernel), r.Machine.CPUs, r.Iterations, r.Started.UTC().Format("2006-01-02"))
	for i, row := range add {
		y := top + i*rowH + rowH/2 + 4
		p(`<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", labelW-8, y, xmlEscape(row.Label))
	}
	panel := func(x0 int, title string, rows []barRow) {
		var hi time.Duration
		for _, row := range rows {
			hi = max(hi, row.P99, row.P50)
		}
		step, ticks := niceTicks(hi)
		scale := func(d time.Duration) float64 {
			if ticks == 0 {
				return 0
			}
			return float64(d) / float64(step*time.Duration(ticks)) * panelW
		}
		p(`<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, top-6, title)
		for t := 0; t <= ticks; t++ {
			x := float64(x0) + float64(t)*panelW/float64(max(ticks, 1))
			p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, top, x, top+len(rows)*rowH)
			p(`<text x="%.1f" y="%d" text-anchor="middle" fill="#555">%s</text>`+"\n", x, top+len(rows)*rowH+16, tickLabel(step*time.Duration(t)))
		}
		p(`<text x="%d" y="%d" text-anchor="middle" fill="#555">ms</text>`+"\n", x0+panelW/2, top+len(rows)*rowH+34)
		for i, row := range rows {
			y := top + i*rowH
			w50, w99 := scale(row.P50), scale(row.P99)
			p(`<rect x="%d" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n", x0, y+4, w50, rowH-8, barColor(row.Class))
			if row.P99 > row.P50 {
				mid := y + rowH/2
				p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>`+"\n", float64(x0)+w50, mid, float64(x0)+w99, mid)
				p(`<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#222"/>`+"\n", float64(x0)+w99, mid-5, float64(x0)+w99, mid+5)
			}
			p(`<text x="%.1f" y="%d" font-size="10" fill="#222">%s</text>`+"\n", float64(x0)+max(w50, w99)+4, y+rowH/2+4, fmtDur(row.P50))
		}
	}
	panel(labelW, "ADD", add)
	panel(labelW+panelW+gap, "DEL", del)
	p("</svg>\n")
	return b.String()
}

func barColor(class string) string {
	switch class {
	case "ref":
		return "#9e9e9e"
	case "chain":
		return "#a6c8e8"
	default:
		return "#2f6fb0"
	}
}

// niceTicks picks a 1/2/5 x 10^k step so that about 5 ticks cover hi.
func niceTicks(hi time.Duration) (step time.Duration, ticks int) {
	if hi <= 0 {
		return time.Millisecond, 1
	}
	raw := float64(hi) / 5
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = time.Duration(m * mag)
			break
		}
	}
	step = max(step, time.Microsecond)
	ticks = int((hi + step - 1) / step)
	return step, max(ticks, 1)
}

func tickLabel(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms == math.Trunc(ms) {
		return fmt.Sprintf("%.0f", ms)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.3f", ms), "0"), ".")
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}

// againstBlocks is how many consecutive blocks of iterations the spread of
// an --against ratio is taken over.
const againstBlocks = 5

// againstMarkdown compares each napitap variant with its twin run with
// --against's binary: napitap's own exec, CPU (user+sys) and wall, as the
// ratio of this build's median to the other's over the whole run, and the
// lowest and highest ratio of the medians of againstBlocks consecutive
// blocks of iterations, which the load of the machine moves alike for both.
func (r *Report) againstMarkdown(p func(string, ...any)) {
	type pair struct{ this, other *VariantResult }
	var pairs []pair
	for i := range r.Variants {
		if tw := &r.Variants[i]; tw.TwinOf != "" {
			if v := r.Variant(tw.TwinOf); v != nil {
				pairs = append(pairs, pair{v, tw})
			}
		}
	}
	if len(pairs) == 0 {
		return
	}
	p("## This build against --against's napitap\n\n")
	p("napitap's own exec in each variant, this build's over the other's (both run in every iteration, trading places every other one): the ratio of the medians of the whole run, ")
	p("then, in brackets, the lowest and highest ratio of the medians of %d consecutive blocks of iterations.\n\n", againstBlocks)
	p("| variant | ADD CPU | DEL CPU | ADD wall | DEL wall | ADD CPU p50, this / other | DEL CPU p50, this / other |\n")
	p("|---|---:|---:|---:|---:|---:|---:|\n")
	step := func(v *VariantResult, del bool) Series {
		steps := v.AddSteps
		if del {
			steps = v.DelSteps
		}
		if i := v.Step("napitap"); i >= 0 && i < len(steps) {
			return steps[i]
		}
		return Series{}
	}
	for _, pr := range pairs {
		cell := func(del, cpu bool) string {
			a, b := step(pr.this, del).Wall, step(pr.other, del).Wall
			if cpu {
				a, b = step(pr.this, del).CPU, step(pr.other, del).CPU
			}
			return fmtRatio(Ratio(Percentile(a, 50), Percentile(b, 50))) + " (" + blockRange(a, b) + ")"
		}
		p("| %s | %s | %s | %s | %s | %s / %s | %s / %s |\n", pr.this.Label,
			cell(false, true), cell(true, true), cell(false, false), cell(true, false),
			fmtDur(Percentile(step(pr.this, false).CPU, 50)), fmtDur(Percentile(step(pr.other, false).CPU, 50)),
			fmtDur(Percentile(step(pr.this, true).CPU, 50)), fmtDur(Percentile(step(pr.other, true).CPU, 50)))
	}
	p("\n")
}

// blockRange is the lowest and highest ratio of the medians of a and b
// over againstBlocks consecutive blocks of their samples.
func blockRange(a, b []time.Duration) string {
	n := min(len(a), len(b))
	if n < againstBlocks {
		return "-"
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for k := range againstBlocks {
		from, to := k*n/againstBlocks, (k+1)*n/againstBlocks
		ratio := Ratio(Percentile(a[from:to], 50), Percentile(b[from:to], 50))
		lo, hi = math.Min(lo, ratio), math.Max(hi, ratio)
	}
	return fmtRatio(lo) + "-" + fmtRatio(hi)
}
