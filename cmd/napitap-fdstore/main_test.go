package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/internal/nstest"
)

func TestMain(m *testing.M) { mainexec.Run(m, "napitap-fdstore", main) }

// TestTheHolderIsClosedToARootWithoutCAPSYSPTRACE: the holder runs as uid
// 0 with no capability and holds every listener and queue of napitapd's;
// a dumpable one would let any uid-0 process with hostPID open its fds
// through /proc/PID/fd and reach its socket through /proc/PID/root.
func TestTheHolderIsClosedToARootWithoutCAPSYSPTRACE(t *testing.T) {
	nstest.RequireRoot(t)
	socket := filepath.Join(t.TempDir(), "fdstore.sock")
	// As the DaemonSet runs it: uid 0, no capability.
	holder := nstest.AsCaplessRoot(t, mainexec.Command("napitap-fdstore", "--socket", socket))
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the holder made no socket in 10 s")
		}
	}
	nstest.CheckProcClosed(t, holder.Process.Pid)
}
