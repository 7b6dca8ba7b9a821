package cnibench

// Where an ADD's wall time goes under a burst, from the scheduler's own
// events: `perf sched record -a -g` while the pods start, then `perf sched
// timehist --state`, which prints one line per switch-out of a thread:
// how long it waited before it ran (from its last switch-out), how much of
// that it was runnable (wakeup to switch-in), how long it ran, and the
// state and kernel stack it left the CPU in. A thread's time splits into
// on-CPU, waiting to run (woken or preempted, not yet on a CPU) and
// blocked, the blocking reason read off the stack it slept in.

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// schedRecord is a running `perf sched record`.
type schedRecord struct {
	cmd  *exec.Cmd
	path string
	log  strings.Builder
}

// startSchedRecord records every CPU's scheduler events, with kernel
// stacks, into path until stop. perf starts with its events off and turns
// them on when told through its control fifo, and says when it has: a
// burst's first ADD is then never missed.
func startSchedRecord(path string) (*schedRecord, error) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return nil, fmt.Errorf("--split needs perf (Debian: apt-get install linux-perf): %w", err)
	}
	ctl, ack := path+".ctl", path+".ack"
	for _, f := range []string{ctl, ack} {
		if err := unix.Mkfifo(f, 0o600); err != nil {
			return nil, fmt.Errorf("mkfifo %s: %w", f, err)
		}
	}
	r := &schedRecord{path: path}
	r.cmd = exec.Command(perf, "sched", "record", "-a", "-g", "-D", "-1", "--control", "fifo:"+ctl+","+ack, "-o", path)
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.log
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", r.cmd, err)
	}
	enabled := make(chan error, 1)
	go func() {
		c, err := os.OpenFile(ctl, os.O_WRONLY, 0)
		if err != nil {
			enabled <- err
			return
		}
		defer c.Close()
		a, err := os.Open(ack)
		if err != nil {
			enabled <- err
			return
		}
		defer a.Close()
		if _, err := c.WriteString("enable\n"); err != nil {
			enabled <- err
			return
		}
		line, err := bufio.NewReader(a).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != "ack" {
			err = fmt.Errorf("perf answered %q to enable", line)
		}
		enabled <- err
	}()
	select {
	case err = <-enabled:
	case <-time.After(10 * time.Second):
		err = errors.New("no answer in 10 s")
	}
	if err != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		return nil, fmt.Errorf("perf sched record: turning its events on: %v: %s", err, r.log.String())
	}
	return r, nil
}

// stop ends the recording (SIGINT, as ^C would) and returns perf's own CPU.
func (r *schedRecord) stop() (time.Duration, error) {
	_ = r.cmd.Process.Signal(os.Interrupt)
	err := r.cmd.Wait()
	var cpu time.Duration
	if ps := r.cmd.ProcessState; ps != nil {
		cpu = ps.UserTime() + ps.SystemTime()
	}
	if err != nil && r.cmd.ProcessState.ExitCode() != 0 && !strings.Contains(r.log.String(), "Captured and wrote") {
		return cpu, fmt.Errorf("perf sched record: %v: %s", err, r.log.String())
	}
	return cpu, nil
}

// split reads the recording back and splits the life of each of pids,
// their children's (the tap plugin's `ip` commands) merged in; and says
// how long the kernel's threads ran meanwhile.
func (r *schedRecord) split(pids []int) (map[int]*Split, map[string]time.Duration, error) {
	var forks map[int][]int
	if err := perfOutput(func(out io.Reader) (err error) { forks, err = parseForks(out); return err },
		"script", "-i", r.path, "-G", "-F", "event,trace"); err != nil {
		return nil, nil, err
	}
	var h *timehist
	if err := perfOutput(func(out io.Reader) (err error) { h, err = parseTimehist(out); return err },
		"sched", "timehist", "-i", r.path, "--state", "--max-stack", "12"); err != nil {
		return nil, nil, err
	}
	out := map[int]*Split{}
	for _, pid := range pids {
		if _, ok := h.spans[pid]; ok {
			out[pid] = sweep(h.tree(pid, forks))
		}
	}
	return out, h.kthreads, nil
}

