package cnibench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Profile is one plugin exec traced with strace -f -tt -T (or napitapd,
// attached to around one).
type Profile struct {
	Label, Command string
	File           string        // the raw trace, in --out
	Wall           time.Duration // of the traced exec, strace included
	Span           time.Duration // first to last line of the trace
	// Startup runs from the plugin's execve to its first read of stdin
	// (skel reads the config first thing): exec, Go runtime, package init.
	Startup   time.Duration
	Threads   int  // distinct tids
	Daemon    bool // napitapd, attached to for the exec: no execve
	Execs     int  // successful execve: the plugin and whatever it ran
	BySyscall []SyscallTime
	Slowest   []SlowCall
}

// SyscallTime sums the time spent inside one syscall across all threads.
type SyscallTime struct {
	Name  string
	Calls int
	Total time.Duration
}

// SlowCall is one slow syscall, as strace printed it.
type SlowCall struct {
	TID  int
	At   time.Duration // since the trace began
	Call string
	Dur  time.Duration
}

// tracedSyscalls are the ones the profile shows: the process's life
// (execve, stdin, exit), netlink, the tun fds, sockets, mounts and
// namespaces, and waiting for children. Tracing only these (with
// --seccomp-bpf, the others do not even stop) keeps strace's own overhead
// low enough for the timeline to mean something.
const tracedSyscalls = "execve,read,write,openat,close,ioctl,socket,bind,connect,sendto,sendmsg,recvfrom,recvmsg," +
	"clone,clone3,exit_group,mount,umount2,unshare,setns,wait4,waitid"

func straceArgs(file string) []string {
	return []string{"-tt", "-T", "-s", "64", "-e", "trace=" + tracedSyscalls, "-o", file}
}

// idleSyscalls are where Go's idle threads and a parent waiting for its
// children sit; their time is not work the exec does.
var idleSyscalls = map[string]bool{
	"futex": true, "epoll_pwait": true, "epoll_pwait2": true, "epoll_wait": true, "nanosleep": true, "clock_nanosleep": true,
	"wait4": true, "waitid": true, "rt_sigsuspend": true, "pselect6": true, "ppoll": true, "poll": true, "select": true, "sched_yield": true, "restart_syscall": true,
}

// parseStrace reads `strace -f -tt -T -o` output.
func parseStrace(r io.Reader) (*Profile, error) {
	p := &Profile{}
	sums := map[string]*SyscallTime{}
	pending := map[int]string{} // tid -> call text before "<unfinished ...>"
	tids := map[int]bool{}
	var first, last, exec0, stdin time.Duration
	var haveFirst bool
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// "<tid> <time> <rest>", the tid padded with spaces.
		line := strings.TrimLeft(sc.Text(), " ")
		f := strings.SplitN(line, " ", 2)
		if len(f) < 2 {
			continue
		}
		rest := strings.TrimLeft(f[1], " ")
		f = append(f[:1], strings.SplitN(rest, " ", 2)...)
		if len(f) < 3 {
			continue
		}
		tid, err := strconv.Atoi(f[0])
		if err != nil {
			continue
		}
		at, err := timeOfDay(f[1])
		if err != nil {
			continue
		}
		if !haveFirst {
			first, haveFirst = at, true
		}
		last = at
		tids[tid] = true
		text := f[2]
		if strings.HasPrefix(text, "+++") || strings.HasPrefix(text, "---") {
			continue
		}
		if call, ok := strings.CutSuffix(text, " <unfinished ...>"); ok {
			pending[tid] = call
			continue
		}
		var name string
		if rest, ok := strings.CutPrefix(text, "<... "); ok {
			name, rest, _ = strings.Cut(rest, " resumed>")
			text = pending[tid] + rest
			delete(pending, tid)
		} else {
			name, _, _ = strings.Cut(text, "(")
		}
		dur := callDuration(text)
		if name == "execve" && !strings.Contains(text, "= -1") {
			if p.Execs == 0 {
				exec0 = at
			}
			p.Execs++
		}
		if name == "read" && strings.HasPrefix(text, "read(0,") && stdin == 0 && p.Execs > 0 {
			stdin = at
		}
		if idleSyscalls[name] || dur < 0 {
			continue
		}
		s := sums[name]
		if s == nil {
			s = &SyscallTime{Name: name}
			sums[name] = s
		}
		s.Calls++
		s.Total += dur
		p.Slowest = append(p.Slowest, SlowCall{TID: tid, At: at - first, Call: text, Dur: dur})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !haveFirst {
		return nil, errors.New("empty trace")
	}
	p.Span, p.Threads = last-first, len(tids)
	if stdin > exec0 {
		p.Startup = stdin - exec0
	}
	for _, s := range sums {
		p.BySyscall = append(p.BySyscall, *s)
	}
	slices.SortFunc(p.BySyscall, func(a, b SyscallTime) int { return int(b.Total - a.Total) })
	slices.SortStableFunc(p.Slowest, func(a, b SlowCall) int { return int(b.Dur - a.Dur) })
	p.BySyscall = p.BySyscall[:min(len(p.BySyscall), 12)]
	p.Slowest = p.Slowest[:min(len(p.Slowest), 12)]
	return p, nil
}

func parseStraceFile(name string) (*Profile, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	p, err := parseStrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

// attachStrace traces every thread of pid into file until stop, which
// interrupts that strace (by its PID) and waits for it.
func attachStrace(strace string, pid int, file string) (stop func() error, err error) {
	cmd := exec.Command(strace, append(append([]string{"-f"}, straceArgs(file)...), "-p", strconv.Itoa(pid))...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// strace says "Process <pid> attached" once per thread; the first is
	// the one asked for.
	attached := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "attached") {
				attached <- nil
				break
			}
		}
		io.Copy(io.Discard, stderr)
		attached <- errors.New("strace ended before attaching")
	}()
	select {
	case err = <-attached:
	case <-time.After(5 * time.Second):
		err = errors.New("strace did not attach within 5 s")
	}
	// Let it reach the other threads too.
	time.Sleep(100 * time.Millisecond)
	stop = func() error {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				return err
			}
		}
		return nil
	}
	if err != nil {
		_ = stop()
		return nil, fmt.Errorf("strace -p %d: %w", pid, err)
	}
	return stop, nil
}

