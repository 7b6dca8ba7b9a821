package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/uffdtest"
	"github.com/napitap/napitap/pkg/daemon"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// stallEnv makes the re-executed test binary launch itself under the
// filter against the seccomp socket it names, as a stalledCaller
// (stalledEnv).
const (
	stallEnv   = "NAPITAPD_TEST_STALL"
	stalledEnv = "NAPITAPD_TEST_STALLED"
)

func init() {
	if socket := os.Getenv(stallEnv); socket != "" {
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, stallEnv+"=") })
		err := seccompagent.Launch(socket, []string{os.Args[0], "-test.run=^$"}, append(env, stalledEnv+"=1"))
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
	if os.Getenv(stalledEnv) != "" {
		os.Exit(stalledCaller())
	}
}

// stalledCaller, under napitapd's filter, makes a TUNSETIFF whose ifreq
// lies on a userfaultfd page it never fills, on a thread of its own; then,
// for each line on stdin, makes a tap of its own in a netns of its own (the
// agent gives a launched tree's own taps NAPI) and prints its flags.
func stalledCaller() int {
	page, err := uffdtest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, "stalled caller:", err)
		return 2
	}
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			fmt.Fprintln(os.Stderr, "stalled caller:", err)
			os.Exit(2)
		}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, page.Addr)
		fmt.Fprintln(os.Stderr, "stalled caller: the stalled TUNSETIFF returned:", errno)
		os.Exit(2)
	}()
	in := bufio.NewScanner(os.Stdin)
	for i := 0; in.Scan(); i++ {
		flags, err := ownTap(fmt.Sprintf("napistall%d", i))
		fmt.Printf("flags=0x%x err=%v\n", flags, err)
	}
	return 0
}

// ownTap makes tap name in a netns of its own, on a thread that ends with
// it, and returns its TUNGETIFF flags.
func ownTap(name string) (flags uint16, err error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // never unlocked: the thread ends with its netns
		if err = unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return
		}
		var fd int
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return
		}
		defer unix.Close(fd)
		ifr, _ := unix.NewIfreq(name)
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err == nil {
			err = unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr)
			flags = ifr.Uint16()
		}
	}()
	<-done
	return flags, err
}

// stalled is a stalledCaller of the test's.
type stalled struct {
	in  io.Writer
	out *bufio.Reader
}

// startStalledCaller launches a stalledCaller against seccomp and waits
// for napitapd pid to be reading its ifreq; it is killed when the test
// ends.
func startStalledCaller(t *testing.T, seccomp string, pid int) *stalled {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stallEnv+"="+seccomp)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); !uffdtest.ThreadIn(pid, unix.SYS_PROCESS_VM_READV); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("napitapd pid %d never read the stalled caller's ifreq", pid)
		}
	}
	return &stalled{in: in, out: bufio.NewReader(out)}
}

// ownTap has the stalled caller make a tap of its own, and returns what
// it printed.
func (s *stalled) ownTap(t *testing.T) string {
	t.Helper()
	if _, err := io.WriteString(s.in, "tap\n"); err != nil {
		t.Fatal(err)
	}
	line, err := readLineWithin(s.out, 10*time.Second)
	if err != nil {
		t.Fatalf("the stalled caller making a tap of its own: %v", err)
	}
	return line
}

func readLineWithin(r *bufio.Reader, d time.Duration) (string, error) {
	ch := make(chan string, 1)
	go func() { s, _ := r.ReadString('\n'); ch <- strings.TrimSpace(s) }()
	select {
	case s := <-ch:
		return s, nil
	case <-time.After(d):
		return "", fmt.Errorf("no line within %v", d)
	}
}

// TestATakeoverIsNotHeldUpByACallerThatStallsTheAgentsRead: a launched
// process whose TUNSETIFF has its ifreq on a userfaultfd page nobody fills
// keeps napitapd's read of it waiting in the kernel; a second napitapd
// still takes everything over at once, the first exits 0, and the
// listener it handed over is served by the second (the caller's next
// TUNSETIFF gets NAPI).
func TestATakeoverIsNotHeldUpByACallerThatStallsTheAgentsRead(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	p := paths{dir + "/napitapd.sock", dir + "/seccomp.sock", dir + "/state"}
	first := startNapitapdProc(t, p)
	waitFile(t, p.socket)
	waitFile(t, p.seccomp)
	caller := startStalledCaller(t, p.seccomp, first.cmd.Process.Pid)

	start := time.Now()
	second := startNapitapdProc(t, p)
	first.waitExit(t, daemon.StopGrace, "the first napitapd, taken over")
	t.Logf("the first napitapd exited %v after the second started", time.Since(start).Round(time.Millisecond))
	// The second logs that it serves once the first has handed over, which
	// may be after the first is gone.
	for deadline := time.Now().Add(daemon.StopGrace); !regexp.MustCompile(`tookOver=true`).MatchString(second.log.String()); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the second napitapd did not take over:\n%s", second.log)
		}
	}
	if n := seccompListeners(t, second.cmd.Process.Pid); n != 1 {
		t.Errorf("the second napitapd holds %d seccomp listeners, want 1", n)
	}
	line := caller.ownTap(t)
	var flags uint16
	if _, err := fmt.Sscanf(line, "flags=0x%x err=<nil>", &flags); err != nil || flags&unix.IFF_NAPI == 0 {
		t.Errorf("the stalled caller's own tap after the takeover: %q; want IFF_NAPI from the second napitapd", line)
	}
}