// perfOutput runs perf with args, its stdout read by parse.
func perfOutput(parse func(io.Reader) error, args ...string) error {
	cmd := exec.Command("perf", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	perr := parse(out)
	_, _ = io.Copy(io.Discard, out)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("perf %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return perr
}

var forkLine = regexp.MustCompile(`sched_process_fork: comm=.* pid=(\d+) child_comm=.* child_pid=(\d+)`)

// parseForks maps each forking thread to the tasks it forked, from perf
// script's sched_process_fork events.
func parseForks(in io.Reader) (map[int][]int, error) {
	forks := map[int][]int{}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := forkLine.FindStringSubmatch(sc.Text()); m != nil {
			parent, _ := strconv.Atoi(m[1])
			child, _ := strconv.Atoi(m[2])
			forks[parent] = append(forks[parent], child)
		}
	}
	return forks, sc.Err()
}

// Split is where one process's life went: the union of its threads, each
// instant counted once, as on-CPU if any thread ran, else waiting to run
// if any was runnable, else blocked for the most telling reason any
// thread slept for (see blockReasons).
type Split struct {
	Life     time.Duration
	OnCPU    time.Duration
	Runnable time.Duration
	Blocked  map[string]time.Duration
}

// blockReasons name what a sleeping thread waited for, from the frames of
// the stack it slept in, most telling first: a Go program's idle threads
// always sleep in a futex and its sysmon in nanosleep, and a parent in
// epoll or wait4 may be waiting for a child whose own time is counted, so
// those come last and count only when nothing else waited. A frame matches a name that
// it starts with.
var blockReasons = []struct{ name, frames string }{
	{"RCU grace period", "synchronize_rcu synchronize_net rcu_barrier wait_rcu_gp synchronize_srcu"},
	{"rtnl lock", "rtnl_lock rtnl_net_lock __rtnl_lock"}, // or a mutex taken in rtnetlink_rcv_msg: lockHolder
	{"another kernel lock", ""}, // a mutex or rwsem held elsewhere: lockHolder
	{"a unix socket", "unix_stream_read unix_stream_recvmsg unix_wait_for_peer unix_dgram_recvmsg unix_stream_connect"},
	{"sysfs", "kernfs_ sysfs_"},
	{"exec, page faults, file I/O", "io_schedule folio_wait filemap_ bit_wait_io exc_page_fault handle_mm_fault do_execveat"},
	{"other", ""},
	// Below what a child of the process may be doing: a parent waits on
	// its child's pipes (Go's os/exec) as napitap waits on napitapd.
	{"epoll (Go's netpoller: a socket or a child's pipe)", "do_epoll_wait ep_poll"},
	{"a pipe (stdin, stdout)", "anon_pipe_read pipe_read anon_pipe_write pipe_write wait_for_partner"},
	{"a child (wait4)", "do_wait kernel_wait4"},
	{"futex (Go's idle threads)", "futex_wait futex_do_wait __futex_wait"},
	{"nanosleep (Go's sysmon)", "do_nanosleep"},
}

const (
	classOnCPU = iota
	classRunnable
	classBlocked // + the index in blockReasons
)

func reasonIndex(name string) int {
	return slices.IndexFunc(blockReasons, func(r struct{ name, frames string }) bool { return r.name == name })
}

// blockClass reads a `perf sched timehist` stack (callee first, " <- "
// between frames).
func blockClass(stack string) int {
	var frames []string
	for _, f := range strings.Split(stack, " <- ") {
		f, _, _ = strings.Cut(strings.TrimSpace(f), ".") // .isra.0, .constprop.0
		frames = append(frames, f)
	}
	has := func(names string) bool {
		for _, f := range frames {
			for _, n := range strings.Fields(names) {
				if strings.HasPrefix(f, n) {
					return true
				}
			}
		}
		return false
	}
	// The first reason wins: RCU before the locks, since rcu_barrier
	// takes a mutex of its own.
	if has(blockReasons[0].frames) {
		return classBlocked
	}
	if holder, ok := lockHolder(frames); ok {
		for _, taker := range rtnlTakers {
			if strings.HasPrefix(holder, taker) {
				return classBlocked + reasonIndex("rtnl lock")
			}
		}
		return classBlocked + reasonIndex("another kernel lock")
	}
	for i, r := range blockReasons[1:] {
		if r.frames != "" && has(r.frames) {
			return classBlocked + 1 + i
		}
	}
	return classBlocked + reasonIndex("other")
}

// rtnlTakers are the functions that take rtnl with rtnl_lock inlined
// (6.18): a mutex they sleep on is rtnl. tun's close and ioctl take it
// too, and tun_detach holds it across two RCU grace periods per queue.
var rtnlTakers = []string{"rtnl", "rtnetlink", "tun_chr_close", "__tun_chr_ioctl", "tun_detach", "dev_ioctl", "register_netdev", "unregister_netdev"}

// lockHolder: the caller of the mutex or rwsem a thread sleeps on.
func lockHolder(frames []string) (string, bool) {
	for i, f := range frames {
		for _, lock := range []string{"__mutex_lock", "mutex_lock", "rwsem_down", "down_read", "down_write"} {
			if strings.HasPrefix(f, lock) {
				if i+1 < len(frames) {
					return frames[i+1], true
				}
				return "", true
			}
		}
	}
	return "", false
}

func className(c int) string {
	switch c {
	case classOnCPU:
		return "on CPU"
	case classRunnable:
		return "waiting to run"
	}
	return blockReasons[c-classBlocked].name
}

// timehistLine: time, [cpu], comm[tid/pid] or comm[pid], wait, sch delay
// and run time in ms, the state, then the stack.
var timehistLine = regexp.MustCompile(`^\s*(\d+\.\d+)\s+\[\d+\]\s+(.*)\[(\d+)(?:/(\d+))?\]\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\S+)\s*(.*)$`)

// kernelThreads name the kernel's threads by their comm's start: what
// of a burst's CPU went to them.
var kernelThreads = []struct{ name, comms string }{
	{"NAPI threads", "napi/"},
	{"kworkers", "kworker/"},
	{"RCU", "rcu"},
	{"softirq threads", "ksoftirqd/"},
	{"other kernel threads", "kthreadd migration/ cpuhp/ kcompactd khugepaged kswapd jbd2/ irq/ idle_inject/ oom_reaper writeback"},
}

func kernelThread(comm string) string {
	for _, k := range kernelThreads {
		for _, c := range strings.Fields(k.comms) {
			if strings.HasPrefix(comm, c) {
				return k.name
			}
		}
	}
	return ""
}

type interval struct {
	from, to int64 // ns of perf's clock
	class    int
}

// timehist is every process's intervals, by thread-group id, and each
// thread's group.
type timehist struct {
	spans map[int][]interval
	tgid  map[int]int
	// kthreads is the kernel's threads' time on a CPU, by kernelThreads.
	kthreads map[string]time.Duration
}

// tree is pid's intervals with those of the processes it forked, and
// theirs.
func (h *timehist) tree(pid int, forks map[int][]int) []interval {
	spans := slices.Clone(h.spans[pid])
	seen := map[int]bool{pid: true}
	for todo := []int{pid}; len(todo) > 0; todo = todo[1:] {
		for tid, g := range h.tgid {
			if g != todo[0] {
				continue
			}
			for _, child := range forks[tid] {
				if c := h.tgid[child]; c == child && !seen[c] {
					seen[c] = true
					spans = append(spans, h.spans[c]...)
					todo = append(todo, c)
				}
			}
		}
	}
	return spans
}

// parseTimehist reads `perf sched timehist --state` output.
func parseTimehist(in io.Reader) (*timehist, error) {
	h := &timehist{spans: map[int][]interval{}, tgid: map[int]int{}, kthreads: map[string]time.Duration{}}
	type thread struct {
		state, stack string
		seen         bool
	}
	threads := map[int]*thread{}
	ms := func(s string) int64 { f, _ := strconv.ParseFloat(s, 64); return int64(f * 1e6) }
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m := timehistLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		comm := strings.TrimSpace(m[2])
		tid, _ := strconv.Atoi(m[3])
		pid := tid
		if m[4] != "" {
			pid, _ = strconv.Atoi(m[4])
		}
		h.tgid[tid] = pid
		at := int64(0)
		if f, err := strconv.ParseFloat(m[1], 64); err == nil {
			at = int64(f * 1e9)
		}
		wait, delay, run := ms(m[5]), ms(m[6]), ms(m[7])
		if k := kernelThread(comm); k != "" {
			h.kthreads[k] += time.Duration(run)
		}
		t := threads[tid]
		if t == nil {
			t = &thread{}
			threads[tid] = t
		}
		in := at - run
		s := append(h.spans[pid], interval{in, at, classOnCPU})
		switch {
		case wait > 0 && t.seen && strings.HasPrefix(t.state, "R"):
			// Preempted: runnable all along.
			s = append(s, interval{in - wait, in, classRunnable})
		case wait > 0 && t.seen:
			delay = min(delay, wait)
			s = append(s, interval{in - wait, in - delay, blockClass(t.stack)}, interval{in - delay, in, classRunnable})
		case delay > 0:
			s = append(s, interval{in - delay, in, classRunnable})
		}
		h.spans[pid] = s
		t.state, t.stack, t.seen = m[8], m[9], true
	}
	return h, sc.Err()
}

