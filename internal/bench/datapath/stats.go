package datapath

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// userHZ is the unit of /proc/stat and /proc/<pid>/stat times (USER_HZ,
// 100 on every Linux architecture napitap runs on).
const userHZ = 100

// cpuTimes is one line of /proc/stat, in USER_HZ ticks.
type cpuTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal uint64
}

func (t cpuTimes) total() uint64 {
	return t.User + t.Nice + t.System + t.Idle + t.IOWait + t.IRQ + t.SoftIRQ + t.Steal
}

// readProcStat returns the machine's "cpu" line and the per-CPU lines.
func readProcStat() (all cpuTimes, per []cpuTimes, err error) {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return all, nil, err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") {
			continue
		}
		var v [8]uint64
		for i := range v {
			v[i], _ = strconv.ParseUint(f[i+1], 10, 64)
		}
		t := cpuTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}
		if f[0] == "cpu" {
			all = t
		} else {
			per = append(per, t)
		}
	}
	return all, per, nil
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
func split(a, b cpuTimes, cpus int) CPUSplit {
	tot := float64(b.total() - a.total())
	if tot <= 0 {
		return CPUSplit{}
	}
	k := float64(cpus) / tot
	return CPUSplit{
		User:    float64(b.User+b.Nice-a.User-a.Nice) * k,
		Sys:     float64(b.System-a.System) * k,
		SoftIRQ: float64(b.SoftIRQ-a.SoftIRQ) * k,
		IRQ:     float64(b.IRQ-a.IRQ) * k,
		Idle:    float64(b.Idle+b.IOWait-a.Idle-a.IOWait) * k,
		Steal:   float64(b.Steal-a.Steal) * k,
	}
}

// ThreadCPU is the user and system time of some threads over a window, in
// cores. Softirq work a thread triggers is in the machine's softirq column
// when the kernel accounts IRQ time separately, not here.
type ThreadCPU struct {
	User float64 `json:"user"`
	Sys  float64 `json:"sys"`
}

// taskTimes reads utime and stime (ticks) of /proc/<pid>/task/<tid>/stat or
// /proc/<pid>/stat.
func taskTimes(path string) (utime, stime uint64, err error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, err
	}
	// The command name may hold spaces and parentheses: fields count from
	// the last ')'. After it: state is field 3, utime 14, stime 15.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("%s: unexpected format", path)
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("%s: unexpected format", path)
	}
	utime, _ = strconv.ParseUint(f[11], 10, 64)
	stime, _ = strconv.ParseUint(f[12], 10, 64)
	return utime, stime, nil
}

// threadTicks sums utime and stime of the given threads of this process.
func threadTicks(tids []int) (u, s uint64) {
	return ticks(fmt.Sprintf("/proc/%d/task/%%d/stat", os.Getpid()), tids)
}

// pidTicks sums utime and stime of the given processes (kernel threads).
func pidTicks(pids []int) (u, s uint64) { return ticks("/proc/%d/stat", pids) }

func ticks(pathFormat string, ids []int) (u, s uint64) {
	for _, id := range ids {
		if id <= 0 {
			continue
		}
		if ut, st, err := taskTimes(fmt.Sprintf(pathFormat, id)); err == nil {
			u += ut
			s += st
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
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), prefix) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
			pids = append(pids, pid)
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
