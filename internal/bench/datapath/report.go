package datapath

import (
	"encoding/json"
	"fmt"
	"maps"
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
		"datapath.json": append(raw, '\n'),
		"datapath.md":   []byte(t.markdown()),
		"datapath-tcp.svg": []byte(t.plot("TCP throughput relative to a plain queue", goalTCP,
			func(s Size) bool { return s.Dir == guestToHost && s.Proto == protoTCP })),
		"datapath-udp.svg": []byte(t.plot("UDP pps relative to a plain queue", goalUDP,
			func(s Size) bool { return s.Dir == guestToHost && s.Proto == protoUDP })),
		"datapath-h2g.svg": []byte(t.plot("Host to guest and round trips relative to a plain queue", 0,
			func(s Size) bool { return s.Dir != guestToHost })),
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
	p("What IFF_NAPI, threaded NAPI, `gro_flush_timeout`, IFF_NAPI_FRAGS and the tap's root qdisc do to the data path of a VMM without vhost-net (Cloud Hypervisor, Firecracker, QEMU `vhost=off`). Guest to host, a writer writes each guest frame into a tap queue fd and a receiver in the pod netns reads it; host to guest, a socket in the pod sends and the VMM reads the queue fds; round trips, the VMM answers each request from the pod at once.\n\n")
	// Not the load average at the start: a burst just before (the cni
	// bench's 500 execs) leaves it high for minutes while the CPUs are idle.
	var other []float64
	for _, smp := range t.res.Samples {
		other = append(other, smp.OtherCores)
	}
	if o := spreadOf(other); o.Median > 0.25*float64(m.CPUs) {
		p("**Provisional:** other work took %.2f of the %d CPUs during the measured cells (median); re-run on an idle machine for final numbers.\n\n", o.Median, m.CPUs)
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
	if m.Costs != nil {
		p("\n- Machine costs: %s", m.Costs)
		if e := m.CostsAtEnd; e != nil {
			p("; at the end %.2f µs and %.1f µs", e.SyscallUs, e.WakeupRoundUs)
		}
	}
	p("\n- Run %s to %s\n", t.res.Started.Format("2006-01-02 15:04:05 MST"), t.res.Finished.Format("15:04:05"))
	for _, s := range t.res.Settings {
		p("- %s\n", s)
	}
	for _, r := range t.res.Merged {
		p("- With the cells of another run (sizes %s, queues %v, modes %s; %d runs; %s to %s, load average at start %s):\n\n  ```\n  %s\n  ```\n",
			strings.Join(r.Sizes, ", "), r.Queues, strings.Join(r.Modes, ", "), r.Runs,
			r.Started.Format("2006-01-02 15:04 MST"), r.Finished.Format("15:04"), r.Machine.LoadAvg, r.Command)
		if r.Machine.Costs != nil {
			p("  - machine: %s\n", r.Machine.Costs)
		}
		for _, set := range r.Settings {
			if !slices.Contains(t.res.Settings, set) {
				p("  - %s\n", set)
			}
		}
	}
	if slices.ContainsFunc(t.opts.Sizes, func(s Size) bool { return s.Dir != guestToHost }) {
		p("- host to guest: a socket in the pod sends (UDP: sendmmsg(2) of 64 datagrams, as fast as the socket takes them; TCP: write(2) of 128 KiB, the kernel's congestion control); the VMM side reads each queue fd, one reader per queue pinned like the writers (O_NONBLOCK: read(2) until EAGAIN, then poll(2)), and for TCP is the peer: SYN-ACK, an ACK every %d in-order segments or when its queue runs dry, a duplicate ACK at once for anything out of order, which it keeps as a guest's out-of-order queue does; round trips: each flow has one request outstanding, and the VMM writes the response into the queue it read the request from. The pod's socket threads are pinned like the receivers; \"writer\" CPU columns are the VMM's, \"receiver\" the pod's\n", ackEvery)
	}
	p("\nEvery figure is the median over runs, with the range (min–max) in brackets. \"× plain\" divides a mode's rate by the plain queue's rate of the same run, then takes the median. pps counts frames delivered to the application per second (for TCP: payload read / payload per frame); Gbit/s counts payload. CPU figures are in cores (1.00 = one CPU busy for the whole window): the machine's /proc/stat columns (everything on the machine, not only this benchmark), and user/sys of the writer threads, receiver threads and threaded-NAPI kernel threads (/proc/<pid>/task/<tid>/stat), with how often per second the kernel threads were put on a CPU (/proc/<pid>/schedstat: about one wakeup each). CPU µs/frame is the CPU time of the benchmark's own threads (writers, receivers, threaded-NAPI kthreads, including softirq work run in their context) per frame delivered, with the writers' time per frame written in brackets: it holds up better than rates when other work competes for the CPUs, but misses softirq work that ran in ksoftirqd or in other tasks' context. frames/skb is the tap's rx_packets (frames written into its queues) over Ip.InReceives (skbs reaching IP) in the pod netns: above 1 when GRO merged frames.\n\n")

	t.goals(&b)
	t.qdiscGoal(&b)
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
			t.groupTable(&b, size, q)
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
	switch {
	case retrans > 0 && size.Dir == guestToHost:
		n = append(n, fmt.Sprintf("%d go-back retransmits", retrans))
	case retrans > 0:
		n = append(n, fmt.Sprintf("%d segments out of order or again at the guest", retrans))
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

// column is one column of a results table: its heading and its cell for
// a mode.
type column struct {
	head string
	cell func(mode string) string
}

// groupTable writes the table of one size and queue count, a row per
// mode. Host to guest and round trips, the "writer" threads are the VMM's
// readers and the "receiver" threads the pod's senders.
func (t *table) groupTable(b *strings.Builder, size Size, q int) {
	sp := func(m string, f func(Sample) float64) Spread { return t.spread(size.Name, q, m, f) }
	val := func(head string, f func(Sample) float64, format func(float64) string, suffix string) column {
		return column{head, func(m string) string { return fmtSpread(sp(m, f), format) + suffix }}
	}
	two := func(head string, a, c func(Sample) float64) column {
		return column{head, func(m string) string { return fmt.Sprintf("%.2f / %.2f", sp(m, a).Median, sp(m, c).Median) }}
	}
	ratio := func(head string, f func(Sample) float64, base func(string) (string, bool)) column {
		return column{head, func(m string) string {
			bm, ok := base(m)
			if r, ok2 := t.pairRatio(size.Name, q, m, bm, f); ok && ok2 {
				return fmtSpread(r, ratioStr)
			}
			return "–"
		}}
	}
	plain := func(string) (string, bool) { return "plain", true }
	pps := func(s Sample) float64 { return s.PPS }
	loss := val("loss", func(s Sample) float64 { return 100 * s.Loss }, fixed(1), "%")
	if size.Proto == protoTCP {
		loss = column{"loss", func(string) string { return "–" }}
	}
	vmm, pod := "writer", "receiver"
	if size.Dir != guestToHost {
		vmm, pod = "VMM", "pod"
	}
	cpu := []column{
		two(vmm+" usr / sys", func(s Sample) float64 { return s.Writer.User }, func(s Sample) float64 { return s.Writer.Sys }),
		two(pod+" usr / sys", func(s Sample) float64 { return s.Receiver.User }, func(s Sample) float64 { return s.Receiver.Sys }),
		{"NAPI kthreads", func(m string) string {
			if n := sp(m, func(s Sample) float64 { return float64(s.NAPIThreadN) }).Median; n > 0 {
				runs := sp(m, func(s Sample) float64 { return s.NAPIThreadRuns }).Median
				return fmt.Sprintf("%.0f: %.2f / %.2f, %.0fk runs/s", n, sp(m, func(s Sample) float64 { return s.NAPIThreads.User }).Median, sp(m, func(s Sample) float64 { return s.NAPIThreads.Sys }).Median, runs/1000)
			}
			return "–"
		}},
		{"notes", func(m string) string { return t.notes(size, q, m) }},
	}
	qdisc := column{"root qdisc", func(m string) string {
		kinds := map[string]bool{}
		for _, s := range t.samples[cellKey{size.Name, q, m}] {
			kinds[s.Qdisc] = true
		}
		return strings.Join(slices.Sorted(maps.Keys(kinds)), ", ")
	}}
	var cols []column
	switch size.Dir {
	case guestToHost:
		cols = []column{val("rx kpps", pps, kpps, ""), val("Gbit/s", func(s Sample) float64 { return s.Gbps }, fixed(2), ""),
			ratio("× plain", pps, plain), val("tx kpps", func(s Sample) float64 { return s.TxPPS }, kpps, ""), loss,
			val("frames/skb", func(s Sample) float64 { return s.FramesPerSKB }, fixed(1), ""),
			{"CPU µs/frame (writer)", func(m string) string {
				return fmtSpread(sp(m, func(s Sample) float64 { return s.CPUPerFrameUs }), fixed(2)) +
					fmt.Sprintf(" (%.2f)", sp(m, func(s Sample) float64 { return s.WriterPerFrameUs }).Median)
			}},
			{"machine usr / sys / si", func(m string) string {
				return fmt.Sprintf("%.2f / %.2f / %.2f", sp(m, func(s Sample) float64 { return s.Machine.User }).Median,
					sp(m, func(s Sample) float64 { return s.Machine.Sys }).Median, sp(m, func(s Sample) float64 { return s.Machine.SoftIRQ }).Median)
			}}}
	case hostToGuest:
		cols = []column{qdisc, val("VMM read kpps", pps, kpps, ""), val("Gbit/s", func(s Sample) float64 { return s.Gbps }, fixed(2), ""),
			ratio("× plain", pps, plain), ratio("× kernel's qdisc", pps, qdiscBase),
			val("pod sent kpps", func(s Sample) float64 { return s.TxPPS }, kpps, ""), loss,
			val("tap tx drops/s", perSec("Tap.TxDropped"), fixed(0), ""), val("qdisc drops/s", perSec("Qdisc.Drops"), fixed(0), ""),
			val("CPU µs/frame", func(s Sample) float64 { return s.CPUPerFrameUs }, fixed(2), "")}
	case roundTrip:
		p50, p99 := func(s Sample) float64 { return s.P50Us }, func(s Sample) float64 { return s.P99Us }
		cols = []column{qdisc, val("round trips/s", pps, fixed(0), ""), val("p50 µs", p50, fixed(1), ""), val("p99 µs", p99, fixed(1), ""),
			ratio("p50 × plain", p50, plain), ratio("p99 × plain", p99, plain), loss}
	}
	cols = append(append([]column{{"mode", func(m string) string { return m }}}, cols...), cpu...)
	for i, c := range cols {
		fmt.Fprintf(b, "| %s ", c.head)
		if i == len(cols)-1 {
			fmt.Fprintf(b, "|\n%s|\n", strings.Repeat("|---", len(cols)))
		}
	}
	var other []float64
	for _, mode := range t.opts.Modes {
		if !t.has(size.Name, q, mode.Name) {
			continue
		}
		for _, c := range cols {
			fmt.Fprintf(b, "| %s ", c.cell(mode.Name))
		}
		b.WriteString("|\n")
		for _, smp := range t.samples[cellKey{size.Name, q, mode.Name}] {
			other = append(other, smp.OtherCores)
		}
	}
	if o := spreadOf(other); o.N > 0 {
		fmt.Fprintf(b, "\nOther work on the machine during these cells: %s cores.\n", fmtSpread(o, fixed(2)))
	}
	b.WriteString("\n")
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
				rows = append(rows, fmt.Sprintf("| %s | %s | %d | %s | %s | %s |", size.Name, base, q, kind, fmtSpread(r, ratioStr), meets(r, goalQdisc)))
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	p("## Host to guest: root qdisc noqueue against the kernel's\n\n")
	p("Wanted: with root qdisc `noqueue`, the rate the VMM reads at least %.1fx that with the kernel's qdisc (mq over pfifo_fast on a multiqueue tap, pfifo_fast on a single-queue one), same NAPI mode, same run. Where the drops happen: the tables below.\n\n", goalQdisc)
	p("| workload | NAPI mode | queues | kernel's qdisc | noqueue ÷ kernel's | goal |\n|---|---|---|---|---|---|\n")
	p("%s\n\n", strings.Join(rows, "\n"))
}

// scaleSection reports threaded NAPI at scale: idle taps' memory and
// wakeups, and the cells with more flows (queues) than CPUs.
func (t *table) scaleSection(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	sc := t.res.Scale
	if sc == nil {
		return
	}
	p("## Threaded NAPI at scale\n\n")
	p("%d taps of %d queues at once, up, root qdisc noqueue, no traffic: NAPI against threaded NAPI, %d rounds, modes alternated. Memory is what /proc/meminfo gained once the taps were made (machine-wide: other work on the machine shows too); the threads' runs are how often the taps' napi/ kernel threads were put on a CPU in %.0f s of idle (schedstat).\n\n",
		sc.Taps, sc.Queues, len(sc.Samples)/2, sc.IdleSeconds)
	p("| mode | napi/ threads | Slab | SUnreclaim | KernelStack | per queue (Slab + KernelStack) | thread runs/s | thread CPU | make all taps |\n|---|---|---|---|---|---|---|---|---|\n")
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
		p("| %s | %s | %s MiB | %s MiB | %s MiB | %s KiB | %s | %s ms | %s s |\n", mode,
			fmtSpread(sp(func(s ScaleSample) float64 { return float64(s.Threads) }), fixed(0)),
			fmtSpread(sp(func(s ScaleSample) float64 { return mib(s.SlabKiB) }), fixed(1)),
			fmtSpread(sp(func(s ScaleSample) float64 { return mib(s.SUnreclaimKiB) }), fixed(1)),
			fmtSpread(sp(func(s ScaleSample) float64 { return mib(s.KernelStackKiB) }), fixed(1)),
			fmtSpread(perQ, fixed(1)),
			fmtSpread(sp(func(s ScaleSample) float64 { return s.ThreadRunsPerSec }), fixed(2)),
			fmtSpread(sp(func(s ScaleSample) float64 { return s.ThreadCPUms }), fixed(1)),
			fmtSpread(sp(func(s ScaleSample) float64 { return s.CreateSeconds }), fixed(1)))
	}
	if n, th := med["napi"], med["threaded"]; n > 0 && th > 0 {
		p("\nA NAPI kernel thread costs about %.0f KiB (the medians' difference per queue); %d of them about %.1f MiB.\n", th-n, sc.Taps*sc.Queues, (th-n)*float64(sc.Taps*sc.Queues)/1024)
	}
	p("\n")
}
