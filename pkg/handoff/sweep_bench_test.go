package handoff_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// sweepLoad is a node's worth of VM pods (the kubelet's max-pods, 110),
// each an intercepted 4-queue tap: what a sweep checks one by one.
const sweepLoad = 110

// BenchmarkLookupDuringSweep: while napitapd sweeps a node's worth of
// attachments, the seccomp agent looks up the tap of a TUNSETIFF, as it
// does for every intercepted one. A round is one sweep; what is reported
// is how long it took and the longest lookup during it, which waits for
// the sweep as long as the sweep holds the server's lock.
//
//	sudo go test -run '^$' -bench LookupDuringSweep -benchtime 20x ./pkg/handoff/
func BenchmarkLookupDuringSweep(b *testing.B) {
	pod, d, c := newPodAndDaemon(b)
	var id uint64
	for i := range sweepLoad {
		key := handoff.Key{ContainerID: fmt.Sprintf("sweep-%03d", i), IfName: "net1"}
		tap := fmt.Sprintf("napisw%03d", i)
		queues := newTap(b, pod, tap, 4, nil, nil)
		att := attachmentFor(pod, key, "net-a", tap, 4)
		att.Intercept = true
		register(b, c, att, nil)
		tapsetup.CloseQueues(queues)
	}
	var err error
	if id, err = tapsetup.NetnsID(pod.Path()); err != nil {
		b.Fatal(err)
	}
	var sweeps, longest []time.Duration
	for b.Loop() {
		done := make(chan time.Duration)
		go func() {
			start := time.Now()
			if n := d.srv.Sweep(); n != 0 {
				b.Errorf("the sweep released %d attachments, all of whose taps are there", n)
			}
			done <- time.Since(start)
		}()
		var worst time.Duration
		for {
			start := time.Now()
			if _, ok := d.srv.Intercepted(id, "napisw000"); !ok {
				b.Fatal("napisw000 is not found")
			}
			worst = max(worst, time.Since(start))
			select {
			case took := <-done:
				sweeps, longest = append(sweeps, took), append(longest, worst)
			default:
				time.Sleep(100 * time.Microsecond)
				continue
			}
			break
		}
	}
	slices.Sort(sweeps)
	slices.Sort(longest)
	b.ReportMetric(float64(sweeps[len(sweeps)/2])/1e6, "sweep-p50-ms")
	b.ReportMetric(float64(longest[len(longest)/2])/1e6, "lookup-max-p50-ms")
	b.ReportMetric(float64(longest[len(longest)-1])/1e6, "lookup-max-worst-ms")
	b.ReportMetric(0, "ns/op")
}
