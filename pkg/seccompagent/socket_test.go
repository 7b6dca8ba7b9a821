package seccompagent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/threadcred"
)

// runcMessage is what runc 1.1 sends a listenerPath for a CRI container.
const runcMessage = `{"ociVersion":"1.0.2-dev","fds":["seccompFd"],"pid":4242,"metadata":"napitap",` +
	`"state":{"ociVersion":"1.0.2-dev","id":"c0ffee","status":"creating","pid":4242,` +
	`"bundle":"/run/containerd/io.containerd.runtime.v2.task/k8s.io/c0ffee",` +
	`"annotations":{"io.kubernetes.cri.container-name":"compute","io.kubernetes.cri.sandbox-name":"virt-launcher-vm1","io.kubernetes.cri.sandbox-namespace":"default"}}}`

func TestParseMessage(t *testing.T) {
	tests := []struct {
		name    string
		msg     string
		fds     []int
		wantErr string
	}{
		{name: "runc's message with its one fd is taken", msg: runcMessage, fds: []int{7}},
		{name: "a message that is not JSON is refused", msg: `{"ociVersion":`, fds: []int{7}, wantErr: "not a ContainerProcessState"},
		{name: "a JSON array is refused", msg: `[1,2]`, fds: []int{7}, wantErr: "not a ContainerProcessState"},
		{name: "a message without ociVersion is refused", msg: `{"fds":["seccompFd"],"pid":1}`, fds: []int{7}, wantErr: "no ociVersion"},
		{name: "a message naming a fd that did not come is refused", msg: runcMessage, wantErr: "names 1 fds, 0 came"},
		{name: "a message with an extra fd is refused", msg: runcMessage, fds: []int{7, 8}, wantErr: "names 1 fds, 2 came"},
		{name: "two fds named as two are still refused", msg: `{"ociVersion":"1","fds":["seccompFd","other"],"pid":1}`, fds: []int{7, 8}, wantErr: "want one fd"},
		{name: "a fd of another name is refused", msg: `{"ociVersion":"1","fds":["other"],"pid":1}`, fds: []int{7}, wantErr: "want one fd"},
		{name: "a message without a pid is refused", msg: `{"ociVersion":"1","fds":["seccompFd"]}`, fds: []int{7}, wantErr: "pid 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, fd, err := parseMessage([]byte(tc.msg), tc.fds)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fd != tc.fds[0] {
				t.Errorf("fd %d, want %d", fd, tc.fds[0])
			}
			want := `pod default/virt-launcher-vm1 container "compute" pid 4242`
			if got := origin(st, "peer"); got != want {
				t.Errorf("origin %q, want %q", got, want)
			}
		})
	}
}

