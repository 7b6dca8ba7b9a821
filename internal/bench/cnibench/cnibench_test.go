package cnibench

import (
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func ms(v ...float64) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x * float64(time.Millisecond))
	}
	return out
}

func TestPercentileIsNearestRank(t *testing.T) {
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[99-i] = time.Duration(i+1) * time.Millisecond // unsorted on purpose
	}
	fifty := hundred[50:] // 50 down to 1 ms
	for _, c := range []struct {
		name    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"none", nil, 50, 0},
		{"one", ms(7), 50, 7 * time.Millisecond},
		{"one p99", ms(7), 99, 7 * time.Millisecond},
		{"p50 of 1..100", hundred, 50, 50 * time.Millisecond},
		{"p99 of 1..100", hundred, 99, 99 * time.Millisecond},
		{"p100 of 1..100", hundred, 100, 100 * time.Millisecond},
		{"p50 of 1..50", fifty, 50, 25 * time.Millisecond},
		{"p99 of 50 is the max", fifty, 99, 50 * time.Millisecond},
		{"p50 of an even pair is the lower", ms(1, 3), 50, time.Millisecond},
		{"tiny p is the min", ms(5, 1, 9), 0.1, time.Millisecond},
	} {
		if got := Percentile(c.samples, c.p); got != c.want {
			t.Errorf("%s: Percentile(p%g) = %v, want %v", c.name, c.p, got, c.want)
		}
	}
	in := ms(3, 1, 2)
	Percentile(in, 50)
	if in[0] != 3*time.Millisecond {
		t.Error("Percentile sorted its input in place")
	}
}

func TestASeriesKeepsEveryRunAndTheLargestRSS(t *testing.T) {
	var s Series
	s.Add(3*time.Millisecond, time.Millisecond, 8<<20)
	s.Add(1*time.Millisecond, time.Millisecond, 12<<20)
	s.Add(2*time.Millisecond, time.Millisecond, 9<<20)
	if Percentile(s.Wall, 50) != 2*time.Millisecond || Percentile(s.Wall, 99) != 3*time.Millisecond || len(s.CPU) != 3 {
		t.Errorf("series %+v", s)
	}
	if s.MaxRSS != 12<<20 {
		t.Errorf("MaxRSS %d, want the largest", s.MaxRSS)
	}
	if !math.IsNaN(Ratio(time.Millisecond, 0)) || Ratio(3*time.Millisecond, 2*time.Millisecond) != 1.5 {
		t.Error("Ratio")
	}
	for d, want := range map[time.Duration]string{0: "-", 500 * time.Microsecond: "0.50 ms", 12340 * time.Microsecond: "12.3 ms", 250 * time.Millisecond: "250 ms"} {
		if got := fmtDur(d); got != want {
			t.Errorf("fmtDur(%v) = %q, want %q", d, got, want)
		}
	}
}

func series(wall []time.Duration, rss int64) Series {
	return Series{Wall: wall, CPU: wall, MaxRSS: rss}
}

