package datapath

import (
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/procfs"
)

// userHZ is the unit of /proc/<pid>/stat times (USER_HZ, 100 on every
// Linux architecture napitap runs on).
const userHZ = 100

// readProcStat returns the machine's "cpu" line of /proc/stat and the
// per-CPU lines, in seconds.
func readProcStat() (all procfs.CPUStat, per []procfs.CPUStat, err error) {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return all, nil, err
	}
	st, err := fs.Stat()
	if err != nil {
		return all, nil, err
	}
	for _, cpu := range slices.Sorted(maps.Keys(st.CPU)) {
		per = append(per, st.CPU[cpu])
	}
	return st.CPUTotal, per, nil
}

// CPUSplit is CPU time over a window, in cores (1.0 = one CPU busy for the
// whole window): the machine's or one CPU's /proc/stat columns.
type CPUSplit struct {
	User    float64 `json:"user"` // user + nice
	Sys     float64 `json:"sys"`
	SoftIRQ float64 `json:"softirq"`
	IRQ     float64 `json:"irq"`
	Idle    float64 `json:"idle"` // idle + iowait
	Steal   float64 `json:"steal"`
}

func (s CPUSplit) busy() float64 { return s.User + s.Sys + s.SoftIRQ + s.IRQ }

// split turns a /proc/stat delta over cpus CPUs into cores.
func split(a, b procfs.CPUStat, cpus int) CPUSplit {
	total := func(t procfs.CPUStat) float64 {
		return t.User + t.Nice + t.System + t.Idle + t.Iowait + t.IRQ + t.SoftIRQ + t.Steal
	}
	tot := total(b) - total(a)
	if tot <= 0 {
		return CPUSplit{}
	}
	k := float64(cpus) / tot
	return CPUSplit{
		User:    (b.User + b.Nice - a.User - a.Nice) * k,
		Sys:     (b.System - a.System) * k,
		SoftIRQ: (b.SoftIRQ - a.SoftIRQ) * k,
		IRQ:     (b.IRQ - a.IRQ) * k,
		Idle:    (b.Idle + b.Iowait - a.Idle - a.Iowait) * k,
		Steal:   (b.Steal - a.Steal) * k,
	}
}

// ThreadCPU is the user and system time of some threads over a window, in
// cores. Softirq work a thread triggers is in the machine's softirq column
// when the kernel accounts IRQ time separately, not here.
type ThreadCPU struct {
	User float64 `json:"user"`
	Sys  float64 `json:"sys"`
}

// threadTicks sums utime and stime (ticks) of the given threads of this
// process.
func threadTicks(tids []int) (u, s uint64) {
	self, err := procfs.Self()
	if err != nil {
		return 0, 0
	}
	return ticks(tids, self.Thread)
}

// pidTicks sums utime and stime of the given processes (kernel threads).
func pidTicks(pids []int) (u, s uint64) { return ticks(pids, procfs.NewProc) }

func ticks(ids []int, proc func(int) (procfs.Proc, error)) (u, s uint64) {
	for _, id := range ids {
		if id <= 0 {
			continue
		}
		if p, err := proc(id); err == nil {
			if st, err := p.Stat(); err == nil {
				u += uint64(st.UTime)
				s += uint64(st.STime)
			}
		}
	}
	return u, s
}

// napiThreads finds the threaded-NAPI kernel threads of tap: their command
// is "napi/<dev>-<napi id>", cut to 15 characters.
func napiThreads(tap string) []int {
	prefix := "napi/" + tap
	if len(prefix) > 15 {
		prefix = prefix[:15]
	}
	procs, _ := procfs.AllProcs()
	var pids []int
	for _, p := range procs {
		if comm, err := p.Comm(); err == nil && strings.HasPrefix(comm, prefix) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// Spread is the median and range of one metric over runs.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	s := slices.Clone(v)
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Spread{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}
