package seccompagent

// The processes these tests run: the test binary re-executed as a target
// that opens taps by name the way QEMU does (directly, or through the
// launch code path under the filter), or as a napitapd-like agent that a
// test can kill. Every tap is called napisc<something>, every netns
// napitap-seccomp-<random>.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
)

const (
	helperEnv   = "NAPITAP_SECCOMP_HELPER" // "launch", "target" or "agent"
	specEnv     = "NAPITAP_SECCOMP_SPEC"
	socketEnv   = "NAPITAP_SECCOMP_SOCKET"
	netnsEnv    = "NAPITAP_SECCOMP_NETNS"
	flagsEnv    = "NAPITAP_SECCOMP_FILTER_FLAGS"
	registryEnv = "NAPITAP_SECCOMP_REGISTRY"
	stallEnv    = "NAPITAP_SECCOMP_STALL"

	// QEMU's flags for a multiqueue tap with a vnet header.
	qemuFlags  = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE
	vnetHdrLen = 12
)

func init() {
	if os.Getenv(helperEnv) != "" {
		// TestMain runs on the main goroutine; locked here it keeps the
		// main thread, the one that enters the pod netns, installs the
		// filter and execs.
		runtime.LockOSThread()
	}
}

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "launch":
		os.Exit(runLauncher())
	case "target":
		os.Exit(runTarget())
	case "agent":
		os.Exit(runAgent())
	case "read-syscall":
		pid, _ := strconv.Atoi(os.Getenv(specEnv))
		b, err := readSyscall(uint32(pid))
		if err != nil {
			fmt.Fprintln(os.Stderr, "readSyscall:", err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
		os.Exit(0)
	case "launch-sleep":
		err := Launch(os.Getenv(socketEnv), []string{"sleep", "30"}, os.Environ())
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(3)
	case "flood":
		os.Exit(runFlood())
	case "launch-true":
		// napitapctl launch -- true: the filter, the hand-over, the exec.
		err := Launch(os.Getenv(socketEnv), []string{"true"}, os.Environ())
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(3)
	}
	fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
	os.Exit(2)
}

func enterNetns(path string) error {
	if path == "" {
		return nil
	}
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Setns(fd, unix.CLONE_NEWNET)
}

// runLauncher is `napitapctl launch` re-running this binary as the target.
func runLauncher() int {
	if err := enterNetns(os.Getenv(netnsEnv)); err != nil {
		fmt.Fprintln(os.Stderr, "launcher: setns:", err)
		return 3
	}
	flags := uintptr(filterFlags)
	if s := os.Getenv(flagsEnv); s != "" {
		v, _ := strconv.ParseUint(s, 0, 32)
		flags = uintptr(v)
	}
	env := append(slices.DeleteFunc(os.Environ(), func(e string) bool { return strings.HasPrefix(e, helperEnv+"=") }), helperEnv+"=target")
	err := launch(os.Getenv(socketEnv), []string{os.Args[0]}, env, flags)
	fmt.Fprintln(os.Stderr, "launcher:", err)
	return 3
}

// targetSpec is what a target does, in this order.
type targetSpec struct {
	Netns  string // entered first; also where the probe runs
	Tap    string
	Queues int
	Flags  uint16
	// Drop to these credentials after opening /dev/net/tun (0600 here)
	// and before TUNSETIFF, as a runtime that opened it as root would.
	UID, GID *int
	Groups   []int
	Again    bool // TUNSETIFF once more on the first queue
	Probe    bool // GRO probe on the last queue
	// Count the tap's threaded-NAPI kernel threads while the queues are
	// attached.
	Threads bool
	// Cycles of TUNSETIFF, TUNGETIFF, close (on fds opened with the
	// queues') before the queues, each TUNSETIFF timed.
	Cycles int
	// Wait for this file to exist before the first TUNSETIFF.
	Wait string
}

