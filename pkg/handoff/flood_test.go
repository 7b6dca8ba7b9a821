package handoff_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/handoff"
)

// ---------------------------------------------------------------------------
// 8. Connection floods, against napitapd the binary: its RSS and fds are
// measured from /proc/<pid>.

const (
	// daemonSetMemoryLimit is napitapd's memory limit in deploy/base.
	daemonSetMemoryLimit = 64 << 20
	floodSocketGroup     = 4243
	floodUID             = 65534 // nobody, a member of the socket group here
)

// napitapd is the binary, run as a child process.
type napitapd struct {
	pid    int
	socket string
	stderr *syncbuf.Buffer
	exited chan struct{}
}

// startNapitapd builds cmd/napitapd and runs it on a 0660 socket of group
// floodSocketGroup, under the DaemonSet's GOMEMLIMIT, until the test ends.
func startNapitapd(t *testing.T, args ...string) *napitapd {
	t.Helper()
	bin, err := cnitest.Build("github.com/napitap/napitap/cmd/napitapd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bin) })
	d := &napitapd{socket: filepath.Join(sharedSockDir(t), "napitapd.sock"), stderr: &syncbuf.Buffer{}, exited: make(chan struct{})}
	cmd := exec.Command(filepath.Join(bin, "napitapd"), append([]string{
		"--socket", d.socket, "--socket-mode", "0660", "--socket-group", strconv.Itoa(floodSocketGroup),
		"--state-dir", filepath.Join(t.TempDir(), "state"), "--sweep-interval", "1h",
		"--seccomp-socket", filepath.Join(filepath.Dir(d.socket), "seccomp.sock"),
	}, args...)...)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=48MiB")
	cmd.Stderr = d.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d.pid = cmd.Process.Pid
	go func() { _ = cmd.Wait(); close(d.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-d.exited
		}
		if t.Failed() {
			t.Logf("napitapd's log:\n%s", d.stderr.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := d.client().List(); err == nil {
			return d
		} else if time.Now().After(deadline) || !d.alive() {
			t.Fatalf("napitapd does not answer: %v\n%s", err, d.stderr.String())
		}
	}
}

func (d *napitapd) client() *handoff.Client {
	return &handoff.Client{Socket: d.socket, Timeout: 10 * time.Second}
}

func (d *napitapd) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// fds counts napitapd's open fds, and those of them that are tap queues.
func (d *napitapd) fds(t testing.TB) (all, queues int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", d.pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("napitapd: %v", err)
	}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && target == "/dev/net/tun" {
			queues++
		}
	}
	return len(ents), queues
}

// settledFDs is fds once the count has stayed the same for 100 ms: the
// server's end of a connection closes just after the client's.
func (d *napitapd) settledFDs(t testing.TB) (all, queues int) {
	t.Helper()
	all, queues = d.fds(t)
	for same, deadline := 0, time.Now().Add(3*time.Second); same < 10 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		if n, q := d.fds(t); n == all {
			same++
		} else {
			all, queues, same = n, q, 0
		}
	}
	return all, queues
}

// memory is napitapd's RSS now and at its peak, in bytes.
func (d *napitapd) memory(t testing.TB) (rss, peak int64) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid))
	if err != nil {
		t.Fatalf("napitapd: %v", err)
	}
	for line := range strings.Lines(string(b)) {
		name, value, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		switch name {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			peak = kb << 10
		}
	}
	return rss, peak
}

// logLines counts the lines of napitapd's log that contain s.
func (d *napitapd) logLines(s string) int {
	return strings.Count(d.stderr.String(), s)
}

// waitFDs waits until napitapd has at most want fds open and returns how
// many it has.
func (d *napitapd) waitFDs(t testing.TB, want int) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, _ := d.fds(t)
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// ---------------------------------------------------------------------------
// The flooding peer: the test binary run again, as uid floodUID.

const floodEnv = "NAPITAP_HANDOFF_FLOOD"

