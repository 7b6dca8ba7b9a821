package cnibench

import (
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// BurstCPU is the CPU every process spent while N pods started at once,
// from the first ADD's start to the last VM holding its queues: the
// plugins' (their children included), the VMs' (the openers, under
// napitapctl), the daemons' (napitapd and napitap-fdstore), the bench's own
// and perf's, and the rest of the machine's busy time (kernel threads,
// softirqs, anything else that ran). Machine is all CPUs' busy time in
// /proc/stat, so the burst cannot end sooner than Machine / CPUs.
type BurstCPU struct {
	Window                       time.Duration
	Machine                      time.Duration
	Plugins, VMs, Daemons, Bench time.Duration
	Perf                         time.Duration // perf sched record, with --split
	// KernelThreads is what of the rest the kernel's threads spent on a
	// CPU, by kind (kernelThreads), from perf's events: with --split only.
	KernelThreads map[string]time.Duration
}

// Rest is the machine's busy time that no process above accounts for.
func (c BurstCPU) Rest() time.Duration {
	return max(c.Machine-c.Plugins-c.VMs-c.Daemons-c.Bench-c.Perf, 0)
}

// Floor is how long the machine's cpus needed at the least for the burst.
func (c BurstCPU) Floor(cpus int) time.Duration {
	if cpus == 0 {
		return 0
	}
	return c.Machine / time.Duration(cpus)
}

// cpuMark is a reading of the machine's, the daemons' and the bench's CPU.
type cpuMark struct {
	at               time.Time
	machine, daemons time.Duration
	self             time.Duration
}

// markCPU reads them: /proc/stat and /proc/PID/stat count in clock ticks
// (10 ms), summed over the CPUs and over each daemon's threads, dead ones
// included; the bench's own from getrusage.
func markCPU(daemons ...int) cpuMark {
	m := cpuMark{at: time.Now()}
	if st, err := procfs.NewDefaultFS(); err == nil {
		if s, err := st.Stat(); err == nil {
			t := s.CPUTotal
			m.machine = seconds(t.User + t.Nice + t.System + t.IRQ + t.SoftIRQ)
		}
	}
	for _, pid := range daemons {
		if p, err := procfs.NewProc(pid); err == nil {
			if s, err := p.Stat(); err == nil {
				m.daemons += seconds(s.CPUTime())
			}
		}
	}
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) == nil {
		m.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return m
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// since fills in what the machine, the daemons and the bench spent from
// start to m.
func (c *BurstCPU) since(start, m cpuMark) {
	c.Window = m.at.Sub(start.at)
	c.Machine = m.machine - start.machine
	c.Daemons = m.daemons - start.daemons
	c.Bench = m.self - start.self
}