// fakeReport: napitap 4-queue ADD is faster than the reference, its DEL
// slower; napitap's RSS and napitapd's are within the goals.
func fakeReport() *Report {
	return &Report{
		CommandLine: "napitap-bench cni --iterations 3",
		Started:     time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Machine:     Machine{CPUs: 2, Kernel: "6.18.0", CPUModel: "Test CPU"},
		Iterations:  3,
		Variants: []VariantResult{
			{ID: "a", Label: "(a) tap <ref>", Plugins: []string{"tap"}, Reference: true,
				Add: series(ms(10, 12, 20), 9<<20), Del: series(ms(20, 22, 30), 9<<20),
				AddSteps: []Series{series(ms(10, 12, 20), 9<<20)}, DelSteps: []Series{series(ms(20, 22, 30), 9<<20)}},
			{ID: "b4", Label: "(b4) napitap", Plugins: []string{"napitap"},
				Add: series(ms(5, 6, 7), 11<<20), Del: series(ms(24, 25, 40), 11<<20),
				AddSteps: []Series{series(ms(5, 6, 7), 11<<20)}, DelSteps: []Series{series(ms(24, 25, 40), 11<<20)}},
			{ID: "d", Label: "(d) chain", Plugins: []string{"bridge", "napitap"},
				Add: series(ms(25, 26, 30), 12<<20), Del: series(ms(50, 51, 60), 12<<20),
				AddSteps: []Series{series(ms(18, 19, 20), 12<<20), series(ms(7, 7, 10), 13<<20)},
				DelSteps: []Series{series(ms(30, 31, 35), 12<<20), series(ms(20, 20, 25), 10<<20)}},
		},
		Bursts: []BurstResult{
			{Kind: "napitap", Label: "napitap <noqueue>", Pods: 200, AddWall: time.Second, DelWall: 3 * time.Second,
				Add: Series{Wall: ms(100, 200), CPU: ms(100, 200), MaxRSS: 14 << 20, SysTotal: 150 * time.Millisecond}, Del: series(ms(300), 10<<20),
				Handoff: true, Holding: DaemonStats{VmRSS: 20 << 20, VmHWM: 21 << 20, FDs: 810}, HeldAttachments: 200, HeldQueues: 800,
				SlabBefore: Slab{1 << 30, 1 << 29}, SlabHolding: Slab{1<<30 + 200*(3<<18), 1<<29 + 200*(1<<18)}, SlabAfter: Slab{1<<30 + 200*(1<<10), 1 << 29}},
			{Kind: "tap", Label: "tap plugin", Pods: 200, AddWall: time.Second, DelWall: time.Second,
				Add: series(ms(100), 9<<20), Del: series(ms(100), 9<<20),
				SlabBefore: Slab{1 << 30, 1 << 29}, SlabHolding: Slab{1<<30 + 200*(6<<20), 1<<29 + 200*(6<<20)}, SlabAfter: Slab{1 << 30, 1 << 29}},
		},
	}
}

func TestGoals(t *testing.T) {
	goals := fakeReport().Goals()
	if len(goals) != 6 {
		t.Fatalf("%d goals: %+v", len(goals), goals)
	}
	want := []struct {
		met      bool
		measured string
	}{
		{true, "0.50x (6.0 ms vs 12.0 ms)"},
		{false, "1.14x (25.0 ms vs 22.0 ms)"},
		{true, "14.0 MiB"}, // the burst's exec, above every other
		{true, "21.0 MiB (VmRSS 20.0 MiB, 810 fds)"},
		{false, "0.75 MiB"}, // 3/4 MiB per pod: above 0.5
		{true, "0"},
	}
	for i, w := range want {
		g := goals[i]
		if !g.Known || g.Met != w.met || g.Measured != w.measured {
			t.Errorf("goal %q: known=%v met=%v measured %q, want met=%v %q", g.Name, g.Known, g.Met, g.Measured, w.met, w.measured)
		}
	}
	empty := (&Report{}).Goals()
	for _, g := range empty {
		if g.Known {
			t.Errorf("goal %q known without data", g.Name)
		}
	}
}