// sweep counts each instant of a process's life once, in the lowest class
// any of its threads was in then.
func sweep(spans []interval) *Split {
	type edge struct {
		at    int64
		class int
		delta int
	}
	var edges []edge
	for _, s := range spans {
		if s.to > s.from {
			edges = append(edges, edge{s.from, s.class, 1}, edge{s.to, s.class, -1})
		}
	}
	slices.SortFunc(edges, func(a, b edge) int { return cmp.Compare(a.at, b.at) })
	sp := &Split{Blocked: map[string]time.Duration{}}
	if len(edges) == 0 {
		return sp
	}
	count := make([]int, classBlocked+len(blockReasons))
	sp.Life = time.Duration(edges[len(edges)-1].at - edges[0].at)
	for i, e := range edges {
		count[e.class] += e.delta
		if i+1 == len(edges) {
			break
		}
		d := time.Duration(edges[i+1].at - e.at)
		if d == 0 {
			continue
		}
		c := slices.IndexFunc(count, func(n int) bool { return n > 0 })
		switch {
		case c < 0:
			// No thread seen: between two of its threads' events, none
			// of which covers this gap (a thread not yet created).
			sp.Blocked["other"] += d
		case c == classOnCPU:
			sp.OnCPU += d
		case c == classRunnable:
			sp.Runnable += d
		default:
			sp.Blocked[className(c)] += d
		}
	}
	return sp
}

