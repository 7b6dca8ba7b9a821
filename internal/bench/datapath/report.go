package datapath

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Goals for napitap's default configuration (the issue): one TCP stream at
// least 2x a plain queue, 64 B UDP at least 0.95x a plain queue's pps.
const (
	goalTCP = 2.0
	goalUDP = 0.95
)

// fact8 are DESIGN.md fact 8's first prototype figures (1 queue).
var fact8 = map[string]struct{ plain, napi, frags string }{
	"udp64":   {"365 kpps", "280 kpps", "249 kpps"},
	"udp512":  {"357 kpps", "298 kpps", "276 kpps"},
	"tcp1448": {"2.72 Gbit/s", "2.05 Gbit/s (threaded: 7.57, one run)", "2.14 Gbit/s"},
	"gso64k":  {"38-40 Gbit/s", "32.6 Gbit/s", "36.7 Gbit/s"},
}

type cellKey struct {
	size   string
	queues int
	mode   string
}

// table indexes the samples of a result.
type table struct {
	res     *Results
	opts    options
	samples map[cellKey][]Sample
}

func newTable(res *Results, opts options) *table {
	t := &table{res: res, opts: opts, samples: map[cellKey][]Sample{}}
	for _, s := range res.Samples {
		k := cellKey{s.Size, s.Queues, s.Mode}
		t.samples[k] = append(t.samples[k], s)
	}
	return t
}

func (t *table) has(size string, q int, mode string) bool {
	return len(t.samples[cellKey{size, q, mode}]) > 0
}

func (t *table) spread(size string, q int, mode string, f func(Sample) float64) Spread {
	var v []float64
	for _, s := range t.samples[cellKey{size, q, mode}] {
		v = append(v, f(s))
	}
	return spreadOf(v)
}

// pairRatio is f(mode) / f(base) in the same run, over runs.
func (t *table) pairRatio(size string, q int, mode, base string, f func(Sample) float64) (Spread, bool) {
	plain := map[int]float64{}
	for _, s := range t.samples[cellKey{size, q, base}] {
		plain[s.Run] = f(s)
	}
	var v []float64
	for _, s := range t.samples[cellKey{size, q, mode}] {
		if p, ok := plain[s.Run]; ok && p > 0 && f(s) > 0 {
			v = append(v, f(s)/p)
		}
	}
	if len(v) == 0 {
		return Spread{}, false
	}
	return spreadOf(v), true
}

// ratio is mode's rate over plain's in the same run, over runs. TCP and
// UDP alike compare delivered frames per second, which for a fixed frame
// payload is the same ratio as Gbit/s.
func (t *table) ratio(size string, q int, mode string) (Spread, bool) {
	return t.pairRatio(size, q, mode, "plain", func(s Sample) float64 { return s.PPS })
}

// qdiscRatio is a +noqueue mode's rate over the same NAPI mode's with the
// kernel's qdisc, in the same run.
func (t *table) qdiscRatio(size string, q int, mode string) (Spread, bool) {
	base, ok := qdiscBase(mode)
	if !ok {
		return Spread{}, false
	}
	return t.pairRatio(size, q, mode, base, func(s Sample) float64 { return s.PPS })
}

// hasGroup reports whether any mode has samples of size with q queues.
func (t *table) hasGroup(size string, q int) bool {
	for _, m := range t.opts.Modes {
		if t.has(size, q, m.Name) {
			return true
		}
	}
	return false
}