type targetResult struct {
	Errnos    []int    // TUNSETIFF per queue: 0 or the errno
	Flags     []uint16 // TUNGETIFF per queue where attached
	Again     int      // errno of the repeated TUNSETIFF
	Merged    bool
	SKBLens   []int
	CycleNAPI int // cycles whose queue reported IFF_NAPI
	// CycleNotPersistent counts cycles whose TUNSETIFF attached a tap
	// without IFF_PERSIST: one it made, not napitap's.
	CycleNotPersistent int
	CycleErrs          []int   // errnos of cycles that failed
	CycleNanos         []int64 // each cycle's TUNSETIFF
	NAPIThreads        int     // kernel threads "napi/<tap>-<id>"
}

func errnoOf(err error) int {
	var e unix.Errno
	if errors.As(err, &e) {
		return int(e)
	}
	if err != nil {
		return -1
	}
	return 0
}

func setIff(fd int, name string, flags uint16) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(flags)
	return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
}

func getIff(fd int) (uint16, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return 0, err
	}
	err = unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr)
	return ifr.Uint16(), err
}

func openTun() (int, error) {
	return unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
}

func runTarget() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "target: "+format+"\n", a...)
		return 2
	}
	// A handler, not the default: SIGURG must interrupt the blocked
	// ioctl in the signal-storm test (the runtime's own handler does).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGURG)
	var spec targetSpec
	if err := json.Unmarshal([]byte(os.Getenv(specEnv)), &spec); err != nil {
		return fail("spec: %v", err)
	}
	if err := enterNetns(spec.Netns); err != nil {
		return fail("setns %s: %v", spec.Netns, err)
	}
	var res targetResult
	// Opened before the credentials drop, as the queues' fds are.
	cycleFDs := make([]int, spec.Cycles)
	for i := range cycleFDs {
		fd, err := openTun()
		if err != nil {
			return fail("open: %v", err)
		}
		cycleFDs[i] = fd
	}
	fds := make([]int, spec.Queues)
	for i := range fds {
		fd, err := openTun()
		if err != nil {
			return fail("open: %v", err)
		}
		fds[i] = fd
	}
	if spec.UID != nil {
		groups := spec.Groups
		if groups == nil {
			groups = []int{}
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fail("setgroups: %v", err)
		}
		if err := syscall.Setresgid(*spec.GID, *spec.GID, *spec.GID); err != nil {
			return fail("setresgid: %v", err)
		}
		if err := syscall.Setresuid(*spec.UID, *spec.UID, *spec.UID); err != nil {
			return fail("setresuid: %v", err)
		}
	}
	for spec.Wait != "" {
		if _, err := os.Stat(spec.Wait); err == nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, fd := range cycleFDs {
		start := time.Now()
		err := setIff(fd, spec.Tap, spec.Flags)
		res.CycleNanos = append(res.CycleNanos, time.Since(start).Nanoseconds())
		if err != nil {
			res.CycleErrs = append(res.CycleErrs, errnoOf(err))
		} else if f, err := getIff(fd); err == nil {
			if f&unix.IFF_NAPI != 0 {
				res.CycleNAPI++
			}
			if f&unix.IFF_PERSIST == 0 {
				res.CycleNotPersistent++
			}
		}
		unix.Close(fd)
	}
	for _, fd := range fds {
		err := setIff(fd, spec.Tap, spec.Flags)
		res.Errnos = append(res.Errnos, errnoOf(err))
		var f uint16
		if err == nil {
			f, _ = getIff(fd)
		}
		res.Flags = append(res.Flags, f)
	}
	if spec.Again && len(fds) > 0 {
		res.Again = errnoOf(setIff(fds[0], spec.Tap, spec.Flags))
	}
	if spec.Probe && len(fds) > 0 && res.Errnos[len(fds)-1] == 0 {
		q := os.NewFile(uintptr(fds[len(fds)-1]), "queue")
		pr, err := napiprobe.Run(spec.Netns, spec.Tap, q, vnetHdrLen, 16, 1000)
		if err != nil {
			return fail("probe: %v", err)
		}
		res.Merged, res.SKBLens = pr.Merged(), pr.SKBLens
	}
	if spec.Threads {
		res.NAPIThreads = napiThreads(spec.Tap)
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return fail("%v", err)
	}
	return 0
}

