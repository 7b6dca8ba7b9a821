package e2e

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

// openerEnv makes the re-executed test binary a process that, under the
// same napitapctl launch as QEMU, opens one more queue of the tap by name
// once a file appears, and probes it for NAPI (openerSpec, JSON).
const openerEnv = "NAPITAP_E2E_OPENER"

type openerSpec struct {
	Tap, Wait, Out string
}

type openerResult struct {
	Err    string
	Flags  uint16
	Merged bool
	Probe  string
}

func init() {
	if spec := os.Getenv(openerEnv); spec != "" {
		// Before TestMain, which builds binaries.
		os.Exit(runOpener(spec))
	}
}

func runOpener(specJSON string) int {
	var spec openerSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		return 2
	}
	for {
		if _, err := os.Stat(spec.Wait); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var res openerResult
	err := func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		q := os.NewFile(uintptr(fd), "queue")
		defer q.Close()
		// As QEMU opens a queue of a multiqueue tap.
		ifr, err := unix.NewIfreq(spec.Tap)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF: %w", err)
		}
		if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
			return fmt.Errorf("TUNGETIFF: %w", err)
		}
		res.Flags = ifr.Uint16()
		pr, err := napiprobe.RunQueue(q, 16, 1000)
		res.Merged, res.Probe = pr.Merged(), pr.String()
		return err
	}()
	if err != nil {
		res.Err = err.Error()
	}
	b, _ := json.Marshal(res)
	_ = os.WriteFile(spec.Out, b, 0o600)
	return 0
}

// startNext starts another napitapd on d's paths and flags, in d's
// netns (the node's, as the next pod of the DaemonSet, or d's container
// restarted), logging to name beside d's log, and stops it when the test
// ends. It returns the log's path.
func startNext(t *testing.T, d *crihelp.Napitapd, name string) string {
	t.Helper()
	logPath := filepath.Join(filepath.Dir(d.LogPath), name)
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(binDir, "napitapd"), append([]string{"--socket", d.Socket, "--state-dir", d.StateDir, "--seccomp-socket", d.SeccompSocket}, d.Flags...)...)
	if d.Netns != "" {
		cmd = exec.Command("nsenter", append([]string{"--net=" + d.Netns, "--"}, cmd.Args...)...)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("%s:\n%s", name, crihelp.Tail(string(b), 4000))
		}
	})
	return logPath
}

// opener is a process beside QEMU under the same napitapctl launch that
// opens one more queue of the tap by name when told (runOpener).
type opener struct{ dir string }