func fmtSpread(s Spread, f func(float64) string) string {
	if s.N == 0 {
		return "–"
	}
	if s.N == 1 || f(s.Min) == f(s.Max) {
		return f(s.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", f(s.Median), f(s.Min), f(s.Max))
}

func fixed(prec int) func(float64) string {
	return func(v float64) string { return strconv.FormatFloat(v, 'f', prec, 64) }
}

func kpps(v float64) string { return strconv.FormatFloat(v/1000, 'f', 0, 64) }

func ratioStr(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + "x" }

func writeReport(res *Results, opts options) error {
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return err
	}
	t := newTable(res, opts)
	raw, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"datapath.json":    append(raw, '\n'),
		"datapath.md":      []byte(t.markdown()),
		"datapath-tcp.svg": []byte(t.plot(protoTCP)),
		"datapath-udp.svg": []byte(t.plot(protoUDP)),
		"datapath-h2g.svg": []byte(t.plotH2G()),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(opts.Out, name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("datapath: wrote %s\n", filepath.Join(opts.Out, "datapath.md"))
	return nil
}

func (t *table) markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	m := t.res.Machine
	p("# napitap-bench datapath\n\n")
	p("What IFF_NAPI, threaded NAPI, `gro_flush_timeout` and IFF_NAPI_FRAGS do to the data path of a VMM without vhost-net (Cloud Hypervisor, Firecracker, QEMU `vhost=off`): a writer writes each guest frame into a tap queue fd, a receiver in the pod netns reads it.\n\n")
	if load, err := strconv.ParseFloat(strings.Fields(m.LoadAvg + " 0")[0], 64); err == nil && load > 0.25*float64(m.CPUs) {
		p("**Provisional:** other work was running on the machine (load average %s at the start on %d CPUs); re-run on an idle machine for final numbers.\n\n", m.LoadAvg, m.CPUs)
	}
	p("```\n%s\n```\n\n", t.res.Command)
	p("- Machine: %s, %s, %d CPUs, %.1f GiB", m.Kernel, m.CPU, m.CPUs, m.MemoryGiB)
	if m.Virtualized != "" {
		p(", virtualized")
	}
	p("; %s; load average at start %s", m.GoVersion, m.LoadAvg)
	if m.Commit != "" {
		p("; commit %s", m.Commit)
	}
	p("\n- Run %s to %s\n", t.res.Started.Format("2006-01-02 15:04:05 MST"), t.res.Finished.Format("15:04:05"))
	for _, s := range t.res.Settings {
		p("- %s\n", s)
	}
	for _, r := range t.res.Merged {
		p("- With the cells of another run (sizes %s, queues %v, modes %s; %d runs; %s to %s, load average at start %s):\n\n  ```\n  %s\n  ```\n",
			strings.Join(r.Sizes, ", "), r.Queues, strings.Join(r.Modes, ", "), r.Runs,
			r.Started.Format("2006-01-02 15:04 MST"), r.Finished.Format("15:04"), r.LoadAvg, r.Command)
	}
	p("\nEvery figure is the median over runs, with the range (min–max) in brackets. \"× plain\" divides a mode's rate by the plain queue's rate of the same run, then takes the median. pps counts frames delivered to the application per second (for TCP: payload read / payload per frame); Gbit/s counts payload. CPU figures are in cores (1.00 = one CPU busy for the whole window): the machine's /proc/stat columns (everything on the machine, not only this benchmark), and user/sys of the writer threads, receiver threads and threaded-NAPI kernel threads (/proc/<pid>/task/<tid>/stat). CPU µs/frame is the CPU time of the benchmark's own threads (writers, receivers, threaded-NAPI kthreads, including softirq work run in their context) per frame delivered, with the writers' time per frame written in brackets: it holds up better than rates when other work competes for the CPUs, but misses softirq work that ran in ksoftirqd or in other tasks' context. frames/skb is the tap's rx_packets (frames written into its queues) over Ip.InReceives (skbs reaching IP) in the pod netns: above 1 when GRO merged frames.\n\n")

	t.goals(&b)
	t.fact8(&b)
	t.qdiscGoal(&b)
	t.roundTrips(&b)
	t.scaleSection(&b)

	p("## Results\n\n")
	p("![TCP throughput relative to a plain queue](datapath-tcp.svg)\n\n")
	p("![UDP pps relative to a plain queue](datapath-udp.svg)\n\n")
	p("![Host to guest relative to a plain queue](datapath-h2g.svg)\n\n")
	for _, size := range t.opts.Sizes {
		for _, q := range t.opts.Queues {
			if !t.hasGroup(size.Name, q) {
				continue
			}
			p("### %s, %d %s\n\n", size.describe(), q, plural(q, "queue", "queues"))
			if size.Dir != guestToHost {
				t.h2gTable(&b, size, q)
				continue
			}
			p("| mode | rx kpps | Gbit/s | × plain | tx kpps | loss | frames/skb | CPU µs/frame (writer) | machine usr / sys / si | writer usr / sys | receiver usr / sys | NAPI kthreads | notes |\n")
			p("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			for _, mode := range t.opts.Modes {
				if !t.has(size.Name, q, mode.Name) {
					continue
				}
				sp := func(f func(Sample) float64) Spread { return t.spread(size.Name, q, mode.Name, f) }
				r := "–"
				if rs, ok := t.ratio(size.Name, q, mode.Name); ok {
					r = fmtSpread(rs, ratioStr)
				}
				loss := "–"
				if size.Proto == protoUDP {
					loss = fmtSpread(sp(func(s Sample) float64 { return 100 * s.Loss }), fixed(1)) + "%"
				}
				two := func(a, b func(Sample) float64) string {
					return fmt.Sprintf("%.2f / %.2f", sp(a).Median, sp(b).Median)
				}
				kth := "–"
				if sp(func(s Sample) float64 { return float64(s.NAPIThreadN) }).Median > 0 {
					kth = fmt.Sprintf("%.0f: %s", sp(func(s Sample) float64 { return float64(s.NAPIThreadN) }).Median,
						two(func(s Sample) float64 { return s.NAPIThreads.User }, func(s Sample) float64 { return s.NAPIThreads.Sys }))
				}
				p("| %s | %s | %s | %s | %s | %s | %s | %s (%s) | %s / %.2f | %s | %s | %s | %s |\n", mode.Name,
					fmtSpread(sp(func(s Sample) float64 { return s.PPS }), kpps),
					fmtSpread(sp(func(s Sample) float64 { return s.Gbps }), fixed(2)),
					r,
					fmtSpread(sp(func(s Sample) float64 { return s.TxPPS }), kpps),
					loss,
					fmtSpread(sp(func(s Sample) float64 { return s.FramesPerSKB }), fixed(1)),
					fmtSpread(sp(func(s Sample) float64 { return s.CPUPerFrameUs }), fixed(2)),
					fixed(2)(sp(func(s Sample) float64 { return s.WriterPerFrameUs }).Median),
					two(func(s Sample) float64 { return s.Machine.User }, func(s Sample) float64 { return s.Machine.Sys }),
					sp(func(s Sample) float64 { return s.Machine.SoftIRQ }).Median,
					two(func(s Sample) float64 { return s.Writer.User }, func(s Sample) float64 { return s.Writer.Sys }),
					two(func(s Sample) float64 { return s.Receiver.User }, func(s Sample) float64 { return s.Receiver.Sys }),
					kth, t.notes(size, q, mode.Name))
			}
			var other []float64
			for _, mode := range t.opts.Modes {
				for _, smp := range t.samples[cellKey{size.Name, q, mode.Name}] {
					other = append(other, smp.OtherCores)
				}
			}
			if o := spreadOf(other); o.N > 0 {
				p("\nOther work on the machine during these cells: %s cores.\n", fmtSpread(o, fixed(2)))
			}
			p("\n")
		}
	}
	p("Raw samples, per CPU splits and pod netns counters of every run: `datapath.json`.\n")
	return b.String()
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// notes flags what makes a cell's number less than it seems.
func (t *table) notes(size Size, q int, mode string) string {
	var n []string
	var paced, retrans, csumErr, rcvbuf uint64
	for _, s := range t.samples[cellKey{size.Name, q, mode}] {
		paced += s.Paced
		retrans += s.Retrans
		csumErr += s.Net["Udp.InCsumErrors"] + s.Net["Tcp.InCsumErrors"]
		rcvbuf += s.Net["Udp.RcvbufErrors"]
	}
	if paced > 0 {
		n = append(n, fmt.Sprintf("writer waited %d× for the backlog", paced))
	}
	if retrans > 0 {
		n = append(n, fmt.Sprintf("%d go-back retransmits", retrans))
	}
	if rcvbuf > 0 {
		n = append(n, fmt.Sprintf("%d socket-buffer drops", rcvbuf))
	}
	if csumErr > 0 {
		n = append(n, fmt.Sprintf("%d checksum errors", csumErr))
	}
	return strings.Join(n, "; ")
}

func (t *table) goals(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## Goal for the default configuration\n\n")
	p("Wanted: one TCP stream of 1448-byte segments at least %.1fx a plain queue, and 64-byte UDP at least %.2fx a plain queue's pps (1 queue, same run).\n\n", goalTCP, goalUDP)
	if !t.has("tcp1448", 1, "plain") || !t.has("udp64", 1, "plain") {
		p("Not evaluated: needs sizes tcp1448 and udp64 with 1 queue and mode plain.\n\n")
		return
	}
	p("| mode | TCP 1448 B, 1 stream, × plain | UDP 64 B, × plain pps | TCP goal | UDP goal |\n|---|---|---|---|---|\n")
	type cand struct {
		mode     string
		tcp, udp float64
	}
	var both, all []cand
	for _, mode := range t.opts.Modes {
		if mode.Name == "plain" {
			continue
		}
		rt, ok1 := t.ratio("tcp1448", 1, mode.Name)
		ru, ok2 := t.ratio("udp64", 1, mode.Name)
		if !ok1 || !ok2 {
			continue
		}
		okT, okU := rt.Median >= goalTCP, ru.Median >= goalUDP
		p("| %s | %s | %s | %s | %s |\n", mode.Name, fmtSpread(rt, ratioStr), fmtSpread(ru, ratioStr), meets(rt, goalTCP), meets(ru, goalUDP))
		c := cand{mode.Name, rt.Median, ru.Median}
		all = append(all, c)
		if okT && okU {
			both = append(both, c)
		}
	}
	p("\n")
	if len(all) == 0 {
		return
	}
	if len(both) > 0 {
		best := both[0]
		for _, c := range both {
			if c.tcp+c.udp > best.tcp+best.udp {
				best = c
			}
		}
		var names []string
		for _, c := range both {
			names = append(names, "`"+c.mode+"`")
		}
		p("**Meets both (by the median):** %s. Best of them: `%s` (TCP %.2fx, UDP %.2fx).", strings.Join(names, ", "), best.mode, best.tcp, best.udp)
		if t.res.Machine.CPUs <= 2 {
			p(" On %d CPUs threaded NAPI's kernel thread has no CPU of its own: it shares one with the writer or the receiver, so its gain here says little about a node with spare cores, and the reverse.", t.res.Machine.CPUs)
		}
		p("\n\n")
		return
	}
	bestT, bestU := all[0], all[0]
	for _, c := range all {
		if c.tcp > bestT.tcp {
			bestT = c
		}
		if c.udp > bestU.udp {
			bestU = c
		}
	}
	p("**No configuration meets both.** Best for one TCP stream: `%s` (%.2fx, with UDP 64 B at %.2fx). Best for 64 B UDP among the NAPI modes: `%s` (%.2fx, with TCP at %.2fx). ",
		bestT.mode, bestT.tcp, bestT.udp, bestU.mode, bestU.udp, bestU.tcp)
	switch {
	case bestT.tcp >= goalTCP:
		p("The TCP goal is reachable only at a cost in small-packet rate of %.0f%% (`%s`); ", 100*(1-bestT.udp), bestT.mode)
	default:
		p("No mode reaches the TCP goal here; ")
	}
	p("a plain queue (no NAPI) keeps UDP at 1.00x by definition. The trade-off: NAPI with GRO-enabling knobs for bulk TCP, or plain for small-packet rate.\n\n")
}

// meets: "yes" when every run reaches the goal, "median only" when the
// median does and some run does not.
func meets(r Spread, goal float64) string {
	switch {
	case r.Min >= goal:
		return "yes"
	case r.Median >= goal:
		return "median only"
	}
	return "no"
}

// fact8 confronts DESIGN.md fact 8 with this run.
func (t *table) fact8(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	p("## DESIGN.md fact 8 against this run\n\n")
	p("| workload (1 queue) | fact 8: plain | fact 8: NAPI | fact 8: NAPI_FRAGS | now: plain | now: NAPI | now: NAPI_FRAGS |\n|---|---|---|---|---|---|---|\n")
	for _, size := range t.opts.Sizes {
		f, ok := fact8[size.Name]
		if !ok {
			continue
		}
		val := func(mode string) string {
			if !t.has(size.Name, 1, mode) {
				return "–"
			}
			if size.Proto == protoUDP {
				return fmtSpread(t.spread(size.Name, 1, mode, func(s Sample) float64 { return s.PPS }), kpps) + " kpps"
			}
			return fmtSpread(t.spread(size.Name, 1, mode, func(s Sample) float64 { return s.Gbps }), fixed(2)) + " Gbit/s"
		}
		napi := val("napi")
		if size.Name == "tcp1448" && t.has(size.Name, 1, "threaded") {
			napi += " (threaded: " + val("threaded") + ")"
		}
		p("| %s | %s | %s | %s | %s | %s | %s |\n", size.describe(), f.plain, f.napi, f.frags, val("plain"), napi, val("frags"))
	}
	p("\n")

	// (a) plain NAPI costs 15-25% per packet: by rate, and by CPU per frame.
	var rs, cs []string
	var rates, costs []Spread
	for _, size := range []string{"udp64", "udp512", "tcp1448"} {
		if r, ok := t.ratio(size, 1, "napi"); ok {
			rs = append(rs, fmt.Sprintf("%s %s", size, fmtSpread(r, ratioStr)))
			rates = append(rates, r)
		}
		if r, ok := t.pairRatio(size, 1, "napi", "plain", func(s Sample) float64 { return s.CPUPerFrameUs }); ok {
			cs = append(cs, fmt.Sprintf("%s %s", size, fmtSpread(r, ratioStr)))
			costs = append(costs, r)
		}
	}
	if len(rates) > 0 {
		p("- *\"Plain NAPI costs 15-25%% per packet\"*. By rate (NAPI ÷ plain, the claim is 0.75-0.85): %s — %s. ",
			judge(rates, 0.75, 0.85, 0.05, "no per-packet cost", "a larger cost", "a smaller cost"), strings.Join(rs, ", "))
		if len(costs) > 0 {
			p("By CPU time per delivered frame (NAPI ÷ plain, the claim is 1.18-1.33): %s — %s.",
				judge(costs, 1/0.85, 1/0.75, 0.08, "no extra cost", "a larger cost", "a smaller cost"), strings.Join(cs, ", "))
		}
		p("\n")
	}
	// (b) threaded NAPI ~2.8x for one TCP stream.
	if r, ok := t.ratio("tcp1448", 1, "threaded"); ok {
		p("- *\"Threaded NAPI ~2.8x for one TCP stream\"* (7.57 ÷ 2.72, one run): %s — threaded ÷ plain %s over %d runs.\n",
			judge([]Spread{r}, 2.3, 3.3, 0, "no gain", "a larger gain", "a smaller gain"), fmtSpread(r, ratioStr), r.N)
	}
	// (c) gro_flush_timeout lets GRO merge.
	var merges []string
	allMerge, anyGRO := true, false
	for _, mode := range t.opts.Modes {
		if mode.GROFlushTimeout == 0 || mode.Threaded || mode.Frags || !t.has("tcp1448", 1, mode.Name) {
			continue
		}
		anyGRO = true
		sp := t.spread("tcp1448", 1, mode.Name, func(s Sample) float64 { return s.FramesPerSKB })
		r, _ := t.ratio("tcp1448", 1, mode.Name)
		merges = append(merges, fmt.Sprintf("`%s` %s frames/skb (%s plain)", mode.Name, fmtSpread(sp, fixed(1)), ratioStr(r.Median)))
		if sp.Median < 1.5 {
			allMerge = false
		}
	}
	if anyGRO {
		base := ""
		if t.has("tcp1448", 1, "napi") {
			base = fmt.Sprintf("; `napi` alone: %s frames/skb", fmtSpread(t.spread("tcp1448", 1, "napi", func(s Sample) float64 { return s.FramesPerSKB }), fixed(1)))
		}
		verdict := "confirmed"
		if !allMerge {
			verdict = "not confirmed for every timeout"
		}
		p("- *\"gro_flush_timeout lets GRO merge\"*: %s — TCP 1448 B, 1 stream: %s%s.\n", verdict, strings.Join(merges, ", "), base)
	}
	if r, ok := t.ratio("gso64k", 1, "napi"); ok {
		p("- 64 KB GSO frames: NAPI ÷ plain %s (fact 8: 32.6 ÷ 38-40 = 0.82-0.86).\n", fmtSpread(r, ratioStr))
	}
	if r, ok := t.ratio("tcp1448", 1, "frags"); ok {
		sp := t.spread("tcp1448", 1, "frags", func(s Sample) float64 { return s.FramesPerSKB })
		p("- NAPI_FRAGS, TCP 1448 B: %s plain, %s frames/skb (fact 11: never merged in GRO in earlier tests).\n", fmtSpread(r, ratioStr), fmtSpread(sp, fixed(1)))
	}
	p("\n")
}

// judge compares measured ratios with a claimed range [lo, hi]. slack
// widens the range for "confirmed". Runs that disagree by more than 1.5x
// make it inconclusive. none is what a ratio of 1 means.
func judge(rs []Spread, lo, hi, slack float64, none, larger, smaller string) string {
	var meds []float64
	for _, r := range rs {
		if r.N > 1 && r.Min > 0 && r.Max/r.Min > 1.5 {
			return "inconclusive: the runs disagree by more than 1.5x (re-run on an idle machine)"
		}
		meds = append(meds, r.Median)
	}
	mlo, mhi := minMax(meds)
	// Claims above 1 grow with cost or gain, claims below 1 shrink.
	up := lo > 1
	switch {
	case mlo >= lo-slack && mhi <= hi+slack:
		return "confirmed"
	case math.Abs(mlo-1) < 0.05 && math.Abs(mhi-1) < 0.05:
		return "refuted: " + none
	case (up && mlo > hi+slack) || (!up && mhi < lo-slack):
		return "refuted in size: " + larger
	case (up && mhi < lo-slack) || (!up && mlo > hi+slack):
		return "refuted in size: " + smaller
	}
	return "partly confirmed (the workloads disagree)"
}

func minMax(v []float64) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, x := range v {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return lo, hi
}

// goalQdisc: host to guest, root qdisc noqueue against the kernel's
// (mq/pfifo_fast), same NAPI mode, same run (the goal).
const goalQdisc = 1.0

// perSec is a netstat counter of a sample per second.
func perSec(key string) func(Sample) float64 {
	return func(s Sample) float64 {
		if s.Seconds <= 0 {
			return 0
		}
		return float64(s.Net[key]) / s.Seconds
	}
}

// h2gTable writes one host-to-guest or round-trip table. "Writer" CPU is
// the VMM side's there, "receiver" CPU the pod's.
func (t *table) h2gTable(b *strings.Builder, size Size, q int) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	rr := size.Dir == roundTrip
	if rr {
		p("| mode | root qdisc | round trips/s | p50 µs | p99 µs | p50 × plain | p99 × plain | lost | VMM usr / sys | pod usr / sys | NAPI kthreads |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|\n")
	} else {
		p("| mode | root qdisc | VMM read kpps | Gbit/s | × plain | × kernel's qdisc | pod sent kpps | loss | tap tx drops/s | qdisc drops/s | CPU µs/frame | VMM usr / sys | pod usr / sys | NAPI kthreads | notes |\n")
		p("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	}
	for _, mode := range t.opts.Modes {
		if !t.has(size.Name, q, mode.Name) {
			continue
		}
		sp := func(f func(Sample) float64) Spread { return t.spread(size.Name, q, mode.Name, f) }
		two := func(a, b func(Sample) float64) string {
			return fmt.Sprintf("%.2f / %.2f", sp(a).Median, sp(b).Median)
		}
		kinds := map[string]bool{}
		for _, s := range t.samples[cellKey{size.Name, q, mode.Name}] {
			kinds[s.Qdisc] = true
		}
		qdisc := strings.Join(slices.Sorted(maps.Keys(kinds)), ", ")
		ratio := func(r Spread, ok bool) string {
			if !ok {
				return "–"
			}
			return fmtSpread(r, ratioStr)
		}
		kth := "–"
		if n := sp(func(s Sample) float64 { return float64(s.NAPIThreadN) }).Median; n > 0 {
			kth = fmt.Sprintf("%.0f: %s", n, two(func(s Sample) float64 { return s.NAPIThreads.User }, func(s Sample) float64 { return s.NAPIThreads.Sys }))
		}
		vmm := two(func(s Sample) float64 { return s.Writer.User }, func(s Sample) float64 { return s.Writer.Sys })
		pod := two(func(s Sample) float64 { return s.Receiver.User }, func(s Sample) float64 { return s.Receiver.Sys })
		loss := fmtSpread(sp(func(s Sample) float64 { return 100 * s.Loss }), fixed(1)) + "%"
		if rr {
			p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", mode.Name, qdisc,
				fmtSpread(sp(func(s Sample) float64 { return s.PPS }), fixed(0)),
				fmtSpread(sp(func(s Sample) float64 { return s.P50Us }), fixed(1)),
				fmtSpread(sp(func(s Sample) float64 { return s.P99Us }), fixed(1)),
				ratio(t.pairRatio(size.Name, q, mode.Name, "plain", func(s Sample) float64 { return s.P50Us })),
				ratio(t.pairRatio(size.Name, q, mode.Name, "plain", func(s Sample) float64 { return s.P99Us })),
				loss, vmm, pod, kth)
			continue
		}
		if size.Proto == protoTCP {
			loss = "–"
		}
		r, ok := t.ratio(size.Name, q, mode.Name)
		rq, okq := t.qdiscRatio(size.Name, q, mode.Name)
		p("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", mode.Name, qdisc,
			fmtSpread(sp(func(s Sample) float64 { return s.PPS }), kpps),
			fmtSpread(sp(func(s Sample) float64 { return s.Gbps }), fixed(2)),
			ratio(r, ok), ratio(rq, okq),
			fmtSpread(sp(func(s Sample) float64 { return s.TxPPS }), kpps),
			loss,
			fmtSpread(sp(perSec("Tap.TxDropped")), fixed(0)),
			fmtSpread(sp(perSec("Qdisc.Drops")), fixed(0)),
			fmtSpread(sp(func(s Sample) float64 { return s.CPUPerFrameUs }), fixed(2)),
			vmm, pod, kth, t.notes(size, q, mode.Name))
	}
	var other []float64
	for _, mode := range t.opts.Modes {
		for _, smp := range t.samples[cellKey{size.Name, q, mode.Name}] {
			other = append(other, smp.OtherCores)
		}
	}
	if o := spreadOf(other); o.N > 0 {
		p("\nOther work on the machine during these cells: %s cores.\n", fmtSpread(o, fixed(2)))
	}
	p("\n")
}

// qdiscGoal confronts the host-to-guest cells with the qdisc goal.
func (t *table) qdiscGoal(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	var rows []string
	for _, size := range t.opts.Sizes {
		if size.Dir != hostToGuest {
			continue
		}
		for _, q := range t.opts.Queues {
			for _, mode := range t.opts.Modes {
				r, ok := t.qdiscRatio(size.Name, q, mode.Name)
				if !ok {
					continue
				}
				base, _ := qdiscBase(mode.Name)
				var kind string
				for _, s := range t.samples[cellKey{size.Name, q, base}] {
					kind = s.Qdisc
				}
				drops := func(m string) string {
					return fixed(0)(t.spread(size.Name, q, m, perSec("Tap.TxDropped")).Median) + " / " +
						fixed(0)(t.spread(size.Name, q, m, perSec("Qdisc.Drops")).Median)
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %d | %s | %s | %s | %s | %s |", size.Name, base, q, kind,
					fmtSpread(r, ratioStr), meets(r, goalQdisc), drops(base), drops(mode.Name)))
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	p("## Host to guest: root qdisc noqueue against the kernel's\n\n")
	p("Wanted: with root qdisc `noqueue`, the rate the VMM reads at least %.1fx that with the kernel's qdisc (mq over pfifo_fast on a multiqueue tap, pfifo_fast on a single-queue one), same NAPI mode, same run. Drops are per second, at the tap (its ring full: tx_dropped) / in the qdisc.\n\n", goalQdisc)
	p("| workload | NAPI mode | queues | kernel's qdisc | noqueue ÷ kernel's | goal | drops/s tap / qdisc, kernel's | drops/s tap / qdisc, noqueue |\n|---|---|---|---|---|---|---|---|\n")
	p("%s\n\n", strings.Join(rows, "\n"))
}

// roundTrips summarizes the round-trip cells: NAPI modes against plain.
func (t *table) roundTrips(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	var rows []string
	for _, size := range t.opts.Sizes {
		if size.Dir != roundTrip {
			continue
		}
		for _, q := range t.opts.Queues {
			for _, mode := range t.opts.Modes {
				if !t.has(size.Name, q, mode.Name) {
					continue
				}
				sp := func(f func(Sample) float64) Spread { return t.spread(size.Name, q, mode.Name, f) }
				r50, _ := t.pairRatio(size.Name, q, mode.Name, "plain", func(s Sample) float64 { return s.P50Us })
				r99, _ := t.pairRatio(size.Name, q, mode.Name, "plain", func(s Sample) float64 { return s.P99Us })
				rows = append(rows, fmt.Sprintf("| %s | %d | %s | %s µs | %s µs | %s | %s |", size.Name, q, mode.Name,
					fmtSpread(sp(func(s Sample) float64 { return s.P50Us }), fixed(1)),
					fmtSpread(sp(func(s Sample) float64 { return s.P99Us }), fixed(1)),
					fmtSpread(r50, ratioStr), fmtSpread(r99, ratioStr)))
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	p("## Round trips through the tap\n\n")
	p("One request at a time from a UDP socket in the pod; the VMM reads it from the queue fd and writes the response into the same queue at once. Each flow has one request outstanding. Times are from send(2) to the response's read(2); × plain divides by the plain queue's percentile of the same run.\n\n")
	p("| workload | queues | mode | p50 | p99 | p50 × plain | p99 × plain |\n|---|---|---|---|---|---|---|\n")
	p("%s\n\n", strings.Join(rows, "\n"))
}

// scaleSection reports threaded NAPI at scale: idle taps' memory and
// wakeups, and the cells with more flows (queues) than CPUs.
func (t *table) scaleSection(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	sc := t.res.Scale
	var loaded [][2]any
	for _, size := range t.opts.Sizes {
		for _, q := range t.opts.Queues {
			if size.Dir == guestToHost && q > t.res.Machine.CPUs && t.has(size.Name, q, "threaded") {
				loaded = append(loaded, [2]any{size, q})
			}
		}
	}
	if sc == nil && len(loaded) == 0 {
		return
	}
	p("## Threaded NAPI at scale\n\n")
	if sc != nil {
		p("%d taps of %d queues at once, up, root qdisc noqueue, no traffic: NAPI against threaded NAPI, %d rounds, modes alternated. Memory is what /proc/meminfo gained once the taps were made (machine-wide: other work on the machine shows too); the threads' runs are how often the taps' napi/ kernel threads were put on a CPU in %.0f s of idle (schedstat), ctxt the machine's context switches per second.\n\n",
			sc.Taps, sc.Queues, len(sc.Samples)/2, sc.IdleSeconds)
		p("| mode | napi/ threads | Slab | SUnreclaim | KernelStack | per queue (Slab + KernelStack) | thread runs/s | thread CPU | machine ctxt/s | make all taps |\n|---|---|---|---|---|---|---|---|---|---|\n")
		med := map[string]float64{}
		for _, mode := range []string{"napi", "threaded"} {
			var ss []ScaleSample
			for _, s := range sc.Samples {
				if s.Mode == mode {
					ss = append(ss, s)
				}
			}
			if len(ss) == 0 {
				continue
			}
			sp := func(f func(ScaleSample) float64) Spread {
				var v []float64
				for _, s := range ss {
					v = append(v, f(s))
				}
				return spreadOf(v)
			}
			mib := func(kib int64) float64 { return float64(kib) / 1024 }
			perQ := sp(func(s ScaleSample) float64 { return float64(s.SlabKiB+s.KernelStackKiB) / float64(sc.Taps*sc.Queues) })
			med[mode] = perQ.Median
			p("| %s | %s | %s MiB | %s MiB | %s MiB | %s KiB | %s | %s ms | %s | %s s |\n", mode,
				fmtSpread(sp(func(s ScaleSample) float64 { return float64(s.Threads) }), fixed(0)),
				fmtSpread(sp(func(s ScaleSample) float64 { return mib(s.SlabKiB) }), fixed(1)),
				fmtSpread(sp(func(s ScaleSample) float64 { return mib(s.SUnreclaimKiB) }), fixed(1)),
				fmtSpread(sp(func(s ScaleSample) float64 { return mib(s.KernelStackKiB) }), fixed(1)),
				fmtSpread(perQ, fixed(1)),
				fmtSpread(sp(func(s ScaleSample) float64 { return s.ThreadRunsPerSec }), fixed(2)),
				fmtSpread(sp(func(s ScaleSample) float64 { return s.ThreadCPUms }), fixed(1)),
				fmtSpread(sp(func(s ScaleSample) float64 { return s.CtxtPerSec }), fixed(0)),
				fmtSpread(sp(func(s ScaleSample) float64 { return s.CreateSeconds }), fixed(1)))
		}
		if n, th := med["napi"], med["threaded"]; n > 0 && th > 0 {
			p("\nA NAPI kernel thread costs about %.0f KiB (the medians' difference per queue); %d of them about %.1f MiB.\n", th-n, sc.Taps*sc.Queues, (th-n)*float64(sc.Taps*sc.Queues)/1024)
		}
		p("\n")
	}
	if len(loaded) > 0 {
		p("Under load, more flows than CPUs (%d CPUs; one flow per queue, guest to host, same run; tables below):\n\n", t.res.Machine.CPUs)
		p("| workload | flows | napi × plain | threaded × plain | threaded ÷ napi | loss, threaded | CPU µs/frame plain / napi / threaded |\n|---|---|---|---|---|---|---|\n")
		for _, l := range loaded {
			size, q := l[0].(Size), l[1].(int)
			r := func(mode, base string) string {
				s, ok := t.pairRatio(size.Name, q, mode, base, func(s Sample) float64 { return s.PPS })
				if !ok {
					return "–"
				}
				return fmtSpread(s, ratioStr)
			}
			loss := "–"
			if size.Proto == protoUDP {
				loss = fmtSpread(t.spread(size.Name, q, "threaded", func(s Sample) float64 { return 100 * s.Loss }), fixed(1)) + "%"
			}
			cpu := func(m string) string {
				return fixed(2)(t.spread(size.Name, q, m, func(s Sample) float64 { return s.CPUPerFrameUs }).Median)
			}
			p("| %s | %d | %s | %s | %s | %s | %s / %s / %s |\n", size.describe(), q, r("napi", "plain"), r("threaded", "plain"), r("threaded", "napi"), loss, cpu("plain"), cpu("napi"), cpu("threaded"))
		}
		p("\n")
	}
}