// napiThreads counts the kernel threads of tap's threaded NAPI instances,
// named "napi/<tap>-<napi id>".
func napiThreads(tap string) int {
	ents, _ := os.ReadDir("/proc")
	n := 0
	for _, e := range ents {
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err == nil && strings.HasPrefix(string(comm), "napi/"+tap+"-") {
			n++
		}
	}
	return n
}

// registryEntry is one managed tap of a helper agent.
type registryEntry struct {
	Netns  string
	Tap    string
	Target Target
}

// runAgent is a napitapd that only serves the seccomp socket. With
// stallEnv set it decides, says "stalled" and never answers.
func runAgent() int {
	fail := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "agent: "+format+"\n", a...)
		return 2
	}
	runtime.UnlockOSThread()
	var entries []registryEntry
	if err := json.Unmarshal([]byte(os.Getenv(registryEnv)), &entries); err != nil {
		return fail("registry: %v", err)
	}
	reg := &MapRegistry{}
	for _, e := range entries {
		id, err := tapsetup.NetnsID(e.Netns)
		if err != nil {
			return fail("%v", err)
		}
		reg.Set(id, e.Tap, e.Target)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	agent, err := New(reg, logger, Options{})
	if err != nil {
		return fail("%v", err)
	}
	if os.Getenv(stallEnv) != "" {
		agent.mu.Lock()
		agent.beforeReply = func(int, bool) {
			fmt.Println("stalled")
			select {}
		}
		agent.mu.Unlock()
	}
	l, err := Listen(os.Getenv(socketEnv), 0o600, -1)
	if err != nil {
		return fail("%v", err)
	}
	fmt.Println("ready")
	if err := NewServer(agent, logger, Limits{}).Serve(context.Background(), l); err != nil {
		return fail("%v", err)
	}
	return 0
}

// ---------------------------------------------------------------------------
// The test's side.

// helperCmd prepares the test binary as helper mode with env.
func helperCmd(ctx context.Context, mode string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode}, env...)...)
	cmd.WaitDelay = time.Second
	return cmd
}

// targetCmd runs spec natively (socket "") or through the launch code
// path under the filter, served by the agent at socket.
func targetCmd(ctx context.Context, t testing.TB, spec targetSpec, socket string, flags uintptr) *exec.Cmd {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	if socket == "" {
		return helperCmd(ctx, "target", specEnv+"="+string(b))
	}
	return helperCmd(ctx, "launch", specEnv+"="+string(b), socketEnv+"="+socket,
		netnsEnv+"="+spec.Netns, flagsEnv+"="+strconv.FormatUint(uint64(flags), 10))
}

func decodeTarget(t testing.TB, cmd *exec.Cmd, out []byte, err error, stderr string) targetResult {
	t.Helper()
	if err != nil {
		t.Fatalf("target: %v\nstdout: %s\nstderr: %s", err, out, stderr)
	}
	var res targetResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("target output %q: %v (stderr: %s)", out, err, stderr)
	}
	return res
}

// runTargetProc runs one target to its end, within 30 s.
func runTargetProc(t testing.TB, spec targetSpec, socket string) targetResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second*nstest.TimeScale())
	defer cancel()
	cmd := targetCmd(ctx, t, spec, socket, filterFlags)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	return decodeTarget(t, cmd, out, err, stderr.String())
}

// logBuf keeps the agent's log for assertions and shows it in t.Log.
type logBuf struct {
	mu   sync.Mutex
	t    testing.TB
	buf  bytes.Buffer
	done bool
}

func (w *logBuf) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *logBuf) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// testAgent is napitapd's agent and socket, in this process.
type testAgent struct {
	agent  *Agent
	reg    *MapRegistry
	socket string
	log    *logBuf
	stop   func()
}

func startAgent(t testing.TB, level slog.Level) *testAgent {
	t.Helper()
	return startAgentConns(t, level, Limits{})
}

