package reliability

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

// churnConfigs mix the queue counts, wirings, hand-off modes, kataDan
// (which needs the hand-off off) and spec versions a node sees.
var churnConfigs = []struct {
	name   string
	ifName string
	conf   tapConf
}{
	{"standalone, 1 queue, hand-off", "net1", tapConf{Queues: 1, Handoff: "optional"}},
	{"standalone, 2 queues, no hand-off", "net1", tapConf{Queues: 2, Handoff: "off"}},
	{"standalone, 4 queues, required hand-off", "net2", tapConf{Queues: 4, Handoff: "required"}},
	{"Kata DAN tap in the node netns after bridge, 1 queue, no hand-off", "net1", tapConf{Queues: 1, Handoff: "off", Chained: true, KataDan: true}},
	{"standalone, 2 queues, host-local, required hand-off, spec 1.0.0", "net1", tapConf{Queues: 2, Handoff: "required", IPAM: true, CNIVer: "1.0.0"}},
	{"standalone, 4 queues, no hand-off", "net3", tapConf{Queues: 4, Handoff: "off"}},
	{"tc-redirect after bridge, 1 queue, hand-off", "eth0", tapConf{Queues: 1, Handoff: "optional", Chained: true}},
	{"tc-redirect after bridge, 2 queues, required hand-off", "eth0", tapConf{Queues: 2, Handoff: "required", Chained: true}},
	{"Kata DAN tap in the node netns after bridge, 2 queues, no hand-off", "eth0", tapConf{Queues: 2, Handoff: "off", Chained: true, KataDan: true}},
	{"tc-redirect after bridge, 4 queues, no hand-off, spec 1.0.0", "net1", tapConf{Queues: 4, Handoff: "off", Chained: true, CNIVer: "1.0.0"}},
	{"bridge wiring after bridge, 1 queue, hand-off", "net1", tapConf{Queues: 1, Handoff: "optional", Chained: true, Wiring: "bridge"}},
	{"Kata DAN tap in the node netns after bridge, 4 queues, no hand-off, spec 1.0.0", "net1", tapConf{Queues: 4, Handoff: "off", Chained: true, KataDan: true, CNIVer: "1.0.0"}},
	{"bridge wiring after bridge, 2 queues, no hand-off", "eth0", tapConf{Queues: 2, Handoff: "off", Chained: true, Wiring: "bridge"}},
	{"bridge wiring after bridge, 4 queues, required hand-off", "net2", tapConf{Queues: 4, Handoff: "required", Chained: true, Wiring: "bridge"}},
}

