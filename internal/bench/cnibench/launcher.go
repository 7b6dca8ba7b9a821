package cnibench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
)

// The bench does not fork the plugins itself: see package launch. The
// launcher, napitap-bench-launcher from the bin dir or else this binary
// re-exec'd with launcherEnv set, forks and times them; its own VmHWM is
// the floor of every RSS it reports. It starts in the host netns, so every
// plugin it forks is there, as if a runtime in that netns had exec'd it.

const (
	launcherEnv = "NAPITAP_BENCH_LAUNCHER"
	launcherBin = "napitap-bench-launcher"
)

// launcher is the bench's end of it.
type launcher struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	dec    *json.Decoder
	mu     sync.Mutex
	nextID int
	done   chan struct{}
	path   string
	env    []string
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

// startLauncher starts the launcher from a thread in the host netns;
// cleanup closes its stdin, and kills it by PID if it lingers.
func (b *bench) startLauncher() (*launcher, error) {
	l := &launcher{done: make(chan struct{}), env: baseEnv()}
	if exe := filepath.Join(b.binDir, launcherBin); isExecutable(exe) {
		l.cmd = exec.Command(exe)
		l.cmd.Env = os.Environ()
	} else {
		// A bigger floor, but it works with any --bin: this binary's main
		// dispatches "cni" to Main, which sees launcherEnv.
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		l.cmd = exec.Command(exe, "cni")
		l.cmd.Env = append(os.Environ(), launcherEnv+"=1")
	}
	l.path = l.cmd.Path
	l.cmd.Stderr = os.Stderr
	// Its own process group: a ^C reaches the bench, which then lets the
	// plugins in flight finish before it cleans up.
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	if l.stdin, err = l.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := l.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	l.dec = json.NewDecoder(bufio.NewReader(stdout))
	var startErr error
	if err := b.host.Do(func(ns.NetNS) error {
		startErr = l.cmd.Start()
		return nil
	}); err != nil {
		return nil, err
	}
	if startErr != nil {
		return nil, fmt.Errorf("start launcher %s: %w", l.path, startErr)
	}
	go func() { _ = l.cmd.Wait(); close(l.done) }()
	b.onCleanup(l.stop)
	return l, nil
}

func (l *launcher) pid() int { return l.cmd.Process.Pid }

func (l *launcher) stop() error {
	l.stdin.Close()
	select {
	case <-l.done:
		return nil
	case <-time.After(30 * time.Second):
		_ = l.cmd.Process.Kill()
		<-l.done
		return fmt.Errorf("launcher (pid %d) did not exit 30 s after its stdin closed; killed", l.pid())
	}
}

// batch runs reqs at once in the launcher and returns their results.
func (l *launcher) batch(reqs []launch.Req) (*launch.BatchRes, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nextID++
	if err := json.NewEncoder(l.stdin).Encode(&launch.Batch{ID: l.nextID, Env: l.env, Runs: reqs}); err != nil {
		return nil, fmt.Errorf("launcher: %w", err)
	}
	var res launch.BatchRes
	if err := l.dec.Decode(&res); err != nil {
		return nil, fmt.Errorf("launcher: %w", err)
	}
	if res.ID != l.nextID || len(res.Results) != len(reqs) {
		return nil, fmt.Errorf("launcher answered batch %d with %d results for batch %d of %d", res.ID, len(res.Results), l.nextID, len(reqs))
	}
	return &res, nil
}
