package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
)

// TestWithSuccessorWaitAStoppedNapitapdServesOnForItsReplacement: a
// deleted DaemonSet pod's napitapd gets SIGTERM while the controller
// starts its replacement (../shared/DESIGN.md fact 21). With
// --successor-wait it serves on, and a napitapd that starts meanwhile
// takes everything over; with no successor it stops once the wait ends,
// or at once on a second signal.
func TestWithSuccessorWaitAStoppedNapitapdServesOnForItsReplacement(t *testing.T) {
	nstest.RequireRoot(t)
	tests := []struct {
		name      string
		wait      string
		successor bool // a new napitapd starts after the SIGTERM
		again     bool // a second SIGTERM
		within    time.Duration
	}{
		{"a napitapd started after the SIGTERM takes everything over", "30s", true, false, 15 * time.Second},
		{"with no successor it stops once the wait ends", "700ms", false, false, 10 * time.Second},
		{"a second SIGTERM stops it at once", "1m", false, true, 10 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}
			old := startNapitapdProc(t, p, "--successor-wait="+tc.wait)
			waitFile(t, p.socket)
			waitFile(t, p.seccomp)
			launchUnderFilter(t, p.seccomp, old.cmd.Process.Pid)

			termed := time.Now()
			if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(old.log.String(), "serving on until"); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("napitapd did not say it serves on after SIGTERM:\n%s", old.log)
				}
			}
			// Still serving: a runtime's request meanwhile is answered.
			if _, err := (&handoff.Client{Socket: p.socket}).List(); err != nil {
				t.Errorf("list after the SIGTERM: %v", err)
			}
			var next *napitapd
			if tc.successor {
				next = startNapitapdProc(t, p)
			}
			if tc.again {
				if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			old.waitExit(t, tc.within, "napitapd after SIGTERM")
			stopped := time.Since(termed)

			if !tc.successor {
				if wait, _ := time.ParseDuration(tc.wait); !tc.again && stopped < wait {
					t.Errorf("napitapd stopped %v after SIGTERM, before its wait of %v", stopped, wait)
				}
				// As without the wait: the sockets are removed.
				for _, path := range []string{p.socket, p.seccomp} {
					if _, err := os.Lstat(path); err == nil {
						t.Errorf("%s is still there after napitapd stopped", path)
					}
				}
				return
			}
			for deadline := time.Now().Add(10 * time.Second); !strings.Contains(next.log.String(), "tookOver=true"); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the successor did not take over:\n%s", next.log)
				}
			}
			if n := seccompListeners(t, next.cmd.Process.Pid); n != 1 {
				t.Errorf("the successor holds %d seccomp listeners, want 1", n)
			}
			if _, err := (&handoff.Client{Socket: p.socket}).List(); err != nil {
				t.Errorf("list from the successor: %v", err)
			}
		})
	}
}