type floodReport struct {
	Uid, Gid  int
	Idle      int // connections opened and left idle
	Open      int // of those, the ones napitapd did not hang up
	Attempts  int // further connections, each closed at once
	Connected int // of those, the ones connect(2) completed
	Millis    int64
	Err       string
}

// flooder is a running flooding peer. It opens its idle connections, then
// waits for churn() to make its attempts, then for stop() to close them.
type flooder struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	stder *syncbuf.Buffer
}

// startFlooder starts the flooding peer as uid floodUID, or with
// caplessRoot as uid 0 without any capability (a pod's root).
func startFlooder(t *testing.T, socket string, idle, attempts int, caplessRoot bool) (*flooder, floodReport) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$")
	uid, gid := floodUID, floodSocketGroup
	if caplessRoot {
		cmd, uid, gid = nstest.AsCaplessRoot(t, cmd), 0, 0
	}
	cmd.Env = append(os.Environ(), floodEnv+"=1", "NAPITAP_FLOOD_SOCKET="+socket,
		fmt.Sprintf("NAPITAP_FLOOD_IDLE=%d", idle), fmt.Sprintf("NAPITAP_FLOOD_ATTEMPTS=%d", attempts),
		fmt.Sprintf("NAPITAP_FLOOD_UID=%d", uid), fmt.Sprintf("NAPITAP_FLOOD_GID=%d", gid))
	f := &flooder{cmd: cmd, stder: &syncbuf.Buffer{}}
	cmd.Stderr = f.stder
	var err error
	if f.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f.out = bufio.NewScanner(stdout)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.in.Close(); _ = cmd.Wait() })
	return f, f.report(t)
}

func (f *flooder) report(t *testing.T) floodReport {
	t.Helper()
	r, err := f.read()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// read is report for any goroutine.
func (f *flooder) read() (floodReport, error) {
	var r floodReport
	if !f.out.Scan() {
		return r, fmt.Errorf("flooding peer: no report (%v); stderr: %s", f.out.Err(), f.stder.String())
	}
	if err := json.Unmarshal(f.out.Bytes(), &r); err != nil || r.Err != "" {
		return r, fmt.Errorf("flooding peer: %q: %v %s; stderr: %s", f.out.Bytes(), err, r.Err, f.stder.String())
	}
	return r, nil
}

func (f *flooder) churn(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(f.in, "churn\n"); err != nil {
		t.Fatal(err)
	}
}

// stop makes the peer close its connections and exit.
func (f *flooder) stop(t *testing.T) {
	t.Helper()
	f.in.Close()
	if err := f.cmd.Wait(); err != nil {
		t.Fatalf("flooding peer: %v; stderr: %s", err, f.stder.String())
	}
}

// dropTo makes this process uid and gid, with no supplementary groups.
func dropTo(uid, gid int) error {
	if err := syscall.Setgroups([]int{}); err != nil {
		return fmt.Errorf("setgroups: %w", err)
	}
	if err := syscall.Setresgid(gid, gid, gid); err != nil {
		return fmt.Errorf("setresgid %d: %w", gid, err)
	}
	if err := syscall.Setresuid(uid, uid, uid); err != nil {
		return fmt.Errorf("setresuid %d: %w", uid, err)
	}
	return nil
}

// runFlood is the flooding peer's main.
func runFlood() int {
	out := json.NewEncoder(os.Stdout)
	fail := func(format string, a ...any) int {
		_ = out.Encode(floodReport{Err: fmt.Sprintf(format, a...)})
		return 2
	}
	socket := os.Getenv("NAPITAP_FLOOD_SOCKET")
	idle, err1 := strconv.Atoi(os.Getenv("NAPITAP_FLOOD_IDLE"))
	attempts, err2 := strconv.Atoi(os.Getenv("NAPITAP_FLOOD_ATTEMPTS"))
	uid, err3 := strconv.Atoi(os.Getenv("NAPITAP_FLOOD_UID"))
	gid, err4 := strconv.Atoi(os.Getenv("NAPITAP_FLOOD_GID"))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return fail("environment: %v", err)
	}
	// The binary lives in a directory only root may enter, so the peer
	// starts as root and drops to uid/gid before it connects (a capless
	// root stays who it is).
	if uid != 0 {
		if err := dropTo(uid, gid); err != nil {
			return fail("%v", err)
		}
	}
	rep := floodReport{Uid: os.Getuid(), Gid: os.Getgid()}

	fds := make([]int, 0, idle)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for range idle {
		fd, err := dialSeqpacket(socket)
		if err != nil {
			return fail("connection %d: %v", len(fds)+1, err)
		}
		fds = append(fds, fd)
	}
	rep.Idle, rep.Open = len(fds), notHungUp(fds)
	if err := out.Encode(rep); err != nil {
		return 2
	}

	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return 0
	}
	rep = floodReport{Uid: os.Getuid(), Gid: os.Getgid(), Attempts: attempts}
	start := time.Now()
	var next, connected atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for next.Add(1) <= int64(attempts) {
				fd, err := dialSeqpacket(socket)
				if err != nil {
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				connected.Add(1)
				unix.Close(fd)
			}
		})
	}
	wg.Wait()
	rep.Connected, rep.Millis = int(connected.Load()), time.Since(start).Milliseconds()
	if rep.Connected == 0 {
		rep.Err = fmt.Sprintf("no connection out of %d: %v", attempts, firstErr.Load())
	}
	if err := out.Encode(rep); err != nil {
		return 2
	}
	for in.Scan() {
	}
	return 0
}