// send writes msg with fds (files opened on /dev/null) on a new
// connection, hangs up its writing side if asked, and returns the ack.
func send(t *testing.T, socket string, msg []byte, nfds int, hangUp bool) string {
	t.Helper()
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	var oob []byte
	if nfds > 0 {
		fds := make([]int, nfds)
		for i := range fds {
			f, err := os.Open(os.DevNull)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	// The agent may hang up before reading all of an oversized message.
	go func() {
		_, _, _ = conn.WriteMsgUnix(msg, oob, nil)
		if hangUp {
			_ = conn.CloseWrite()
		}
	}()
	line, _ := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSuffix(line, "\n")
}

func TestTheSocketRefusesWhatItCannotUseAndKeepsNoFd(t *testing.T) {
	ta := startAgent(t, slog.LevelInfo)
	before := openFDs(t)
	tests := []struct {
		name    string
		msg     string
		fds     int
		hangUp  bool
		wantAck string
	}{
		{name: "garbage with a fd", msg: "GET / HTTP/1.0\r\n\r\n", fds: 1, hangUp: true, wantAck: "error: incomplete message"},
		{name: "a message without its fd", msg: runcMessage, wantAck: "error: message names 1 fds, 0 came"},
		{name: "a message with an extra fd", msg: runcMessage, fds: 2, wantAck: "error: message names 1 fds, 2 came"},
		{name: "a message with more fds than a read takes", msg: runcMessage, fds: maxFDs + 1, wantAck: "error: more than"},
		{name: "a fd that is no seccomp listener", msg: runcMessage, fds: 1, wantAck: "not a seccomp listener"},
		{name: "an oversized message", msg: `{"ociVersion":"` + strings.Repeat("x", MaxMessage) + `"}`, fds: 1, wantAck: "error: message larger than"},
		{name: "a message cut short", msg: runcMessage[:100], fds: 1, hangUp: true, wantAck: "error: incomplete message"},
		{name: "a connection that says nothing", hangUp: true, wantAck: "error: no message"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ack := send(t, ta.socket, []byte(tc.msg), tc.fds, tc.hangUp)
			if !strings.HasPrefix(ack, "error: ") || !strings.Contains(ack, strings.TrimPrefix(tc.wantAck, "error: ")) {
				t.Errorf("ack %q, want %q", ack, tc.wantAck)
			}
		})
	}
	waitFDs(t, before, "after the refused messages")
	if n := strings.Count(ta.log.String(), "seccomp socket: refused"); n != len(tests) {
		t.Errorf("%d refusals logged, want %d", n, len(tests))
	}
	if n := ta.agent.Listeners(); n != 0 {
		t.Errorf("agent serves %d listeners", n)
	}
	// Still serving: a real listener is taken.
	launchTrue(t, ta.socket)
}

func TestTheListenerLogNamesItsSenderByCommand(t *testing.T) {
	ta := startAgent(t, slog.LevelInfo)
	// The launcher is this test binary until the agent's ack lets it exec.
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	launchTrue(t, ta.socket)
	want := "comm " + strings.TrimSuffix(string(comm), "\n") + `"`
	for _, line := range strings.Split(ta.log.String(), "\n") {
		if strings.Contains(line, `msg="serving seccomp listener"`) {
			if !strings.Contains(line, `sender="peer pid `) || !strings.Contains(line, want) {
				t.Errorf("sender lacks %q: %s", want, line)
			}
			return
		}
	}
	t.Errorf("no listener served:\n%s", ta.log.String())
}

// launchTrue runs `launch -- true` through the agent at socket.
func launchTrue(t *testing.T, socket string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := helperCmd(ctx, "launch-true", socketEnv+"="+socket).CombinedOutput()
	if err != nil {
		t.Errorf("launch -- true: %v: %s", err, out)
	}
}

// TestAFloodOfConnectionsIsBoundedAndLogged: a tenant (here a pod's
// root: uid 0 without capabilities) that holds its share of connections
// idle gets every further one closed at once, logged at most once a
// second, and napitapd's equal still launches.
func TestAFloodOfConnectionsIsBoundedAndLogged(t *testing.T) {
	nstest.RequireRoot(t)
	const maxConns, flood = 4, 50
	ta := startAgentConns(t, slog.LevelInfo, Limits{MaxConns: 2 * maxConns, MaxConnsPerUID: maxConns})
	before := openFDs(t)
	cmd := nstest.AsCaplessRoot(t, exec.Command(os.Args[0]))
	cmd.Env = append(os.Environ(), helperEnv+"=flood", socketEnv+"="+ta.socket, fmt.Sprintf("%s=%d %d", specEnv, maxConns, flood))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var closed int
	if _, err := fmt.Fscanln(out, &closed); err != nil {
		t.Fatalf("flooder: %v", err)
	}
	if closed != flood {
		t.Errorf("%d of %d connections over the pod root's share were closed, want all", closed, flood)
	}
	if !strings.Contains(ta.log.String(), "too many connections at once") {
		t.Errorf("no log line for the flood")
	}
	if n := strings.Count(ta.log.String(), "too many connections"); n > 2 {
		t.Errorf("%d log lines for one flood, want at most one a second", n)
	}
	launchTrue(t, ta.socket)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("flooder: %v", err)
	}
	waitFDs(t, before, "after the flood")
}

// runFlood is the flooder: it holds idle connections, then opens flood more
// and prints how many of those the server closed at once.
func runFlood() int {
	var idle, flood int
	if _, err := fmt.Sscan(os.Getenv(specEnv), &idle, &flood); err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		return 2
	}
	dial := func() (*net.UnixConn, error) {
		return net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Getenv(socketEnv), Net: "unix"})
	}
	for range idle {
		c, err := dial()
		if err != nil {
			fmt.Fprintln(os.Stderr, "flood:", err)
			return 2
		}
		defer c.Close()
	}
	// The server may not have accepted the idle ones yet; give it a moment.
	time.Sleep(100 * time.Millisecond)
	closed := 0
	for range flood {
		c, err := dial()
		if err != nil {
			fmt.Fprintln(os.Stderr, "flood:", err)
			return 2
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		var b [64]byte
		if n, err := c.Read(b[:]); n == 0 && err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			closed++
		}
		c.Close()
	}
	fmt.Println(closed)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

func TestSendListenerSpeaksRuncsMessage(t *testing.T) {
	// What launch sends must be what a runc-facing parser takes.
	st := &specs.ContainerProcessState{Version: specs.Version, Fds: []string{specs.SeccompFdName}, Pid: 1, State: specs.State{ID: "launch-1"}}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := parseMessage(b, []int{9}); err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxMessage {
		t.Fatalf("%d bytes", len(b))
	}
}