// bootQEMUWithOpener boots QEMU opening b.Tap by name under napitapctl
// launch, with an opener beside it (one launch, one filter, one
// listener), and waits until napitapd attached QEMU's 2 queues.
func bootQEMUWithOpener(t *testing.T, b bootSpec) (guestVM, *opener) {
	t.Helper()
	o := &opener{dir: t.TempDir()}
	spec, _ := json.Marshal(openerSpec{Tap: b.Tap, Wait: filepath.Join(o.dir, "open"), Out: filepath.Join(o.dir, "opened.json")})
	argv := append([]string{filepath.Join(binDir, "napitapctl"), "launch", "--seccomp-socket", b.Daemon.SeccompSocket, "--",
		"nsenter", "--net=" + b.TapNetns.Path(), "--",
		"sh", "-c", `env ` + openerEnv + `="$1" "$2" -test.run='^$' & shift 2; exec "$@"`, "sh", string(spec), os.Args[0]},
		vm.QEMUArgs(b.Kernel, b.Initrd, byNameNetdev(b.Tap), 2, b.Guest, b.Serial, true)...)
	v := startVM(t, argv, b.Serial)
	err := crihelp.Poll(30*time.Second, func() error {
		if n := agentAttaches(t, b.Daemon); n < 2 {
			return fmt.Errorf("napitapd attached %d of QEMU's 2 queues", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return v, o
}

// open tells the opener to open its queue.
func (o *opener) open(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(o.dir, "open"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// finished: the opener wrote its result.
func (o *opener) finished() bool {
	_, err := os.Stat(filepath.Join(o.dir, "opened.json"))
	return err == nil
}

// result waits for what the opener saw of the queue it opened when.
func (o *opener) result(t *testing.T, when string) openerResult {
	t.Helper()
	var r openerResult
	err := crihelp.Poll(30*time.Second, func() error {
		out, err := os.ReadFile(filepath.Join(o.dir, "opened.json"))
		if err == nil {
			err = json.Unmarshal(out, &r)
		}
		return err
	})
	if err != nil {
		t.Fatalf("the queue opened %s: %v", when, err)
	}
	return r
}

// check wants the queue opened when a NAPI queue that GRO merges in.
func (r openerResult) check(t *testing.T, when string) {
	t.Helper()
	if r.Err != "" || r.Flags&unix.IFF_NAPI == 0 || !r.Merged {
		t.Errorf("queue opened by name %s: %+v; want IFF_NAPI and merged", when, r)
	} else {
		t.Logf("queue opened by name %s: flags 0x%x, %s", when, r.Flags, r.Probe)
	}
}

// takeOver starts a second napitapd on d's paths, waits for d to exit 0
// and returns the second's log path. d's process stays unreaped for
// crihelp's clean-up.
func takeOver(t *testing.T, d *crihelp.Napitapd) string {
	t.Helper()
	start := time.Now()
	logPath := startNext(t, d, "napitapd-second.log")
	// WNOWAIT: the status without reaping, which crihelp's clean-up does.
	var info unix.Siginfo
	exited := make(chan error, 1)
	go func() { exited <- unix.Waitid(unix.P_PID, d.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil) }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("waitid napitapd %d: %v", d.Pid, err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the first napitapd did not exit after the takeover:\n%s", d.ReadLog())
	}
	// si_status follows si_pid and si_uid (x86-64 and arm64 layout).
	status := int32(binary.NativeEndian.Uint32((*[128]byte)(unsafe.Pointer(&info))[24:]))
	if code := info.Code; code != 1 /* CLD_EXITED */ || status != 0 {
		t.Fatalf("the first napitapd ended with si_code %d status %d, want exit 0:\n%s", code, status, d.ReadLog())
	}
	var took []string
	err := crihelp.Poll(5*time.Second, func() error {
		b, _ := os.ReadFile(logPath)
		if took = regexp.MustCompile(`tookOver=true took=(\S+)`).FindStringSubmatch(string(b)); took == nil {
			return fmt.Errorf("the second napitapd does not serve after a takeover:\n%s", b)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("takeover: %s from request to serving; the first exited %v after the second started", took[1], time.Since(start).Round(time.Millisecond))
	return logPath
}

// TestATakeoverUnderARunningGuestLosesNothing: a second napitapd takes
// over from the first while a guest runs; its queues and traffic carry on
// through NAPI, and what the runtime asks after reaches the second.
func TestATakeoverUnderARunningGuestLosesNothing(t *testing.T) {
	t.Run("QEMU by name under napitapctl launch keeps its NAPI queues, and a queue opened by name after the takeover gets NAPI through the same listener", func(t *testing.T) {
		var secondLog string
		var opened openerResult
		r := runGuestTraffic(t, guestNet{handoff: config.HandoffIntercept}, func(t *testing.T, b bootSpec) guestVM {
			v, o := bootQEMUWithOpener(t, b)
			secondLog = takeOver(t, b.Daemon)
			o.open(t)
			opened = o.result(t, "after the takeover")
			return v
		})
		opened.check(t, "after the takeover")
		if !r.merged() {
			t.Errorf("the guest's segments after the takeover were not merged (longest frame %d)", r.maxLen)
		}
		if r.agentAttaches != 2 {
			t.Errorf("the first napitapd attached %d queues, want QEMU's 2", r.agentAttaches)
		}
		b, _ := os.ReadFile(secondLog)
		if n := strings.Count(string(b), "attached the caller's queue with NAPI"); n != 1 {
			t.Errorf("the second napitapd attached %d queues, want the opener's 1", n)
		}
	})
	t.Run("a guest on held queues fetched from the napitapd that took over sends through NAPI", func(t *testing.T) {
		r := runGuestTraffic(t, guestNet{handoff: config.HandoffFDs}, func(t *testing.T, b bootSpec) guestVM {
			takeOver(t, b.Daemon)
			return bootQEMUOnFetchedFds(t, b)
		})
		if !r.merged() {
			t.Errorf("GRO merged nothing of the guest on queues fetched after the takeover (longest frame %d)", r.maxLen)
		}
	})
}