// timeOfDay parses strace's -tt "15:04:05.000000".
func timeOfDay(s string) (time.Duration, error) {
	t, err := time.Parse("15:04:05.000000", s)
	if err != nil {
		return 0, err
	}
	return time.Duration(t.Hour())*time.Hour + time.Duration(t.Minute())*time.Minute + time.Duration(t.Second())*time.Second + time.Duration(t.Nanosecond()), nil
}

// callDuration reads -T's trailing "<0.000123>", -1 without one.
func callDuration(text string) time.Duration {
	i := strings.LastIndexByte(text, '<')
	if i < 0 || !strings.HasSuffix(text, ">") {
		return -1
	}
	secs, err := strconv.ParseFloat(text[i+1:len(text)-1], 64)
	if err != nil {
		return -1
	}
	return time.Duration(secs * float64(time.Second))
}

// profile runs one ADD and one DEL of the reference plugin (a), of napitap
// standalone with 4 NAPI queues (b4) and of napitap chained with hand-off
// (d) under strace -f --seccomp-bpf, tracing tracedSyscalls; only the tap
// or napitap exec is traced (and napitapd, attached to, for (d)).
func (b *bench) profile(ctx context.Context, vs []*variant) ([]Profile, error) {
	strace, err := exec.LookPath("strace")
	if err != nil {
		return nil, errors.New("--strace: strace is not installed (apt-get install strace)")
	}
	out, err := filepath.Abs(b.opt.out)
	if err != nil {
		return nil, err
	}
	var profiles []Profile
	for _, v := range vs {
		if v.res.ID != "a" && v.res.ID != "b4" && v.res.ID != "d" {
			continue
		}
		traced := max(v.res.Step("tap"), v.res.Step("napitap"))
		files := map[string]string{}
		wrap := func(command string) wrapFunc {
			files[command] = filepath.Join(out, fmt.Sprintf("cni-strace-%s-%s.txt", v.res.ID, command))
			return func(i int) []string {
				if i != traced {
					return nil
				}
				return append([]string{strace, "-f", "--seccomp-bpf"}, straceArgs(files[command])...)
			}
		}
		cid := fmt.Sprintf("napitap-bench-%s-strace-%s", b.suffix, v.res.ID)
		// With hand-off, napitapd does part of the work (it closes the
		// queues on DEL): trace it too, around each exec.
		daemonFiles := map[string]string{}
		traceDaemon := func(command string, fn func() chainRun) chainRun {
			if v.res.Step("napitap") < 0 || !strings.Contains(v.res.Config, `"socket"`) {
				return fn()
			}
			file := filepath.Join(out, fmt.Sprintf("cni-strace-%s-%s-napitapd.txt", v.res.ID, command))
			stop, err := attachStrace(strace, b.daemon.pid(), file)
			if err != nil {
				b.fail("strace napitapd: %v", err)
				return fn()
			}
			c := fn()
			if err := stop(); err != nil {
				b.fail("strace napitapd: %v", err)
			} else {
				daemonFiles[command] = file
			}
			return c
		}
		add := traceDaemon("ADD", func() chainRun { return b.add(ctx, v, cid, wrap("ADD")) })
		_ = b.settle(ctx)
		del := traceDaemon("DEL", func() chainRun { return b.del(ctx, v, cid, add.result, wrap("DEL")) })
		if add.err != nil {
			b.fail("%s ADD %s under strace: %v", v.res.Label, cid, add.err)
		}
		if del.err != nil {
			b.fail("%s DEL %s under strace: %v", v.res.Label, cid, del.err)
		}
		if add.err != nil || del.err != nil {
			continue
		}
		for _, c := range []struct {
			command string
			run     chainRun
		}{{"ADD", add}, {"DEL", del}} {
			p, err := parseStraceFile(files[c.command])
			if err != nil {
				return profiles, err
			}
			p.Label, p.Command, p.File, p.Wall = v.res.Label, c.command, filepath.Base(files[c.command]), c.run.steps[traced].Wall
			profiles = append(profiles, *p)
			if file, ok := daemonFiles[c.command]; ok {
				p, err := parseStraceFile(file)
				if err != nil {
					return profiles, err
				}
				p.Label, p.Command, p.File, p.Daemon = "napitapd during "+v.res.Label, c.command, filepath.Base(file), true
				profiles = append(profiles, *p)
			}
		}
	}
	return profiles, nil
}

