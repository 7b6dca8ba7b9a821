// Package supervise runs a daemon as a child process and starts it again
// at once when it dies of a signal (SIGKILL, the OOM killer picking it, a
// segfault), so that the kubelet's restart back-off (10 s, doubling to
// 5 min) never decides how long the daemon is gone: the container's own
// process, the supervisor, lives on. A child that exits by itself (a bad
// flag, an error it reports) ends the supervisor with its status, and so
// does a child that keeps dying: the kubelet then sees the container fail,
// as without a supervisor.
package supervise

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"
)

// Policy bounds the restarts.
type Policy struct {
	// MaxRestarts within Window: one more ends the supervisor.
	MaxRestarts int
	Window      time.Duration
}

// DefaultPolicy restarts a child killed up to 5 times a minute.
var DefaultPolicy = Policy{MaxRestarts: 5, Window: time.Minute}

// Run starts cmd (built afresh by newCmd for each start, its output
// wired by the caller) and supervises it: SIGTERM and SIGINT go to the
// child, and Run returns the child's exit status once it exits by
// itself or after such a signal; a child killed by a signal otherwise is
// started again at once, within p. A supervisor that dies (SIGKILL)
// sends its child SIGTERM, so that no child outlives its container.
func Run(log *slog.Logger, p Policy, newCmd func() *exec.Cmd) (int, error) {
	// PR_SET_PDEATHSIG fires when the thread that forked the child
	// exits: one thread for every start, for Run's whole life.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)

	var restarts []time.Time
	stopping := false
	for {
		cmd := newCmd()
		if cmd.SysProcAttr == nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{}
		}
		cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
		started := time.Now()
		if err := cmd.Start(); err != nil {
			return 1, fmt.Errorf("start %s: %w", cmd.Path, err)
		}
		log.Info("supervise: started", "pid", cmd.Process.Pid)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		var err error
	wait:
		for {
			select {
			case sig := <-sigs:
				stopping = true
				_ = cmd.Process.Signal(sig)
			case err = <-done:
				break wait
			}
		}
		sig, killed := killedBy(err)
		switch {
		case !killed:
			return cmd.ProcessState.ExitCode(), nil
		case stopping:
			// As a shell reports a signal's death (ExitCode says -1).
			return 128 + int(sig), nil
		}
		now := time.Now()
		restarts = append(restarts, now)
		for len(restarts) > 0 && now.Sub(restarts[0]) > p.Window {
			restarts = restarts[1:]
		}
		if len(restarts) > p.MaxRestarts {
			log.Error("supervise: killed too often; exiting, for the kubelet to restart the container", "pid", cmd.Process.Pid, "signal", sig.String(),
				"restarts", len(restarts)-1, "within", p.Window.String())
			return 128 + int(sig), nil
		}
		log.Warn("supervise: killed; starting it again", "pid", cmd.Process.Pid, "signal", sig.String(), "ran", now.Sub(started).String())
	}
}

// killedBy is the signal that ended a child, from its Wait error.
func killedBy(err error) (syscall.Signal, bool) {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return 0, false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return 0, false
	}
	return ws.Signal(), true
}