// SplitMean is the mean split of some ADDs, beside their mean wall time as
// the bench saw it (fork to reaped, so a little more than Life).
type SplitMean struct {
	ADDs int
	Wall time.Duration
	Split
}

// SplitSummary is a burst's: all its ADDs, its slowest tenth by wall, and
// its ADDs of each hand-off mode where it has more than one.
type SplitSummary struct {
	All, Slowest SplitMean
	Modes        map[string]SplitMean
}

func summarize(vms []*vmPod, splits map[int]*Split) *SplitSummary {
	var adds []*vmPod
	for _, v := range vms {
		if v.add.Err == nil && splits[v.add.Pid] != nil {
			adds = append(adds, v)
		}
	}
	slices.SortFunc(adds, func(a, b *vmPod) int { return cmp.Compare(b.add.Wall, a.add.Wall) })
	mean := func(vs []*vmPod) SplitMean {
		m := SplitMean{ADDs: len(vs), Split: Split{Blocked: map[string]time.Duration{}}}
		if len(vs) == 0 {
			return m
		}
		for _, v := range vs {
			s := splits[v.add.Pid]
			m.Wall += v.add.Wall
			m.Life += s.Life
			m.OnCPU += s.OnCPU
			m.Runnable += s.Runnable
			for k, d := range s.Blocked {
				m.Blocked[k] += d
			}
		}
		n := time.Duration(len(vs))
		m.Wall, m.Life, m.OnCPU, m.Runnable = m.Wall/n, m.Life/n, m.OnCPU/n, m.Runnable/n
		for k := range m.Blocked {
			m.Blocked[k] /= n
		}
		return m
	}
	sum := &SplitSummary{All: mean(adds), Slowest: mean(adds[:(len(adds)+9)/10]), Modes: map[string]SplitMean{}}
	byMode := map[string][]*vmPod{}
	for _, v := range adds {
		byMode[v.mode()] = append(byMode[v.mode()], v)
	}
	if len(byMode) > 1 {
		for mode, vs := range byMode {
			sum.Modes[mode] = mean(vs)
		}
	}
	return sum
}