// TestChurn runs ADD/CHECK/DEL cycles of mixed configs through libcni on 8
// workers, each with a pod netns of its own that it reuses, a new
// container ID every cycle. No cycle may fail, each must leave its pod
// netns exactly as it was, and at the end nothing may be left: taps, tc
// filters, bridges, addresses, host-local reservations, napitapd state,
// DAN files, napitapd fds. napitapd's RSS may grow by less than 5 MiB from
// after the warm-up to the end. NAPITAP_CHURN_CYCLES sets the cycle count
// (default 1000).
func TestChurn(t *testing.T) {
	cycles := 1000
	if v := os.Getenv("NAPITAP_CHURN_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("NAPITAP_CHURN_CYCLES=%q", v)
		}
		cycles = n
	}
	const (
		workers    = 8
		warmup     = 50
		checkEvery = 5 // CHECK on every 5th cycle (3 more execs for a chain)
		maxGrowth  = 5 << 10
	)
	f := newFixture(t)
	f.primeHost(tapConf{Queues: 1, Handoff: "off"})
	lists := make([]*libcni.NetworkConfigList, len(churnConfigs))
	for i, cc := range churnConfigs {
		name := "churn"
		if cc.conf.IPAM {
			name = "churn-ipam"
		}
		lists[i] = f.list(name, cc.conf)
	}
	pods := make([]*podNS, workers)
	podBase := make([][]string, workers)
	for w := range pods {
		pods[w] = newPodNS(t, fmt.Sprintf("churn%d", w))
		podBase[w] = podObjects(t, pods[w])
	}
	base := f.snapshot(pods...)
	suffix := nstest.RandomSuffix()

	var failures atomic.Int64
	var logged atomic.Int64
	fail := func(format string, args ...any) {
		failures.Add(1)
		if logged.Add(1) <= 20 {
			t.Errorf(format, args...)
		}
	}
	// run does n cycles on the workers; cycle numbers start at first.
	run := func(first, n int) {
		var next atomic.Int64
		next.Store(int64(first))
		last := int64(first + n)
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := pods[w]
				for {
					i := next.Add(1) - 1
					if i >= last {
						return
					}
					k := int(i) % len(churnConfigs)
					cc, list := churnConfigs[k], lists[k]
					r := rt(fmt.Sprintf("churn-%s-%d", suffix, i), p, cc.ifName)
					want := f.expect(cc.conf, r.ContainerID, r.IfName)
					res, err := f.env.Add(list, r)
					if err != nil {
						fail("cycle %d (%s), worker %d: ADD: %v", i, cc.name, w, err)
						_ = f.env.Del(list, r)
						continue
					}
					if err := nodecheck.Present(p.Path, want); err != nil {
						fail("cycle %d (%s): after ADD: %v", i, cc.name, err)
					}
					if i%checkEvery == 0 {
						if err := f.check(list, cc.conf, r, res); err != nil {
							fail("cycle %d (%s): CHECK: %v", i, cc.name, err)
						}
					}
					if err := f.env.Del(list, r); err != nil {
						fail("cycle %d (%s): DEL: %v", i, cc.name, err)
						continue
					}
					if err := nodecheck.Gone(p.Path, want); err != nil {
						fail("cycle %d (%s): after DEL: %v", i, cc.name, err)
					}
					objs, err := netnsObjects(p.Path, true)
					if err != nil {
						fail("cycle %d: %v", i, err)
					} else if !slices.Equal(objs, podBase[w]) {
						fail("cycle %d (%s): pod netns after DEL has %q, want %q", i, cc.name, minus(objs, podBase[w]), minus(podBase[w], objs))
					}
				}
			}()
		}
		wg.Wait()
	}

	start := time.Now()
	run(0, warmup)
	warm := time.Since(start)
	pid := f.d.PID()
	rssStart := procRSS(pid)
	_, fdsStart := settledFDs(pid)

	start = time.Now()
	run(warmup, cycles)
	elapsed := time.Since(start)
	rssEnd := procRSS(pid)
	_, fdsEnd := settledFDs(pid)

	t.Logf("%d warm-up cycles in %v; %d cycles on %d workers in %v (%.1f cycles/s, %v per cycle per worker)",
		warmup, warm.Round(time.Millisecond), cycles, workers, elapsed.Round(time.Millisecond),
		float64(cycles)/elapsed.Seconds(), (elapsed * workers / time.Duration(cycles)).Round(time.Millisecond))
	t.Logf("napitapd (pid %d): VmRSS %d KiB after warm-up, %d KiB at the end (%+d KiB); %d fds, then %d",
		pid, rssStart, rssEnd, rssEnd-rssStart, fdsStart, fdsEnd)
	if n := failures.Load(); n > 0 {
		t.Errorf("%d failures in %d cycles", n, cycles+warmup)
	}
	if growth := rssEnd - rssStart; growth >= maxGrowth {
		t.Errorf("napitapd's VmRSS grew by %d KiB over %d cycles, want < %d KiB", growth, cycles, maxGrowth)
	}
	end := f.requireSame(base, "after churn", pods...)
	if !strings.Contains(strings.Join(end.FDs, ","), "listening") {
		t.Errorf("napitapd fds at the end: %q", end.FDs)
	}
}