func (p *Profile) markdown(w io.Writer) {
	fmt.Fprintf(w, "## strace: %s, %s\n\n", p.Label, p.Command)
	how := "-f --seccomp-bpf"
	if p.Daemon {
		how = "-f -p <napitapd>"
	}
	fmt.Fprintf(w, "`strace %s -tt -T -e trace=%s` (`%s`); strace slows the traced syscalls down, so read it for where time goes, not how much. ", how, tracedSyscalls, p.File)
	if p.Daemon {
		fmt.Fprintf(w, "napitapd was attached to (`strace -p`) around the plugin exec; trace span %s; %d threads. ", fmtDur(p.Span), p.Threads)
	} else {
		fmt.Fprintf(w, "The exec took %s under strace; trace span %s; execve to first read of stdin (exec, Go runtime start, init) %s; %d threads, %d execs. ",
			fmtDur(p.Wall), fmtDur(p.Span), fmtDur(p.Startup), p.Threads, p.Execs)
	}
	fmt.Fprintf(w, "Time inside the traced syscalls, all threads, waits for children (wait4, waitid) left out:\n\n")
	fmt.Fprintf(w, "| syscall | calls | total |\n|---|---:|---:|\n")
	for _, s := range p.BySyscall {
		fmt.Fprintf(w, "| %s | %d | %s |\n", s.Name, s.Calls, fmtDur(s.Total))
	}
	fmt.Fprintf(w, "\nSlowest calls:\n\n| at | tid | call | time |\n|---:|---:|---|---:|\n")
	for _, s := range p.Slowest {
		call := s.Call
		if len(call) > 110 {
			call = call[:110] + "..."
		}
		fmt.Fprintf(w, "| %s | %d | `%s` | %s |\n", fmt.Sprintf("%.1f ms", float64(s.At)/float64(time.Millisecond)), s.TID, strings.ReplaceAll(call, "|", "\\|"), fmtDur(s.Dur))
	}
	fmt.Fprintln(w)
}
