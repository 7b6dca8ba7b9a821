// Package launch forks and times processes for napitap-bench cni, from a
// process that stays small: a child's ru_maxrss starts at its parent's RSS
// high-water mark (exec_mmap() folds the old mm's hiwater_rss into
// signal->maxrss, and after a vfork, which Go's os/exec does, the old mm is
// the parent's). Forked from the bench itself, every plugin would report
// at least the bench's RSS. Beside the standard library and x/sys/unix it
// imports only pkg/seccompagent, for the capacity bench's VMs (vm.go): its
// packages' inits start the launcher at 2.8 MiB instead of 2.4 MiB, under
// the 5.2 MiB it reaches serving a batch.
package launch

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Req is one exec.
type Req struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"` // appended to Batch.Env; no variable in both
	Stdin []byte   `json:"stdin"`
}

// Res is what one exec did.
type Res struct {
	Wall   time.Duration `json:"wall"` // fork to reap
	CPU    time.Duration `json:"cpu"`  // user+sys, with the children it reaped
	Sys    time.Duration `json:"sys"`  // sys alone, as the kernel's tick sampling splits it
	MaxRSS int64         `json:"maxRSS"`
	Status int           `json:"status"` // exit status, or -1
	Signal string        `json:"signal,omitempty"`
	Stdout []byte        `json:"stdout"`
	Stderr []byte        `json:"stderr"`
	Err    string        `json:"err,omitempty"` // the fork itself failed
}

// Batch runs its execs at once: all are prepared, then forked back to
// back; BatchRes.Wall runs from the first fork to the last reap.
type Batch struct {
	ID   int      `json:"id"`
	Env  []string `json:"env"` // every exec's environment, before its Req.Env
	Runs []Req    `json:"runs"`
}

// BatchRes answers a Batch, results in the order of its runs.
type BatchRes struct {
	ID      int           `json:"id"`
	Wall    time.Duration `json:"wall"`
	Results []Res         `json:"results"`
}

// Serve serves batches from r to w until r ends. A batch is answered once
// all its execs are reaped.
func Serve(r io.Reader, w io.Writer) error {
	// Garbage (ForkExec copies argv and env) would otherwise pile up to
	// the 4 MiB heap minimum before a GC; a small heap GCs cheaply.
	debug.SetGCPercent(20)
	dec := json.NewDecoder(bufio.NewReader(r))
	enc := json.NewEncoder(w)
	for {
		var b Batch
		if err := dec.Decode(&b); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		res := serveBatch(&b)
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
}

// serveBatch prepares every exec, forks them back to back from this
// goroutine (Go serialises forks anyway, under syscall.ForkLock), and reaps
// them from one other goroutine that waits on all their pidfds in one
// epoll set. No goroutine or thread per exec in flight keeps the launcher's
// RSS, the floor of every RSS it reports, low; and nothing but that
// goroutine reaps a child (a wait4(-1) reaper would race ForkExec, which
// reaps a child whose exec failed).
func serveBatch(b *Batch) *BatchRes {
	res := &BatchRes{ID: b.ID, Results: make([]Res, len(b.Runs))}
	procs := make([]*proc, len(b.Runs))
	for i := range b.Runs {
		procs[i] = prepare(b.Env, &b.Runs[i])
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		for i := range res.Results {
			procs[i].close()
			res.Results[i] = Res{Status: -1, Err: fmt.Sprintf("epoll_create1: %v", err)}
		}
		return res
	}
	defer unix.Close(epfd)

	var mu sync.Mutex // guards procs[i].pid and start for the reaper
	forked := make(chan int, 1)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		reap(epfd, procs, res.Results, &mu, forked)
	}()

	start := time.Now()
	n := 0
	for i, p := range procs {
		if p.err != nil {
			res.Results[i] = Res{Status: -1, Err: p.err.Error()}
			continue
		}
		forkedAt := time.Now()
		pid, err := syscall.ForkExec(p.argv[0], p.argv, p.attr)
		mu.Lock()
		p.start, p.pid = forkedAt, pid
		pidfd := p.pidfd
		mu.Unlock()
		if err != nil {
			p.close()
			res.Results[i] = Res{Status: -1, Err: fmt.Sprintf("fork/exec %s: %v", p.argv[0], err)}
			continue
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(i)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
			// Reap it here, untimed.
			var ws syscall.WaitStatus
			_, _ = syscall.Wait4(pid, &ws, 0, nil)
			p.close()
			res.Results[i] = Res{Status: -1, Err: fmt.Sprintf("epoll_ctl pidfd: %v", err)}
			continue
		}
		n++
	}
	forked <- n
	<-reaped
	res.Wall = time.Since(start)
	return res
}

