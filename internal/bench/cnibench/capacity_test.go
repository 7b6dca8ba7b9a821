package cnibench

import (
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
)

// capacityRow is a row whose every latency series is the samples given.
func capacityRow(pods int, add, toNAPI []time.Duration, rss int64, fds int) CapacityRow {
	return CapacityRow{
		Pods: pods, Add: series(add, 0), Del: series(add, 0), RefAdd: series(add, 0), RefDel: series(add, 0),
		ToNAPI: toNAPI, TUNSETIFF: []time.Duration{100 * time.Microsecond, 300 * time.Microsecond},
		RefToQueues: toNAPI, RefTUNSETIFF: []time.Duration{8 * time.Microsecond, 20 * time.Microsecond},
		Holding: DaemonStats{VmRSS: rss, FDs: fds}, Running: pods,
		Takeover: 10 * time.Millisecond, TakeoverWall: 40 * time.Millisecond, KillToServing: 30 * time.Millisecond,
	}
}

func TestTheGrowthFromTheFirstNToTheLastIsJudgedAgainstTheIssuesGoals(t *testing.T) {
	cases := []struct {
		name                    string
		first, last             CapacityRow
		rssMet, fdsMet, addMet  bool
		addMeasured, rssMeasure string
	}{
		{
			"memory and fds growing slower than the pods, p99 ADD at 3x, meet every goal",
			capacityRow(1, ms(10), ms(20), 10*mib, 20), capacityRow(110, ms(5, 30), ms(60), 17*mib, 350),
			true, true, true, "3.00x (10.0 ms to 30.0 ms)", "1.70x (10.0 MiB to 17.0 MiB)",
		},
		{
			"p99 ADD past 3x misses its goal",
			capacityRow(1, ms(10), ms(20), 10*mib, 20), capacityRow(110, ms(100, 735), ms(800), 17*mib, 350),
			true, true, false, "73.50x (10.0 ms to 735 ms)", "1.70x (10.0 MiB to 17.0 MiB)",
		},
		{
			"fds growing faster than the pods miss linear",
			capacityRow(10, ms(10), ms(20), 10*mib, 20), capacityRow(20, ms(10), ms(20), 30*mib, 41),
			false, false, true, "1.00x (10.0 ms to 10.0 ms)", "3.00x (10.0 MiB to 30.0 MiB)",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &CapacityReport{Machine: Machine{CPUs: 2}, Rows: []CapacityRow{c.first, c.last}}
			goals := r.Growth()
			byName := map[string]Goal{}
			for _, g := range goals {
				byName[strings.Split(g.Name, ",")[0]] = g
			}
			for name, want := range map[string]bool{"napitapd VmRSS": c.rssMet, "napitapd open fds": c.fdsMet, "napitap ADD p99": c.addMet} {
				g, ok := byName[name]
				if !ok || !g.Known || g.Met != want {
					t.Errorf("%s: %+v, want known and met=%v", name, g, want)
				}
			}
			if g := byName["napitap ADD p99"]; g.Measured != c.addMeasured || g.Target != "<= 3x" {
				t.Errorf("ADD p99 measured %q target %q, want %q <= 3x", g.Measured, g.Target, c.addMeasured)
			}
			if g := byName["napitapd VmRSS"]; g.Measured != c.rssMeasure {
				t.Errorf("RSS measured %q, want %q", g.Measured, c.rssMeasure)
			}
			if g := byName["takeover (request to serving)"]; g.Known || g.Measured != "1.00x (10.0 ms to 10.0 ms)" {
				t.Errorf("a figure without a goal: %+v", g)
			}
		})
	}
	if g := (&CapacityReport{Rows: []CapacityRow{capacityRow(1, ms(10), ms(20), mib, 20)}}).Growth(); g != nil {
		t.Errorf("one N has no growth, got %+v", g)
	}
}

func TestTheCPUFloorIsTheBurstsBusyTimeSharedByTheCPUs(t *testing.T) {
	r := &CapacityReport{Machine: Machine{CPUs: 2}}
	row := CapacityRow{Pods: 110, Burst: BurstCPU{Machine: 3 * time.Second, Plugins: time.Second, VMs: 500 * time.Millisecond}}
	if got, want := r.CPUFloor(&row), 1500*time.Millisecond; got != want {
		t.Errorf("CPUFloor = %v, want %v", got, want)
	}
	if got, want := row.Burst.Rest(), 1500*time.Millisecond; got != want {
		t.Errorf("Rest = %v, want %v", got, want)
	}
}

func TestTheIssuesGoalsAreJudgedAtTheLastN(t *testing.T) {
	cases := []struct {
		name                        string
		add, ref                    []time.Duration
		addCPU, refCPU              []time.Duration
		floorMet, versusMet, cpuMet bool
	}{
		{"a p99 at twice the floor and half the reference's, at 0.4x its CPU, meets all three", ms(100, 1000), ms(2000), ms(4), ms(10), true, true, true},
		{"a p99 past twice the floor misses that goal", ms(1001), ms(2002), ms(4), ms(10), false, true, true},
		{"a p99 past half the reference's misses that goal", ms(900), ms(1700), ms(4), ms(10), true, false, true},
		{"a mean CPU per ADD past 0.4x the reference's misses that goal", ms(900), ms(2000), ms(3, 6), ms(9, 11), true, true, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := &CapacityReport{Machine: Machine{CPUs: 2}, Rows: []CapacityRow{
				{Pods: 1}, {Pods: 110, Add: Series{Wall: c.add, CPU: c.addCPU}, RefAdd: Series{Wall: c.ref, CPU: c.refCPU}, Burst: BurstCPU{Machine: time.Second}},
			}}
			g := r.Goals()
			if len(g) != 3 || !g[0].Known || !g[1].Known || !g[2].Known {
				t.Fatalf("goals %+v, want three judged", g)
			}
			if g[0].Met != c.floorMet || g[1].Met != c.versusMet || g[2].Met != c.cpuMet {
				t.Errorf("met %v, %v and %v, want %v, %v and %v: %+v", g[0].Met, g[1].Met, g[2].Met, c.floorMet, c.versusMet, c.cpuMet, g)
			}
			if !strings.Contains(g[0].Name, "N=110") || strings.Contains(g[0].Name, "perf") {
				t.Errorf("goal %q does not name N=110, or names perf in a run without it", g[0].Name)
			}
		})
	}
}

