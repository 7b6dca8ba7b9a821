package seccompagent

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// TestNapitapdReadsAVMMsSyscallWithoutCAPDACOVERRIDE: /proc/TID/syscall,
// by which the agent confirms a notification, is mode 0400 and the VMM's
// uid's; the DaemonSet's napitapd, root without CAP_DAC_OVERRIDE or
// CAP_DAC_READ_SEARCH, must still read it (as its owner).
func TestNapitapdReadsAVMMsSyscallWithoutCAPDACOVERRIDE(t *testing.T) {
	nstest.RequireRoot(t)
	vmm := exec.Command("sleep", "30")
	vmm.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vmm.Process.Kill(); _ = vmm.Wait() })
	path := "/proc/" + strconv.Itoa(vmm.Process.Pid) + "/syscall"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if b, _ := os.ReadFile(path); len(b) > 0 && !strings.HasPrefix(string(b), "running") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("sleep never slept")
		}
	}

	reader := exec.Command(os.Args[0], "-test.run=^$")
	reader.Env = append(os.Environ(), helperEnv+"=read-syscall", specEnv+"="+strconv.Itoa(vmm.Process.Pid))
	out, err := nstest.AsRootWithout(t, reader, "dac_override", "dac_read_search").Output()
	if err != nil {
		t.Fatalf("readSyscall of a uid-65534 process, without CAP_DAC_OVERRIDE: %v (%s)", err, exitText(err))
	}
	if f := strings.Fields(string(out)); len(f) < 4 || f[0] != strconv.Itoa(unix.SYS_CLOCK_NANOSLEEP) {
		t.Errorf("/proc/%d/syscall read %q, want clock_nanosleep (%d) and its arguments", vmm.Process.Pid, out, unix.SYS_CLOCK_NANOSLEEP)
	}
}

func exitText(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}