// reap waits on epfd until every exec forked (their count comes on forked
// once the forking is over) has exited, and reaps each as it does.
func reap(epfd int, procs []*proc, results []Res, mu *sync.Mutex, forked <-chan int) {
	events := make([]unix.EpollEvent, 64)
	total, done := -1, 0
	for total < 0 || done < total {
		select {
		case total = <-forked:
			continue
		default:
		}
		k, err := unix.EpollWait(epfd, events, 20)
		at := time.Now()
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			fmt.Fprintln(os.Stderr, "napitap-bench-launcher: epoll_wait:", err)
			time.Sleep(time.Millisecond)
			continue
		}
		for _, ev := range events[:k] {
			i := int(ev.Fd)
			mu.Lock()
			p := procs[i]
			mu.Unlock()
			_ = unix.EpollCtl(epfd, unix.EPOLL_CTL_DEL, p.pidfd, nil)
			results[i] = p.reap(at)
			done++
		}
	}
}

// proc is one exec: stdin is a pipe that already holds the config and EOF,
// stdout and stderr are memory files read after the reap.
type proc struct {
	argv                  []string
	attr                  *syscall.ProcAttr
	pidfd, pid            int
	stdin, stdout, stderr *os.File
	start                 time.Time
	err                   error
}

func prepare(env []string, req *Req) *proc {
	p := &proc{argv: req.Argv, pidfd: -1}
	if len(req.Argv) == 0 {
		p.err = errors.New("empty argv")
		return p
	}
	if p.stdin, p.err = FilledPipe(req.Stdin); p.err == nil {
		if p.stdout, p.err = MemFile("stdout"); p.err == nil {
			p.stderr, p.err = MemFile("stderr")
		}
	}
	if p.err != nil {
		p.close()
		return p
	}
	p.attr = &syscall.ProcAttr{
		Env:   append(env[:len(env):len(env)], req.Env...),
		Files: []uintptr{p.stdin.Fd(), p.stdout.Fd(), p.stderr.Fd()},
		Sys:   &syscall.SysProcAttr{PidFD: &p.pidfd},
	}
	return p
}

func (p *proc) close() {
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// reap collects the exited child; at is when its exit was seen.
func (p *proc) reap(at time.Time) Res {
	defer p.close()
	res := Res{Status: -1}
	var status syscall.WaitStatus
	var usage syscall.Rusage
	var err error
	for {
		if _, err = syscall.Wait4(p.pid, &status, 0, &usage); !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		res.Err = fmt.Sprintf("wait for %s (pid %d): %v", p.argv[0], p.pid, err)
		return res
	}
	res.Wall = at.Sub(p.start)
	res.Sys = time.Duration(syscall.TimevalToNsec(usage.Stime))
	res.CPU = time.Duration(syscall.TimevalToNsec(usage.Utime)) + res.Sys
	res.MaxRSS = usage.Maxrss * 1024 // KiB on Linux
	if status.Exited() {
		res.Status = status.ExitStatus()
	} else if status.Signaled() {
		res.Signal = status.Signal().String()
	}
	res.Stdout, res.Stderr = ReadAll(p.stdout), ReadAll(p.stderr)
	return res
}

// FilledPipe returns the read end of a pipe holding data, write end closed.
func FilledPipe(data []byte) (*os.File, error) {
	if len(data) > 60<<10 {
		return nil, fmt.Errorf("config of %d bytes does not fit a pipe", len(data))
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	_, err = w.Write(data)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// MemFile is an anonymous file in memory for a child's output: no reader
// goroutine, and a write never blocks.
func MemFile(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate("napitap-bench-"+name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// ReadAll reads f from its start.
func ReadAll(f *os.File) []byte {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil
	}
	b, _ := io.ReadAll(f)
	return b
}