func TestClosingTheAgentLetsGoOfLiveListeners(t *testing.T) {
	ta := startAgent(t, slog.LevelInfo)
	before := openFDs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// launch -- sleep: a process that lives under the filter.
	cmd := helperCmd(ctx, "launch-sleep", socketEnv+"="+ta.socket)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for ta.agent.Listeners() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the launched process's listener never arrived")
		}
		time.Sleep(5 * time.Millisecond)
	}
	start := time.Now()
	ta.stop()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v", d)
	}
	if n := ta.agent.Listeners(); n != 0 {
		t.Errorf("%d listeners after Close", n)
	}
	if logs := ta.log.String(); strings.Contains(logs, "level=ERROR") {
		t.Errorf("Close logged errors:\n%s", logs)
	}
	waitFDs(t, before, "after Close")
}

// dialAs connects to socket with uid's credentials, which the kernel
// records at connect: from a thread of this process that took them on.
func dialAs(socket string, uid uint32) (*net.UnixConn, error) {
	var conn *net.UnixConn
	err := threadcred.Run(threadcred.Creds{UID: uid, GID: uid}, func() error {
		var err error
		conn, err = net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
		return err
	})
	return conn, err
}

func TestASilentConnectionIsLetGoAndTheAgentServesOn(t *testing.T) {
	nstest.RequireRoot(t)
	ta := startAgent(t, slog.LevelInfo)
	openToAll(t, ta.socket)
	tests := []struct {
		name    string
		uid     uint32
		timeout time.Duration
	}{
		{name: "a root sender gets the time crun needs", uid: 0, timeout: rootTimeout},
		{name: "another uid's sender gets a second", uid: 65534, timeout: otherTimeout},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := dialAs(ta.socket, tc.uid)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			start := time.Now()
			ack, err := readLine(bufio.NewReader(conn), tc.timeout+5*time.Second)
			waited := time.Since(start)
			if err != nil || !strings.HasPrefix(ack, "error: no message") {
				t.Errorf("after %v: ack %q, %v; want an error ack once the deadline passes", waited, ack, err)
			}
			if waited < tc.timeout-100*time.Millisecond || waited > tc.timeout+2*time.Second {
				t.Errorf("let go after %v, want about %v", waited, tc.timeout)
			}
			launchTrue(t, ta.socket)
		})
	}
	if logs := ta.log.String(); strings.Contains(logs, "panic") {
		t.Errorf("a connection panicked:\n%s", logs)
	}
}

func TestIdleConnectionsOfOneUIDLeaveRootItsShare(t *testing.T) {
	nstest.RequireRoot(t)
	ta := startAgent(t, slog.LevelWarn)
	openToAll(t, ta.socket)
	// A member of the socket's group holds as many idle connections as it
	// can, and connects again as the agent lets them go.
	stop := make(chan struct{})
	flooded := make(chan int, 1)
	go func() {
		dials := 0
		_ = threadcred.Run(threadcred.Creds{UID: 65534, GID: 65534}, func() error {
			var held []*net.UnixConn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for {
				select {
				case <-stop:
					flooded <- dials
					return nil
				default:
				}
				c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: ta.socket, Net: "unix"})
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				dials++
				if held = append(held, c); len(held) >= 2*DefaultMaxConns {
					for _, c := range held {
						c.Close()
					}
					held = held[:0]
				}
			}
		})
	}()
	time.Sleep(200 * time.Millisecond)
	const launches = 20
	var took []time.Duration
	failed := 0
	for range launches {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		out, err := helperCmd(ctx, "launch-true", socketEnv+"="+ta.socket).CombinedOutput()
		took = append(took, time.Since(start))
		cancel()
		if err != nil {
			failed++
			t.Logf("launch -- true: %v: %s", err, out)
		}
	}
	close(stop)
	dials := <-flooded
	slices.Sort(took)
	t.Logf("root's launches during a flood of %d connections from uid 65534: %d of %d served; p50 %v, max %v",
		dials, launches-failed, launches, took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	if failed > 0 {
		t.Errorf("%d of %d root launches failed during the flood", failed, launches)
	}
	if !strings.Contains(ta.log.String(), "the uid is at its own limit") {
		t.Errorf("the flood was never refused:\n%s", ta.log.String())
	}
}

// openToAll lets any uid connect to socket, in its test's TempDir.
func openToAll(t *testing.T, socket string) {
	t.Helper()
	for path, mode := range map[string]os.FileMode{socket: 0o666, filepath.Dir(socket): 0o755, filepath.Dir(filepath.Dir(socket)): 0o755} {
		if err := os.Chmod(path, mode); err != nil {
			t.Fatal(err)
		}
	}
}