// dialSeqpacket connects to socket with plain syscalls: nothing of the Go
// runtime per connection. A connect that napitapd's full backlog holds up
// gives up after 2 s.
func dialSeqpacket(socket string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 2}); err != nil {
		unix.Close(fd)
		return -1, err
	}
	for {
		err = unix.Connect(fd, &unix.SockaddrUnix{Name: socket})
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// notHungUp counts the connections of fds that napitapd keeps open, once
// it has dealt with every one: the count has not changed for 500 ms.
func notHungUp(fds []int) int {
	pfds := make([]unix.PollFd, len(fds))
	for i, fd := range fds {
		pfds[i] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}
	}
	count := func() int {
		_, _ = unix.Poll(pfds, 0)
		n := 0
		for _, p := range pfds {
			if p.Revents&(unix.POLLHUP|unix.POLLRDHUP|unix.POLLERR) == 0 {
				n++
			}
		}
		return n
	}
	last, same := count(), 0
	for deadline := time.Now().Add(10 * time.Second); same < 25 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		if n := count(); n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// ---------------------------------------------------------------------------

// TestConnectionFloodFromTheSocketGroup: a member of the socket group that
// is not root opens 1,000 connections and leaves them idle, then makes
// 10,000 more connection attempts. napitapd keeps to its limits, keeps every
// queue it holds, still answers a fetch within 100 ms, lets another uid
// fetch, and gives its fds back when the flood ends.
func TestConnectionFloodFromTheSocketGroup(t *testing.T) {
	nstest.RequireRoot(t)
	const idle, attempts = 1000, 10000
	d := startNapitapd(t)
	c := d.client()
	pod := nstest.New(t, "handoff")

	// held is never fetched: nothing may happen to its queues. fetched is
	// fetched by root during the flood, vmm by a VMM of uid 107.
	held := handoff.Key{ContainerID: "flood-held", IfName: "net1"}
	fetched := handoff.Key{ContainerID: "flood-fetched", IfName: "net1"}
	vmm := handoff.Key{ContainerID: "flood-vmm", IfName: "net1"}
	registerNew(t, c, pod, held, "napihofh", 4)
	registerNew(t, c, pod, fetched, "napihoff", 4)
	const owner = 107
	register(t, c, withOwner(attachmentFor(pod, vmm, "net-a", "napihofv", 2), owner, owner),
		newTap(t, pod, "napihofv", 2, ptr[uint32](owner), ptr[uint32](owner)))

	// Root fetches fetched again and again, as a VMM that restarts does:
	// napitapd reopens its queues each time but the first.
	fetch := func(what string) time.Duration {
		t.Helper()
		start := time.Now()
		_, files, err := c.Fetch(&fetched)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		checkQueues(t, files, "napihoff", 4)
		closeFiles(files)
		return took
	}
	var before []time.Duration
	for range 4 {
		before = append(before, fetch("fetch before the flood"))
	}
	t.Logf("root's fetches before the flood took %v", before)

	fds0, queues0 := d.settledFDs(t)
	rss0, _ := d.memory(t)
	if queues0 != 6 {
		t.Fatalf("napitapd holds %d queue fds, want the 4+2 of %s and %s", queues0, held, vmm)
	}

	// The idle connections. One uid gets its limit's worth, napitapd
	// closes the rest at once.
	f, rep := startFlooder(t, d.socket, idle, attempts, false)
	if rep.Uid != floodUID || rep.Gid != floodSocketGroup {
		t.Fatalf("flooding peer ran as %d/%d", rep.Uid, rep.Gid)
	}
	fds1, _ := d.fds(t)
	rss1, _ := d.memory(t)
	t.Logf("%d idle connections: napitapd kept %d; its fds %d -> %d, RSS %s -> %s", rep.Idle, rep.Open, fds0, fds1, mib(rss0), mib(rss1))
	if rep.Open != handoff.DefaultMaxConnsPerUID {
		t.Errorf("napitapd kept %d of %d idle connections of uid %d, want its per-uid limit %d", rep.Open, rep.Idle, floodUID, handoff.DefaultMaxConnsPerUID)
	}
	// Its socket and the peer's pidfd for each connection it kept, and
	// room for a fetch on its way: a connection, reopened queues, a netns.
	maxFDs := fds0 + 2*handoff.DefaultMaxConnsPerUID + 16
	if fds1 > maxFDs {
		t.Errorf("napitapd has %d fds open with %d idle connections, want at most %d", fds1, rep.Open, maxFDs)
	}

	// Another uid still gets in while uid floodUID holds all it may.
	// As KubeVirt's qemu: uid and gid 107, in the socket group besides.
	res := runPeer(t, d.socket, helperArgs{netns: pod.Path(), uid: ptr(owner), gid: ptr(owner), groups: []int{floodSocketGroup}, op: "fetch", key: &vmm})
	if res.Code != "" || res.FDs != 2 || !res.NAPI {
		t.Errorf("the VMM of uid %d during the flood: code %q (%s), %d fds, NAPI %v; want its 2 NAPI queues", owner, res.Code, res.Err, res.FDs, res.NAPI)
	}

	// The churn, and root's fetches meanwhile.
	type result struct {
		floodReport
		err error
	}
	churned := make(chan result, 1)
	f.churn(t)
	go func() {
		r, err := f.read()
		churned <- result{r, err}
	}()
	var took []time.Duration
	peakFDs := fds1
	var churn result
	for done := false; !done || len(took) < 3; {
		select {
		case churn = <-churned:
			done = true
		default:
		}
		took = append(took, fetch(fmt.Sprintf("fetch %d during the flood", len(took)+1)))
		n, _ := d.fds(t)
		peakFDs = max(peakFDs, n)
		if len(took) == 50 && !done {
			churn, done = <-churned, true
		}
	}
	if churn.err != nil {
		t.Fatal(churn.err)
	}
	t.Logf("%d connection attempts in %d ms, %d connected; root's %d fetches meanwhile took %v; napitapd's fds peaked at %d",
		churn.Attempts, churn.Millis, churn.Connected, len(took), took, peakFDs)
	// The median: a machine shared with other work can delay any one of
	// them; napitapd being slow delays them all.
	slices.Sort(took)
	if med, limit := took[len(took)/2], 100*time.Millisecond*nstest.TimeScale(); med > limit {
		t.Errorf("a fetch during the flood took %v (median of %d), want at most %v", med, len(took), limit)
	}
	if peakFDs > maxFDs {
		t.Errorf("napitapd had %d fds open during the connection attempts, want at most %d", peakFDs, maxFDs)
	}

	f.stop(t)
	// The VMM has the 2 queues of vmm now.
	want := fds0 - 2
	fds2 := d.waitFDs(t, want)
	_, queues2 := d.fds(t)
	rss2, peak := d.memory(t)
	t.Logf("after the flood: fds %d (at the start %d, 2 of them handed off since), RSS %s, peak RSS %s", fds2, fds0, mib(rss2), mib(peak))
	if fds2 > want {
		t.Errorf("napitapd has %d fds open after the flood, want %d", fds2, want)
	}
	if queues2 != 4 {
		t.Errorf("napitapd holds %d queue fds after the flood, want the 4 of %s", queues2, held)
	}
	if a, ok := listed(t, c)[held]; !ok || a.Held != 4 {
		t.Errorf("after the flood napitapd lists %+v (present %v), want %s holding 4", a, ok, held)
	}
	checkAttached(t, pod, "napihofh", 4)
	if peak >= daemonSetMemoryLimit {
		t.Errorf("napitapd's RSS peaked at %s, over the DaemonSet's limit of %s", mib(peak), mib(daemonSetMemoryLimit))
	}
	if !d.alive() {
		t.Fatal("napitapd exited")
	}
	// About 11,000 refusals in a few seconds: one line, or two if the
	// flood crossed the log interval.
	if n := d.logLines("refused connection"); n < 1 || n > 3 {
		t.Errorf("napitapd logged %d lines about refused connections, want 1-3", n)
	}
}

// TestAFloodFromAPodsRootLeavesRoomForEveryoneElse replays security
// round 6's second attack on the hand-off socket: uid 0 without any
// capability, as a pod's root that mounts /run/napitap is, opens 300 idle
// connections. It is a tenant like any other uid: it keeps its uid's
// share, and napitapd's equal (the plugin's register) and another tenant
// are still served.
func TestAFloodFromAPodsRootLeavesRoomForEveryoneElse(t *testing.T) {
	nstest.RequireRoot(t)
	d := startNapitapd(t)
	c := d.client()
	pod := nstest.New(t, "handoff")
	const owner = 107
	vmm := handoff.Key{ContainerID: "flood-root-vmm", IfName: "net1"}

	f, rep := startFlooder(t, d.socket, 300, 0, true)
	defer f.stop(t)
	t.Logf("300 idle connections from uid %d without capabilities: napitapd kept %d", rep.Uid, rep.Open)
	if rep.Uid != 0 {
		t.Fatalf("the flooding peer ran as uid %d, want 0", rep.Uid)
	}
	if rep.Open != handoff.DefaultMaxConnsPerUID {
		t.Errorf("napitapd kept %d of the pod root's 300 idle connections, want its uid's share %d", rep.Open, handoff.DefaultMaxConnsPerUID)
	}
	// The plugin's ADD: a register by napitapd's equal.
	register(t, c, withOwner(attachmentFor(pod, vmm, "net-a", "napihofr", 2), owner, owner),
		newTap(t, pod, "napihofr", 2, ptr[uint32](owner), ptr[uint32](owner)))
	t.Cleanup(func() { _ = c.Release(vmm) })
	// Another tenant: the VMM.
	res := runPeer(t, d.socket, helperArgs{netns: pod.Path(), uid: ptr(owner), gid: ptr(owner), groups: []int{floodSocketGroup}, op: "fetch", key: &vmm})
	if res.Code != "" || res.FDs != 2 || !res.NAPI {
		t.Errorf("the VMM of uid %d during the flood: code %q (%s), %d fds, NAPI %v; want its 2 NAPI queues", owner, res.Code, res.Err, res.FDs, res.NAPI)
	}
}

// TestOutOfFDsNapitapdWaitsAndServesAgain: with so low an RLIMIT_NOFILE that
// accept fails with EMFILE, napitapd waits and serves again once
// connections close, instead of exiting and dropping every queue it holds.
func TestOutOfFDsNapitapdWaitsAndServesAgain(t *testing.T) {
	nstest.RequireRoot(t)
	d := startNapitapd(t)
	c := d.client()
	pod := nstest.New(t, "handoff")
	key := handoff.Key{ContainerID: "emfile", IfName: "net1"}
	registerNew(t, c, pod, key, "napihoem", 4)

	// Room for a few connections (two fds each) and no more.
	fds0, _ := d.settledFDs(t)
	limit := unix.Rlimit{Cur: uint64(fds0 + 6), Max: uint64(fds0 + 6)}
	if err := unix.Prlimit(d.pid, unix.RLIMIT_NOFILE, &limit, nil); err != nil {
		t.Fatalf("prlimit napitapd: %v", err)
	}
	// Root's connections: no per-uid limit stops them before the fds run
	// out. Fewer than the listen backlog, or connect would wait for room.
	var conns []*os.File
	for range 100 {
		conns = append(conns, dialFile(t, d.socket))
	}
	defer closeFiles(conns)
	for deadline := time.Now().Add(5 * time.Second); d.logLines("too many open files") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) || !d.alive() {
			t.Fatalf("napitapd (alive %v) logged no EMFILE: %s", d.alive(), d.stderr.String())
		}
	}
	// Long enough for the backoff to reach its ceiling.
	time.Sleep(1500 * time.Millisecond)
	if !d.alive() {
		t.Fatalf("napitapd exited when it ran out of fds: %s", d.stderr.String())
	}

	closeFiles(conns)
	start := time.Now()
	atts, err := c.List()
	if err != nil {
		t.Fatalf("list after the connections closed: %v", err)
	}
	t.Logf("napitapd answered %v after the connections closed", time.Since(start))
	if len(atts) != 1 || atts[0].Key != key || atts[0].Held != 4 {
		t.Errorf("napitapd lists %+v, want %s holding 4", atts, key)
	}
	fetchQueues(t, c, key, "napihoem", 4, "fetch after napitapd ran out of fds")
	if n := d.logLines("accept failed"); n < 1 || n > 2 {
		t.Errorf("napitapd logged %d lines about failed accepts, want 1-2", n)
	}
}