// startAgentConns is startAgent with a bound on connections at once.
func startAgentConns(t testing.TB, level slog.Level, lim Limits) *testAgent {
	t.Helper()
	w := &logBuf{t: t}
	logger := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
	reg := &MapRegistry{}
	agent, err := New(reg, logger, Options{})
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(t.TempDir(), "seccomp.sock")
	l, err := Listen(socket, 0o600, -1)
	if err != nil {
		agent.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- NewServer(agent, logger, lim).Serve(context.Background(), l) }()
	var once sync.Once
	ta := &testAgent{agent: agent, reg: reg, socket: socket, log: w}
	ta.stop = func() {
		once.Do(func() {
			l.Close()
			if err := <-done; err != nil {
				t.Errorf("Serve: %v", err)
			}
			agent.Close()
		})
	}
	t.Cleanup(func() {
		ta.stop()
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return ta
}

// manage puts tap of netns in the agent's registry.
func (ta *testAgent) manage(t testing.TB, netns *nstest.NetNS, tap string, target Target) {
	t.Helper()
	id, err := tapsetup.NetnsID(netns.Path())
	if err != nil {
		t.Fatal(err)
	}
	if target.Key == "" {
		target.Key = "test/" + tap
	}
	ta.reg.Set(id, tap, target)
}

// waitIdle waits for every listener to be let go.
func (ta *testAgent) waitIdle(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for ta.agent.Listeners() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("agent still serves %d listeners", ta.agent.Listeners())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// tapSpec is a tap as napitap's ADD leaves it in "intercept" mode: there,
// up, with gro_flush_timeout set so the probe can see GRO, queues closed.
type tapSpec struct {
	name         string
	multiQueue   bool
	owner, group *uint32
	// threaded: threaded NAPI, ADD's default, switched on while the
	// queue ADD made is attached (DESIGN.md fact 9): each queue attached
	// with NAPI later gets a kernel thread of its own.
	threaded bool
}

func newTap(t testing.TB, netns *nstest.NetNS, s tapSpec) {
	t.Helper()
	flags := tapsetup.QueueFlags{MultiQueue: s.multiQueue, VnetHdr: true, NAPI: s.threaded}
	netns.Run(t, func() error {
		tap, queues, err := tapsetup.Create(tapsetup.Spec{Name: s.name, Queues: 1, Flags: flags, VnetHdrSize: vnetHdrLen, Owner: s.owner, Group: s.group})
		if err != nil {
			return err
		}
		if s.threaded {
			err = tapsetup.ApplyNAPIKnobsHere(s.name, tapsetup.NAPIKnobs{Threaded: true})
		}
		tapsetup.CloseQueues(queues)
		t.Cleanup(func() {
			if err := netns.Do(func(ns.NetNS) error { return tapsetup.DeleteTap(s.name, "") }); err != nil {
				t.Errorf("deleting tap %q in netns %s: %v", s.name, netns.Name, err)
			}
		})
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(tap)
	})
	gro := uint64(200_000)
	if err := tapsetup.ApplyNAPIKnobs(netns.Path(), s.name, tapsetup.NAPIKnobs{GROFlushTimeout: &gro}); err != nil {
		t.Fatal(err)
	}
}

// openFDs counts this process's open fds.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// waitFDs waits for this process's fd count to come back to want.
func waitFDs(t testing.TB, want int, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := openFDs(t)
		if got <= want {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: %d fds open, want %d", what, got, want)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// readLine reads one line from r within d.
func readLine(r *bufio.Reader, d time.Duration) (string, error) {
	type line struct {
		s   string
		err error
	}
	ch := make(chan line, 1)
	go func() {
		s, err := r.ReadString('\n')
		ch <- line{strings.TrimSpace(s), err}
	}()
	select {
	case l := <-ch:
		return l.s, l.err
	case <-time.After(d):
		return "", fmt.Errorf("no line within %v", d)
	}
}

func ptr[T any](v T) *T { return &v }