func TestMarkdown(t *testing.T) {
	r := fakeReport()
	md := r.Markdown()
	for _, want := range []string{
		"napitap-bench cni --iterations 3",
		"| nproc | 2 |", "Test CPU", "6.18.0",
		"| (a) tap <ref> | 12.0 ms | 20.0 ms | 22.0 ms | 30.0 ms |",
		"| (b4) napitap | 6.0 ms | 7.0 ms | 25.0 ms | 40.0 ms |",
		"0.50x", "1.14x", // ratios against the reference
		"| (d) chain | 26.0 ms | 30.0 ms | 7.0 ms | 10.0 ms | 19.0 ms |", // napitap's share, bridge's
		"| 200 | napitap | 1000 ms | 100 ms | 200 ms | 300 ms (15%), sys 50% |", "| 200 / 800 |",
		"| napitap <noqueue> | 0.75 MiB (0.25 MiB) | 0.12x |", "| tap plugin | 6.00 MiB (6.00 MiB) | 1.00x |", // slab per pod and ratio
		"| 0.75 MiB | 0.25 MiB | 0.00 MiB |", "| - | - | - | - | - | 6.00 MiB |", // the reference has no napitapd
		"**missed**", "| met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	r.RSSFloor = 10 << 20
	if md := r.Markdown(); !strings.Contains(md, "<= 10.0 MiB") || !strings.Contains(md, "| 12.0 MiB |") || !strings.Contains(md, "| 14.0 MiB |") {
		t.Errorf("RSS under the launcher's floor is not shown as a bound:\n%s", md)
	}
	if strings.Contains(md, "FAILED") {
		t.Error("a run without failures is marked FAILED")
	}
	r.FailureCount, r.Failures = 2, []string{"(b4) ADD x: boom"}
	md = r.Markdown()
	for _, want := range []string{"**FAILED: 2 ADD/DEL failures", "## Failures (2)", "boom", "1 more"} {
		if !strings.Contains(md, want) {
			t.Errorf("failed run's markdown lacks %q", want)
		}
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	for _, r := range []*Report{fakeReport(), {}} {
		svg := r.SVG()
		d := xml.NewDecoder(strings.NewReader(svg))
		for {
			_, err := d.Token()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("SVG does not parse: %v\n%s", err, svg)
			}
		}
		if strings.Contains(svg, "NaN") || strings.Contains(svg, "Inf") {
			t.Errorf("SVG has NaN/Inf:\n%s", svg)
		}
	}
	svg := fakeReport().SVG()
	for _, want := range []string{"(a) tap &lt;ref&gt;", "(d) chain: napitap exec", "(d) chain: whole chain", ">ADD<", ">DEL<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
}

func TestNiceTicks(t *testing.T) {
	for _, c := range []struct {
		hi    time.Duration
		step  time.Duration
		ticks int
	}{
		{23 * time.Millisecond, 5 * time.Millisecond, 5},
		{10 * time.Millisecond, 2 * time.Millisecond, 5},
		{0, time.Millisecond, 1},
		{1300 * time.Millisecond, 500 * time.Millisecond, 3},
	} {
		step, ticks := niceTicks(c.hi)
		if step != c.step || ticks != c.ticks {
			t.Errorf("niceTicks(%v) = %v x %d, want %v x %d", c.hi, step, ticks, c.step, c.ticks)
		}
	}
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"--iterations", "50", "--bursts", "1, 50,200", "--out", "/tmp/x"})
	if err != nil {
		t.Fatal(err)
	}
	if o.iterations != 50 || len(o.bursts) != 3 || o.bursts[1] != 50 || o.out != "/tmp/x" || o.warmup != 3 {
		t.Errorf("%+v", o)
	}
	if o, err := parseFlags([]string{"--bursts", ""}); err != nil || len(o.bursts) != 0 {
		t.Errorf("empty --bursts: %v %v", o, err)
	}
	for _, bad := range [][]string{{"--bursts", "0"}, {"--bursts", "x"}, {"--iterations", "0"}, {"extra"}} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestProcStatsReadsTheMemoryInBytesAndCountsTheFdsOfAProcess(t *testing.T) {
	st, err := procStats(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	// ReadDir's own fd is open while it reads, not after.
	if st.VmRSS < 1<<20 || st.VmHWM < st.VmRSS || st.FDs < 3 || st.FDs > len(fds) {
		t.Errorf("procStats = %+v; want VmRSS of at least 1 MiB, VmHWM >= VmRSS, 3 to %d fds", st, len(fds))
	}
	if s := readSlab(); s.Total <= 0 || s.Unreclaimable <= 0 || s.Unreclaimable > s.Total {
		t.Errorf("readSlab = %+v", s)
	}
}

func TestPrebuiltBinariesThatNeedTheDynamicLoaderAreNamed(t *testing.T) {
	dir := t.TempDir()
	sh, err := os.ReadFile("/bin/sh") // dynamically linked on Debian
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"dynamic": sh, "script": []byte("#!/bin/sh\n")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got := dynamicallyLinked(dir, []string{"dynamic", "script", "missing"})
	if !slices.Equal(got, []string{"dynamic"}) {
		t.Errorf("dynamicallyLinked = %q, want only the dynamic one", got)
	}
}