// dialFile connects to socket and returns the connection as a file, so
// that a test holds many connections without the runtime's poller.
func dialFile(t testing.TB, socket string) *os.File {
	t.Helper()
	fd, err := dialSeqpacket(socket)
	if err != nil {
		t.Fatal(err)
	}
	return os.NewFile(uintptr(fd), "connection")
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// TestACallerHungUpOnAtTheConnectionLimitAsksAgain: a tenant can hold
// all the connections its uid may; napitapd hangs up on the next one of
// that uid, and the client asks again until its deadline instead of
// failing at once (a VMM's fetch outlives a burst of its uid's fetches).
func TestACallerHungUpOnAtTheConnectionLimitAsksAgain(t *testing.T) {
	nstest.RequireRoot(t)
	d := startNapitapd(t, "--max-conns", "4", "--max-conns-per-uid", "1")
	pod := nstest.New(t, "handoff")
	key := handoff.Key{ContainerID: "burst", IfName: "net1"}
	registerNew(t, d.client(), pod, key, "napihobu", 2)

	f, rep := startFlooder(t, d.socket, 1, 0, false)
	if rep.Open != 1 {
		t.Fatalf("uid %d holds %d connections, want 1", rep.Uid, rep.Open)
	}
	go func() {
		for deadline := time.Now().Add(5 * time.Second); d.logLines("refused connection") == 0 && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
		}
		f.in.Close() // the flooder lets its connection go
	}()
	res := runPeer(t, d.socket, helperArgs{netns: pod.Path(), uid: ptr(floodUID), gid: ptr(floodSocketGroup), op: "list"})
	if res.Code != "" || !slices.Equal(res.Attachments, []string{key.String()}) {
		t.Errorf("a list by uid %d while it was at its limit: code %q (%s), %v; want %s", floodUID, res.Code, res.Err, res.Attachments, key)
	}
	if n := d.logLines("refused connection"); n == 0 {
		t.Error("napitapd refused no connection: the limit was never hit")
	}
}