func TestTheGoalsSayWhenTheLastNRanUnderPerf(t *testing.T) {
	r := &CapacityReport{Machine: Machine{CPUs: 2}, Rows: []CapacityRow{{Pods: 110, Split: &SplitSummary{}}}}
	for _, g := range r.Goals() {
		if !strings.Contains(g.Name, "under perf") {
			t.Errorf("goal %q does not say that perf recorded", g.Name)
		}
	}
}

func TestTheCapacityReportRendersItsTableAndAWellFormedPlot(t *testing.T) {
	r := &CapacityReport{CommandLine: "napitap-bench capacity --pods 1,110", Machine: Machine{CPUs: 2, Kernel: "6.18.0"}, Queues: 4,
		Rows: []CapacityRow{capacityRow(1, ms(10), ms(20), 10*mib, 20), capacityRow(110, ms(400, 735), ms(800), 17*mib, 347)}}
	split := SplitMean{ADDs: 110, Wall: ms(300)[0], Split: Split{Life: ms(290)[0], OnCPU: ms(10)[0], Runnable: ms(80)[0],
		Blocked: map[string]time.Duration{"rtnl lock": ms(200)[0]}}}
	r.Rows[1].Split = &SplitSummary{All: split, Slowest: split}
	md := r.Markdown()
	for _, want := range []string{
		"| 110 | napitap, all 110 | 300 ms | 290 ms | 10.0 ms (3%) | 80.0 ms (28%) | 200 ms (69%) |", "capacity-split.svg",
		"napitap-bench capacity --pods 1,110", "| 110 | 400 ms / 735 ms |", "| 100 µs / 300 µs | 8 µs / 20 µs |", "17.0 MiB, 347", "`vm plain tap0 4`",
		"## Growth from N=1 to N=110", "**missed**", "| met |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	for _, svg := range []string{r.SVG(), (&CapacityReport{}).SVG(), r.SplitSVG()} {
		d := xml.NewDecoder(strings.NewReader(svg))
		for {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("SVG does not parse: %v\n%s", err, svg)
			}
		}
		if strings.Contains(svg, "NaN") || strings.Contains(svg, "Inf") {
			t.Errorf("SVG has NaN/Inf:\n%s", svg)
		}
	}
	// The N axis ends at the first tick past 110 (50 apart), not at 1000.
	if svg := r.SVG(); !strings.Contains(svg, `fill="#555">150</text>`) || strings.Contains(svg, `fill="#555">1000</text>`) {
		t.Errorf("the N axis does not end at 150:\n%s", svg)
	}
}

func TestParseCapacityFlags(t *testing.T) {
	o, c, err := parseCapacityFlags([]string{"--pods", "1, 10,110", "--out", "/tmp/x"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.pods) != 3 || c.pods[2] != 110 || c.queues != 4 || o.out != "/tmp/x" || c.napitapConf != nil {
		t.Errorf("%+v %+v", o, c)
	}
	if _, c, err := parseCapacityFlags([]string{"--napitap-conf", `{"threadedNapi":false}`}); err != nil || c.napitapConf["threadedNapi"] != false {
		t.Errorf("--napitap-conf: %v, %v", c, err)
	}
	for _, bad := range [][]string{{"--pods", "0"}, {"--pods", ""}, {"--pods", "x"}, {"--queues", "0"}, {"--queues", "254"}, {"--napitapd-nice", "-21"}, {"--napitap-conf", "threadedNapi"}, {"extra"}} {
		if _, _, err := parseCapacityFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestTheCapacityBenchmarkRunsTwoVMPods runs the benchmark for real at
// N=2 (binaries built, netns, taps, napitapd and napitap-fdstore, a VM in
// each mode, a takeover and a SIGKILL) and checks that it wrote a report
// without failures: the run itself fails on any failed ADD, VM, takeover,
// recovery, DEL or leftover. No timing is asserted.
func TestTheCapacityBenchmarkRunsTwoVMPods(t *testing.T) {
	nstest.RequireRoot(t)
	out := t.TempDir()
	stdout := os.Stdout
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	os.Stdout = devnull // the report, which is read from the file
	err = CapacityMain([]string{"--pods", "2", "--split", "2", "--out", out})
	os.Stdout = stdout
	if err != nil {
		t.Fatalf("napitap-bench capacity --pods 2 --split 2: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(out, "capacity.md"))
	if err != nil {
		t.Fatal(err)
	}
	// --split: every ADD found in perf's events, each split.
	for _, want := range []string{"| 2 | ", "napitap-fdstore", "| 2 | napitap, all 2 |", "| 2 | tap plugin, all 2 |"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("capacity.md lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(string(md), "FAILED") || strings.Contains(string(md), "INCOMPLETE") {
		t.Errorf("capacity.md reports failures:\n%s", md)
	}
	for _, svg := range []string{"capacity.svg", "capacity-split.svg"} {
		if _, err := os.Stat(filepath.Join(out, svg)); err != nil {
			t.Error(err)
		}
	}
}
