package datapath

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MachineCosts told, on three instances of one machine type, how much
// threaded NAPI gains (docs/bench/README.md): each tap write is a system
// call, and threaded NAPI adds a wakeup, often on the other CPU. Measured
// as perf bench syscall basic and sched pipe do, to compare without perf.
type MachineCosts struct {
	SyscallUs     float64 `json:"syscall_us"`           // one getppid(2)
	WakeupRoundUs float64 `json:"wakeup_round_trip_us"` // pipe ping-pong between two CPUs
}

// costRounds short rounds, their median: one preempted round does not count.
const costRounds = 5

func (c *MachineCosts) String() string {
	return fmt.Sprintf("a system call %.2f µs, a cross-CPU wakeup round trip %.1f µs (pipe ping-pong; perf bench sched pipe's measure)",
		c.SyscallUs, c.WakeupRoundUs)
}

// measureCosts takes well under a second; a failure only costs the report
// its line, never the run.
func measureCosts(log io.Writer, when string) *MachineCosts {
	var sys []float64
	for range costRounds {
		const calls = 50000 // 5 ms at 0.1 µs a call, 50 ms at 1 µs
		t0 := time.Now()
		for range calls {
			unix.Getppid() // a raw syscall: no Go scheduler hooks around it, as perf's
		}
		sys = append(sys, float64(time.Since(t0).Nanoseconds())/calls/1e3)
	}
	rt, err := wakeupRoundTripUs()
	if err != nil {
		fmt.Fprintf(log, "datapath: machine costs at the %s: %v\n", when, err)
		return nil
	}
	c := &MachineCosts{SyscallUs: spreadOf(sys).Median, WakeupRoundUs: rt}
	fmt.Fprintf(log, "datapath: machine at the %s: %s\n", when, c)
	return c
}

// wakeupRoundTripUs ping-pongs one byte over two pipes between two threads
// pinned to two CPUs: each round trip is two wakeups of a thread asleep on
// the other CPU, what a writer pays to wake a threaded-NAPI kthread.
func wakeupRoundTripUs() (float64, error) {
	var there, back [2]int
	if err := unix.Pipe2(there[:], unix.O_CLOEXEC); err != nil {
		return 0, err
	}
	defer unix.Close(there[0])
	if err := unix.Pipe2(back[:], unix.O_CLOEXEC); err != nil {
		unix.Close(there[1])
		return 0, err
	}
	defer unix.Close(back[0])
	var set unix.CPUSet
	cpus := []int{-1, -1} // unpinned on one CPU
	if unix.SchedGetaffinity(0, &set) == nil && set.Count() >= 2 {
		cpus = cpus[:0]
		for c := 0; len(cpus) < 2; c++ {
			if set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
	}
	// A side asleep in read(2) keeps its P until sysmon takes it back:
	// one P for each side and one for the rest, or the other side waits.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.NumCPU(), 3)))
	const trips = 2000 // 40 ms a round at 20 µs a round trip
	var rounds []float64
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, fds := range [][2]int{{back[0], there[1]}, {there[0], back[1]}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Never unlocked: the pinned thread ends with the goroutine.
			runtime.LockOSThread()
			// Closing the write end on any way out ends the other side's
			// read(2) with EOF instead of leaving it asleep for ever.
			defer unix.Close(fds[1])
			if cpus[i] >= 0 {
				var one unix.CPUSet
				one.Set(cpus[i])
				errs[i] = unix.SchedSetaffinity(0, &one)
			}
			b := []byte{0}
			if i == 0 && errs[i] == nil { // the first ping; from then on each side echoes
				_, errs[i] = unix.Write(fds[1], b)
			}
			for r := 0; r < costRounds && errs[i] == nil; r++ {
				t0 := time.Now()
				for k := 0; k < trips && errs[i] == nil; k++ {
					var n int
					if n, errs[i] = unix.Read(fds[0], b); n == 1 {
						_, errs[i] = unix.Write(fds[1], b)
					} else if errs[i] == nil {
						errs[i] = fmt.Errorf("pipe ping-pong: %w", io.ErrUnexpectedEOF)
					}
				}
				if i == 0 {
					rounds = append(rounds, float64(time.Since(t0).Nanoseconds())/trips/1e3)
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return spreadOf(rounds).Median, nil
}
