package nstest

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// CaplessRoot is a command that runs name as uid 0 with every capability
// dropped from every set: the root of a pod with drop: ALL, the attacker
// of docs/threat-model.md.
func CaplessRoot(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	return AsCaplessRoot(t, exec.Command(name, args...))
}

// AsCaplessRoot makes cmd run as CaplessRoot's does, through setpriv.
func AsCaplessRoot(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	return AsRootWithout(t, cmd, "all")
}

// AsRootWithout makes cmd run as uid 0 without caps (setpriv's names:
// "dac_override", or "all") in any of its sets, through setpriv.
func AsRootWithout(t testing.TB, cmd *exec.Cmd, caps ...string) *exec.Cmd {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux): %v", err)
	}
	drop := "-" + strings.Join(caps, ",-")
	cmd.Args = append([]string{setpriv, "--inh-caps=" + drop, "--ambient-caps=" + drop, "--bounding-set=" + drop, "--", cmd.Path}, cmd.Args[1:]...)
	cmd.Path = setpriv
	return cmd
}

// CheckProcClosed fails t unless pid's fds and root are closed to
// CaplessRoot. For a pid that runs as CaplessRoot too (the holder, the
// init containers' verbs), only its not being dumpable closes them; the
// test's own root, with CAP_SYS_PTRACE, still reads them.
func CheckProcClosed(t testing.TB, pid int) {
	t.Helper()
	proc := fmt.Sprintf("/proc/%d", pid)
	for _, args := range [][]string{{"readlink", "-v", proc + "/fd/0"}, {"cat", proc + "/fd/0"}, {"readlink", "-v", proc + "/root"}, {"ls", proc + "/root/"}} {
		out, err := CaplessRoot(t, args[0], args[1:]...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "ermission denied") {
			t.Errorf("%s as root without capabilities: %v, %q; want permission denied", strings.Join(args, " "), err, out)
		}
	}
	if _, err := os.ReadDir(proc + "/fd"); err != nil {
		t.Errorf("as the test's root: %v", err)
	}
}

// AsRootInOwnUserns makes cmd run as the attacker of DESIGN.md fact 25:
// CaplessRoot's uid 0 that, before its first instruction of Go, made a
// user namespace of its own, and so shows every capability in
// /proc/PID/status while none holds outside that namespace. cmd must be a
// binary that imports internal/ownuserns (which does the unshare); set
// cmd.Env before calling.
func AsRootInOwnUserns(t testing.TB, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "NAPITAP_OWN_USERNS=1")
	return AsCaplessRoot(t, cmd)
}
