package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
)

// mainEnv makes the test binary run main with the arguments after "--".
const mainEnv = "NAPITAP_FDSTORE_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"napitap-fdstore"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestTheHolderIsClosedToARootWithoutCAPSYSPTRACE: the holder runs as uid
// 0 with no capability and holds every listener and queue of napitapd's;
// a dumpable one would let any uid-0 process with hostPID open its fds
// through /proc/PID/fd and reach its socket through /proc/PID/root.
func TestTheHolderIsClosedToARootWithoutCAPSYSPTRACE(t *testing.T) {
	nstest.RequireRoot(t)
	socket := filepath.Join(t.TempDir(), "fdstore.sock")
	holder := exec.Command(os.Args[0], "-test.run=^$", "--", "--socket", socket)
	holder.Env = append(os.Environ(), mainEnv+"=1")
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
	proc := fmt.Sprintf("/proc/%d", holder.Process.Pid)
	for _, args := range [][]string{{"readlink", "-v", proc + "/fd/0"}, {"cat", proc + "/fd/0"}, {"readlink", "-v", proc + "/root"}, {"ls", proc + "/root/"}} {
		out, err := nstest.CaplessRoot(t, args[0], args[1:]...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "ermission denied") {
			t.Errorf("%s as root without capabilities: %v, %q; want permission denied", strings.Join(args, " "), err, out)
		}
	}
	// Root with CAP_SYS_PTRACE (the node's own) still can.
	if _, err := os.ReadDir(proc + "/fd"); err != nil {
		t.Errorf("as the test's root: %v", err)
	}
}
