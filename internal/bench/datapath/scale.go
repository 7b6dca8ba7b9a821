package datapath

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/procfs"

	"github.com/napitap/napitap/internal/nstest"
)

// Threaded NAPI at scale: a node with 110 VM pods of 4 queues has 440 NAPI
// kernel threads. scale makes that many idle taps at once, with NAPI and
// with threaded NAPI in turn, and measures what they hold (/proc/meminfo)
// and how often their kernel threads run while nothing flows. Threaded is
// switched on while every queue is attached and never off: the taps are
// deleted (DESIGN.md fact 9). Their root qdisc is noqueue, so that the
// memory is the taps' and their threads', not 256 pfifo_fast rings
// (DESIGN.md fact 15).

// ScaleResults are the rounds of one scale measurement.
type ScaleResults struct {
	Taps        int           `json:"taps"`
	Queues      int           `json:"queues"`
	IdleSeconds float64       `json:"idle_seconds"`
	Samples     []ScaleSample `json:"samples"`
}

// ScaleSample is one round of one mode.
type ScaleSample struct {
	Round   int    `json:"round"`
	Mode    string `json:"mode"`
	Threads int    `json:"napi_threads"`
	// What /proc/meminfo gained once the taps were made, in KiB.
	SlabKiB        int64 `json:"slab_kib"`
	SUnreclaimKiB  int64 `json:"sunreclaim_kib"`
	KernelStackKiB int64 `json:"kernel_stack_kib"`
	// Over the idle window: how often per second the taps' napi/ threads
	// were put on a CPU (schedstat's third field), and their CPU time.
	ThreadRunsPerSec float64 `json:"thread_runs_per_sec"`
	ThreadCPUms      float64 `json:"thread_cpu_ms"`
	CreateSeconds    float64 `json:"create_seconds"`
}

func (b *bench) scale(ctx context.Context) (*ScaleResults, error) {
	o := b.opts
	res := &ScaleResults{Taps: o.ScaleTaps, Queues: o.ScaleQueues, IdleSeconds: o.ScaleIdle.Seconds()}
	modes := []Mode{{Name: "napi", NAPI: true, Qdisc: "noqueue"}, {Name: "threaded", NAPI: true, Threaded: true, Qdisc: "noqueue"}}
	fmt.Fprintf(b.log, "scale: %d taps x %d queues, %d rounds, %s idle\n", o.ScaleTaps, o.ScaleQueues, o.Runs, o.ScaleIdle)
	for r := 1; r <= o.Runs; r++ {
		for i := range modes {
			m := modes[(i+r-1)%len(modes)]
			s, err := b.scaleRound(ctx, r, m)
			if err != nil {
				return res, fmt.Errorf("round %d, %s: %w", r, m.Name, err)
			}
			res.Samples = append(res.Samples, s)
			fmt.Fprintf(b.log, "  round %d %-8s %3d threads  slab %+7d KiB  kernel stack %+6d KiB  thread runs %.1f/s\n",
				r, m.Name, s.Threads, s.SlabKiB, s.KernelStackKiB, s.ThreadRunsPerSec)
		}
	}
	return res, nil
}

func (b *bench) scaleRound(ctx context.Context, round int, mode Mode) (s ScaleSample, err error) {
	s = ScaleSample{Round: round, Mode: mode.Name}
	prefix := "nsc" + nstest.RandomSuffix()
	sleep := func(d time.Duration) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
			return nil
		}
	}
	if err := sleep(time.Second); err != nil { // let the last round's frees settle
		return s, err
	}
	slab0, sunr0, kstack0, err := meminfo()
	if err != nil {
		return s, err
	}
	var taps []*podTap
	defer func() {
		for _, t := range taps {
			if derr := t.destroy(); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()
	start := time.Now()
	for i := range b.opts.ScaleTaps {
		t, err := b.ns.createTap(fmt.Sprintf("%s%03d", prefix, i), mode, b.opts.ScaleQueues, false)
		if err != nil {
			return s, err
		}
		taps = append(taps, t)
		if ctx.Err() != nil {
			return s, ctx.Err()
		}
	}
	s.CreateSeconds = time.Since(start).Seconds()
	if err := sleep(time.Second); err != nil {
		return s, err
	}
	slab1, sunr1, kstack1, err := meminfo()
	if err != nil {
		return s, err
	}
	s.SlabKiB, s.SUnreclaimKiB, s.KernelStackKiB = slab1-slab0, sunr1-sunr0, kstack1-kstack0

	threads := napiThreads(prefix)
	s.Threads = len(threads)
	runs0, cpu0 := schedstats(threads)
	t0 := time.Now()
	if err := sleep(b.opts.ScaleIdle); err != nil {
		return s, err
	}
	runs1, cpu1 := schedstats(threads)
	s.ThreadRunsPerSec = float64(runs1-runs0) / time.Since(t0).Seconds()
	s.ThreadCPUms = float64(cpu1-cpu0) / 1e6
	return s, nil
}

// meminfo reads Slab, SUnreclaim and KernelStack from /proc/meminfo, in
// KiB.
func meminfo() (slab, sunreclaim, kstack int64, err error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0, 0, 0, err
	}
	m, err := fs.Meminfo()
	kib := func(v *uint64) int64 {
		if v == nil {
			return 0
		}
		return int64(*v)
	}
	return kib(m.Slab), kib(m.SUnreclaim), kib(m.KernelStack), err
}

// schedstats sums, over the given threads, how often each was put on a
// CPU and its run time in ns (/proc/<pid>/schedstat). Threads gone
// meanwhile count nothing.
func schedstats(pids []int) (runs, cpuNs uint64) {
	for _, pid := range pids {
		if p, err := procfs.NewProc(pid); err == nil {
			if st, err := p.Schedstat(); err == nil {
				runs += st.RunTimeslices
				cpuNs += st.RunningNanoseconds
			}
		}
	}
	return runs, cpuNs
}
