package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
)

// TestASupervisedNapitapdServesAgainAtOnceAfterEachSIGKILL: with
// --supervise, napitapd serves from a child process, which a SIGKILL (the
// OOM killer's, an operator's) ends without ending the container's
// process: the supervisor starts the next child at once, which takes
// everything back from the fd holder, kill after kill, with no kubelet
// restart back-off. SIGTERM then ends both with status 0.
func TestASupervisedNapitapdServesAgainAtOnceAfterEachSIGKILL(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}
	holder := filepath.Join(dir, "fdstore.sock")
	startHolder(t, holder)
	sup := startNapitapdProc(t, p, "--supervise", "--fdstore-socket", holder)
	waitFile(t, p.seccomp)
	worker := childOf(t, sup.cmd.Process.Pid)
	launchUnderFilter(t, p.seccomp, worker)

	for kill := 1; kill <= 3; kill++ {
		servings := strings.Count(sup.log.String(), "msg=serving")
		killed := time.Now()
		if err := syscall.Kill(worker, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); strings.Count(sup.log.String(), "msg=serving") == servings; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("kill %d: no napitapd serves again:\n%s", kill, sup.log)
			}
		}
		t.Logf("kill %d of 3: serving again %v after the SIGKILL", kill, time.Since(killed).Round(time.Millisecond))
		next := childOf(t, sup.cmd.Process.Pid)
		if next == worker {
			t.Fatalf("kill %d: the same child %d", kill, next)
		}
		worker = next
		if n := seccompListeners(t, worker); n != 1 {
			t.Errorf("kill %d: the next child holds %d seccomp listeners, want the 1 the holder kept", kill, n)
		}
		if _, err := (&handoff.Client{Socket: p.socket}).List(); err != nil {
			t.Errorf("kill %d: list: %v", kill, err)
		}
	}

	sup.stop(t, "the supervisor")
	if err := syscall.Kill(worker, 0); err == nil {
		t.Errorf("its child %d outlives the supervisor", worker)
	}
}

// childOf waits for the one child process of pid and returns it.
func childOf(t *testing.T, pid int) int {
	t.Helper()
	path := fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var children []string
		// A Go process forks from any of its threads.
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			b, _ := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(path)), task.Name(), "children"))
			children = append(children, strings.Fields(string(b))...)
		}
		if len(children) == 1 {
			if c, err := strconv.Atoi(children[0]); err == nil {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d has children %v, want one", pid, children)
		}
	}
}
