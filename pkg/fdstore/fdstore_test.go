package fdstore

import (
	"bufio"
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
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/fdtest"
	"github.com/napitap/napitap/internal/nstest"
	_ "github.com/napitap/napitap/internal/ownuserns"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/unixsock"
)

// The re-executed test binary runs TestHelperProcess as a client of the
// holder at socketEnv: "put" puts a tap queue (of tapEnv, made in the
// netns netnsEnv) and a pipe, says so and waits to be killed; "list" (run
// as another uid) lists and prints what came of it.
const (
	helperEnv = "NAPITAP_FDSTORE_HELPER"
	socketEnv = "NAPITAP_FDSTORE_SOCKET"
	netnsEnv  = "NAPITAP_FDSTORE_NETNS"
	tapEnv    = "NAPITAP_FDSTORE_TAP"
)

func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	err := func() error {
		if mode == "raw-list" {
			// Without the Client's own check of the holder: an attacker
			// has no reason to run it.
			conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: os.Getenv(socketEnv), Net: "unixpacket"})
			if err != nil {
				return err
			}
			defer conn.Close()
			if err := send(conn, &message{Op: opList, Files: true}, nil); err != nil {
				// It judges the peer before a word: it may have hung up.
				return fmt.Errorf("the holder hung up: %v", err)
			}
			m, files, err := recv(conn, make([]byte, MaxMessage+1))
			closeFiles(files)
			if err != nil {
				return fmt.Errorf("the holder hung up: %v", err)
			}
			return fmt.Errorf("the holder answered %q", m.Op)
		}
		c, err := Dial(os.Getenv(socketEnv))
		if err != nil {
			return fmt.Errorf("dial: %w", err)
		}
		switch mode {
		case "list":
			_, err := c.List(false)
			return fmt.Errorf("list: %v", err)
		case "put":
			netns, err := ns.GetNS(os.Getenv(netnsEnv))
			if err != nil {
				return err
			}
			var q *os.File
			if err := netns.Do(func(ns.NetNS) error { q, err = openTapQueue(os.Getenv(tapEnv)); return err }); err != nil {
				return err
			}
			r, w, err := os.Pipe()
			if err != nil {
				return err
			}
			for _, e := range []Entry{
				{Name: "queue", Meta: json.RawMessage(`{"tap":"` + os.Getenv(tapEnv) + `"}`), Files: []*os.File{q}},
				{Name: "pipe", Files: []*os.File{r, w}},
			} {
				if err := c.Put(e); err != nil {
					return err
				}
			}
			fmt.Println("ready")
			select {} // until SIGKILL
		}
		return fmt.Errorf("unknown mode %q", mode)
	}()
	fmt.Println(err)
	os.Exit(0)
}

func testLog(t testing.TB) (*slog.Logger, *syncbuf.Buffer) {
	var buf syncbuf.Buffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

// serve runs a holder on path until stop (or the test's end), which closes
// its socket and every fd it holds, as the holder's SIGTERM does.
func serve(t testing.TB, path string, maxFiles int) (h *Holder, log *syncbuf.Buffer, stop func()) {
	t.Helper()
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	logger, log := testLog(t)
	h = NewHolder(logger)
	if maxFiles > 0 {
		h.MaxFiles = maxFiles
	}
	done := make(chan struct{})
	go func() {
		if err := h.Serve(l); err != nil {
			t.Errorf("Serve: %v", err)
		}
		close(done)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { l.Close(); <-done; h.Close() }) }
	t.Cleanup(stop)
	return h, log, stop
}

func dial(t testing.TB, path string) *Client {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func pipe(t testing.TB) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// writersGone: reading r ends (EOF) within a moment, so every copy of the
// pipe's write end is closed.
func writersGone(t testing.TB, r *os.File) bool {
	t.Helper()
	_ = r.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := r.Read(make([]byte, 1))
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatal(err)
	}
	return errors.Is(err, io.EOF)
}

func names(entries []Entry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name)
	}
	return out
}

func list(t testing.TB, c *Client, withFiles bool) []Entry {
	t.Helper()
	entries, err := c.List(withFiles)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range entries {
			closeFiles(e.Files)
		}
	})
	return entries
}

// openTapQueue makes the tap name (in the caller's netns) and opens a
// queue of it, as a VMM's would be.
func openTapQueue(name string) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "tap "+name), nil
}

// tapOf is the tap the queue f is attached to (TUNGETIFF).
func tapOf(t testing.TB, f *os.File) string {
	t.Helper()
	ifr, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(fdtest.FD(t, f), unix.TUNGETIFF, ifr); err != nil {
		t.Fatalf("TUNGETIFF on %s: %v", f.Name(), err)
	}
	return ifr.Name()
}

// tapExists: a tap that is not persistent exists while a queue of it is
// open somewhere.
func tapExists(t testing.TB, netns *nstest.NetNS, name string) bool {
	t.Helper()
	var err error
	netns.Run(t, func() error { _, err = netlink.LinkByName(name); return nil })
	if err != nil && !errors.As(err, new(netlink.LinkNotFoundError)) {
		t.Fatal(err)
	}
	return err == nil
}

func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within 5 s: %s", what)
		}
	}
}

func TestAHolderGivesBackTheSameOpenFilesItWasPut(t *testing.T) {
	nstest.RequireRoot(t)
	netns := nstest.New(t, "fdstore")
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	serve(t, path, 0)
	c := dial(t, path)

	tap := "fdst" + nstest.RandomSuffix()
	var q *os.File
	netns.Run(t, func() (err error) { q, err = openTapQueue(tap); return err })
	defer q.Close()
	r, w := pipe(t)
	put := []Entry{
		{Name: "queue", Meta: json.RawMessage(`{"tap":"` + tap + `"}`), Files: []*os.File{q}},
		{Name: "pipe", Files: []*os.File{r, w}},
	}
	for _, e := range put {
		if err := c.Put(e); err != nil {
			t.Fatal(err)
		}
	}

	got := list(t, c, true)
	if !slices.Equal(names(got), []string{"pipe", "queue"}) {
		t.Fatalf("listed %q, want pipe and queue", names(got))
	}
	pipeGot, queueGot := got[0], got[1]
	if len(pipeGot.Files) != 2 || !fdtest.SameFile(t, pipeGot.Files[0], r) || !fdtest.SameFile(t, pipeGot.Files[1], w) {
		t.Errorf("the pipe listed is not the pipe put: %v", pipeGot.Files)
	}
	if pipeGot.Meta != nil {
		t.Errorf("the pipe, put without meta, lists with meta %s", pipeGot.Meta)
	}
	if len(queueGot.Files) != 1 || !fdtest.SameFile(t, queueGot.Files[0], q) || string(queueGot.Meta) != string(put[0].Meta) {
		t.Fatalf("the queue listed is not the queue put: %+v", queueGot)
	}
	if name := tapOf(t, queueGot.Files[0]); name != tap {
		t.Errorf("the queue listed is attached to %q, want %q", name, tap)
	}
	flags, err := unix.FcntlInt(uintptr(fdtest.FD(t, queueGot.Files[0])), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("a listed fd is not close-on-exec: flags %#x, %v", flags, err)
	}

	for _, e := range list(t, c, false) {
		if len(e.Files) != 0 {
			t.Errorf("a list without files gave %d files of %q", len(e.Files), e.Name)
		}
	}
}

func TestAHolderClosesTheFilesOfAnEntryReplacedOrDropped(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	serve(t, path, 0)
	c := dial(t, path)
	tests := []struct {
		name string
		then func(t *testing.T) // after the holder has the only write end of "p"
	}{
		{"a put of the same name closes the files it replaces", func(t *testing.T) {
			_, w := pipe(t)
			if err := c.Put(Entry{Name: "p", Files: []*os.File{w}}); err != nil {
				t.Fatal(err)
			}
		}},
		{"a drop closes the entry's files", func(t *testing.T) {
			if err := c.Drop("p", "never-put"); err != nil {
				t.Fatal(err)
			}
			if got := names(list(t, c, false)); len(got) != 0 {
				t.Errorf("after drop, the holder has %q", got)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, w := pipe(t)
			if err := c.Put(Entry{Name: "p", Files: []*os.File{w}}); err != nil {
				t.Fatal(err)
			}
			w.Close()
			if writersGone(t, r) {
				t.Fatal("the holder closed its copy of the write end after a put")
			}
			tc.then(t)
			if !writersGone(t, r) {
				t.Error("the holder still holds the write end")
			}
			_ = c.Drop("p")
		})
	}
}

func TestAHolderKeepsTheFilesOfAClientKilledBySIGKILL(t *testing.T) {
	nstest.RequireRoot(t)
	netns := nstest.New(t, "fdstore")
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	serve(t, path, 0)
	tap := "fdst" + nstest.RandomSuffix()

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=put", socketEnv+"="+path, netnsEnv+"="+netns.Path(), tapEnv+"="+tap)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		t.Fatalf("the client: %q, %v", line, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the client exited with %v, want killed", err)
	}

	// The killed client's tap lives on: only the holder has its queue.
	if !tapExists(t, netns, tap) {
		t.Fatalf("tap %s is gone with the client that made it", tap)
	}
	got, err := Recover(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, e := range got {
			closeFiles(e.Files)
		}
	})
	if !slices.Equal(names(got), []string{"pipe", "queue"}) {
		t.Fatalf("a new client recovers %q, want pipe and queue", names(got))
	}
	if name := tapOf(t, got[1].Files[0]); name != tap || string(got[1].Meta) != `{"tap":"`+tap+`"}` {
		t.Errorf("the queue recovered is attached to %q with meta %s, want %q", name, got[1].Meta, tap)
	}
	if _, err := got[0].Files[1].Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if b := make([]byte, 2); func() int { n, _ := got[0].Files[0].Read(b); return n }() != 1 {
		t.Error("the pipe recovered does not carry what is written into it")
	}

	// Dropped and closed, the queue's last copy goes, and the tap with it.
	closeFiles(got[1].Files)
	if err := dial(t, path).Drop("queue"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the tap goes with its last queue", func() bool { return !tapExists(t, netns, tap) })
}

func TestAHolderHangsUpOnAPeerThatIsNotRoot(t *testing.T) {
	nstest.RequireRoot(t)
	// A dir, and a copy of the test binary, that uid 65534 can reach.
	dir, err := os.MkdirTemp("", "napitap-fdstore-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "fdstore.test")
	if b, err := os.ReadFile(os.Args[0]); err != nil || os.Chmod(dir, 0o755) != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	path := filepath.Join(dir, "fdstore.sock")
	_, log, _ := serve(t, path, 0)
	if st, err := os.Stat(path); err != nil || st.Mode() != os.ModeSocket|0o600 {
		t.Fatalf("the holder's socket: %v, %v; want a socket of mode 0600", st.Mode(), err)
	}
	r, w := pipe(t)
	if err := dial(t, path).Put(Entry{Name: "p", Files: []*os.File{r, w}}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name         string
		mode         os.FileMode // the socket's
		capless      bool        // the peer is root without capabilities, not uid 65534
		userns       bool        // capless, with every capability in a user namespace of its own
		wantSaid     string
		wantHungUpOn string // what the holder logs
		wantWhy      string // and why, where it matters
	}{
		{"the socket's mode keeps out a peer that is not root", 0o600, false, false, "permission denied", "", ""},
		{"the holder hangs up on a peer that is not root and gets in", 0o666, false, false, "the holder hung up", "not root", ""},
		{"the holder hangs up on a root peer without napitapd's capabilities", 0o600, true, false, "the holder hung up", "not a napitapd", ""},
		{"the holder hangs up on a root peer with every capability in a user namespace of its own", 0o600, false, true, "the holder hung up", "not a napitapd", "only in a user namespace of its own"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			log.Reset()
			cmd := exec.Command(bin, "-test.run=^TestHelperProcess$")
			mode := "list"
			if tc.userns {
				mode = "raw-list"
			}
			cmd.Env = append(os.Environ(), helperEnv+"="+mode, socketEnv+"="+path)
			switch {
			case tc.capless:
				cmd = nstest.AsCaplessRoot(t, cmd)
			case tc.userns:
				cmd = nstest.AsRootInOwnUserns(t, cmd)
			default:
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			}
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), tc.wantSaid) {
				t.Errorf("the peer got %q (%v), want %q", out, err, tc.wantSaid)
			}
			said := log.String()
			hungUp := strings.Contains(said, "hung up on a peer")
			if tc.wantHungUpOn == "" && hungUp || tc.wantHungUpOn != "" && !strings.Contains(said, "hung up on a peer that is "+tc.wantHungUpOn) || !strings.Contains(said, tc.wantWhy) {
				t.Errorf("the holder's log, want it to have hung up saying %q (or not at all if empty) because %q:\n%s", tc.wantHungUpOn, tc.wantWhy, said)
			}
			if got := names(list(t, dial(t, path), false)); !slices.Equal(got, []string{"p"}) {
				t.Errorf("after, root lists %q, want p", got)
			}
		})
	}
}

// rawConn speaks to the holder without the Client's checks.
func rawConn(t testing.TB, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	return c
}

func TestAHolderRefusesWhatItCannotKeepAndChangesNothing(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	h, _, _ := serve(t, path, 4)
	keeper := dial(t, path)
	// The holder has "a", two of the four fds it may hold, and the only
	// copy of the write end: closing it would show.
	r, w := pipe(t)
	if err := keeper.Put(Entry{Name: "a", Files: []*os.File{w, w}}); err != nil {
		t.Fatal(err)
	}
	w.Close()

	tests := []struct {
		name       string
		msg        string // sent raw
		files      int    // /dev/null opens sent with it
		wantError  string
		wantHungUp bool
	}{
		{"a put over the holder's limit of fds", `{"version":1,"op":"put","name":"b"}`, 3, "exceed the holder's limit of 4", false},
		{"a put that replaces over the limit", `{"version":1,"op":"put","name":"a"}`, 5, "exceed the holder's limit of 4", false},
		{"a put of no fds", `{"version":1,"op":"put","name":"b"}`, 0, "1 to 253 fds, not 0", false},
		{"a put with no name", `{"version":1,"op":"put"}`, 1, "a name must be", false},
		{"a put of meta over 16 KiB", `{"version":1,"op":"put","name":"b","meta":"` + strings.Repeat("m", MaxMeta) + `"}`, 1, "meta of", false},
		{"a drop carrying fds", `{"version":1,"op":"drop","names":["a"]}`, 1, "only put does", false},
		{"a request of another version", `{"version":2,"op":"list"}`, 0, "this holder speaks version 1", false},
		{"a message that is not JSON", `{"version":1,"op":`, 1, "malformed message", true},
		{"a request of an unknown op", `{"version":1,"op":"take"}`, 0, "unknown op", true},
		{"a message over 64 KiB", `{"version":1,"op":"list","x":"` + strings.Repeat("x", MaxMessage) + `"}`, 0, "larger than", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := rawConn(t, path)
			var files []*os.File
			for range tc.files {
				f, err := os.Open(os.DevNull)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				files = append(files, f)
			}
			oob, err := unixsock.Rights(files)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := c.WriteMsgUnix([]byte(tc.msg), oob, nil); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, MaxMessage+1)
			m, _, err := recv(c, buf)
			if err != nil || m.Op != opError || !strings.Contains(m.Error, tc.wantError) {
				t.Fatalf("answer %+v, %v; want an error saying %q", m, err, tc.wantError)
			}
			// The connection is closed, or serves on.
			if err := send(c, &message{Op: opList}, nil); err != nil && !tc.wantHungUp {
				t.Fatal(err)
			}
			m, _, err = recv(c, buf)
			if hungUp := errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET); hungUp != tc.wantHungUp {
				t.Errorf("next answer %+v, %v: hung up %v, want %v", m, err, hungUp, tc.wantHungUp)
			}
			// Nothing changed, and another client is served.
			if got := list(t, keeper, false); !slices.Equal(names(got), []string{"a"}) {
				t.Errorf("the holder has %q, want only a", names(got))
			}
			if writersGone(t, r) {
				t.Error("the holder closed a's files")
			}
			h.mu.Lock()
			held := h.files
			h.mu.Unlock()
			if held != 2 {
				t.Errorf("the holder counts %d fds, want 2", held)
			}
		})
	}

	t.Run("a client whose put is refused goes on", func(t *testing.T) {
		c := dial(t, path)
		_, w := pipe(t)
		err := c.Put(Entry{Name: "b", Files: []*os.File{w, w, w}})
		if !errors.As(err, new(refusal)) {
			t.Fatalf("an over-limit put: %v, want the holder's refusal", err)
		}
		if err := c.Put(Entry{Name: "b", Files: []*os.File{w, w}}); err != nil {
			t.Fatalf("a put within the limit after: %v", err)
		}
	})
}

func TestAClientRefusesAnEntryTheHolderWouldBeforeSendingIt(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	serve(t, path, 0)
	c := dial(t, path)
	_, w := pipe(t)
	tests := []struct {
		name string
		e    Entry
		want string
	}{
		{"an empty name", Entry{Files: []*os.File{w}}, "a name must be"},
		{"a name over 256 bytes", Entry{Name: strings.Repeat("n", MaxName+1), Files: []*os.File{w}}, "a name must be"},
		{"a name that is not UTF-8", Entry{Name: "\xff", Files: []*os.File{w}}, "a name must be"},
		{"meta that is not JSON", Entry{Name: "x", Meta: json.RawMessage("{"), Files: []*os.File{w}}, "not JSON"},
		{"no files", Entry{Name: "x"}, "1 to 253 fds"},
		{"more files than one message carries", Entry{Name: "x", Files: slices.Repeat([]*os.File{w}, MaxFDs+1)}, "1 to 253 fds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := c.Put(tc.e); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Put: %v, want %q", err, tc.want)
			}
		})
	}
	// Meta at the limit fits in a message, even of characters JSON could escape.
	e := Entry{Name: strings.Repeat("\x01", MaxName), Meta: json.RawMessage(`"` + strings.Repeat("<", MaxMeta-2) + `"`), Files: slices.Repeat([]*os.File{w}, MaxFDs)}
	if err := c.Put(e); err != nil {
		t.Fatalf("the largest entry: %v", err)
	}
	if got := list(t, c, true); len(got) != 1 || string(got[0].Meta) != string(e.Meta) || len(got[0].Files) != MaxFDs {
		t.Errorf("the largest entry did not come back whole")
	}
}

func TestAClientServesConcurrentCallersInTurn(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	serve(t, path, 0)
	c := dial(t, path)
	_, w := pipe(t)
	var wg sync.WaitGroup
	errs := make(chan error, 16*20)
	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				name := fmt.Sprintf("g%d-%d", g, i%3)
				err := c.Put(Entry{Name: name, Meta: json.RawMessage(fmt.Sprint(i)), Files: []*os.File{w}})
				if err == nil && i%5 == 0 {
					var got []Entry
					if got, err = c.List(true); err == nil {
						for _, e := range got {
							closeFiles(e.Files)
						}
					}
				}
				if err == nil && i%7 == 0 {
					err = c.Drop(name)
				}
				if err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestRecoverWaitsForAHolderAndSaysWhenThereIsNone(t *testing.T) {
	nstest.RequireRoot(t)
	t.Run("no holder", func(t *testing.T) {
		got, err := Recover(filepath.Join(t.TempDir(), "none.sock"), 300*time.Millisecond)
		if !errors.Is(err, ErrNoHolder) || got != nil {
			t.Errorf("Recover: %v, %v; want ErrNoHolder", got, err)
		}
	})
	t.Run("a holder that starts late", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "fdstore.sock")
		started := make(chan struct{})
		go func() { time.Sleep(300 * time.Millisecond); serve(t, path, 0); close(started) }()
		defer func() { <-started }()
		if got, err := Recover(path, 5*time.Second); err != nil || len(got) != 0 {
			t.Errorf("Recover: %v, %v; want nothing, and no error", got, err)
		}
	})
}

func TestAMirrorKeepsTheHolderEqualToItsEntriesAcrossRestartsOfEither(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	logger, _ := testLog(t)
	m := NewMirror(path, logger)
	defer m.Close()
	// What was put: the test's own copies, to compare with the holder's.
	r1, w1 := pipe(t)
	_, w2 := pipe(t)
	m.Put(Entry{Name: "one", Meta: json.RawMessage(`{"n":1}`), Files: []*os.File{r1, w1}})
	m.Put(Entry{Name: "two", Files: []*os.File{w2}})
	holderHas := func(c *Client, want ...string) func() bool {
		return func() bool {
			got, err := c.List(false)
			return err == nil && slices.Equal(names(got), want)
		}
	}

	// Start before the holder does: the Mirror keeps trying.
	m.Start()
	time.Sleep(300 * time.Millisecond)
	_, _, stop := serve(t, path, 0)
	c := dial(t, path)
	eventually(t, "a holder that starts after the Mirror gets its entries", holderHas(c, "one", "two"))
	got := list(t, c, true)
	if !fdtest.SameFile(t, got[0].Files[0], r1) || !fdtest.SameFile(t, got[0].Files[1], w1) || !fdtest.SameFile(t, got[1].Files[0], w2) || string(got[0].Meta) != `{"n":1}` {
		t.Errorf("the holder's entries are not the ones put: %+v", got)
	}

	// While connected, Put and Drop reach the holder before they return.
	_, w3 := pipe(t)
	m.Put(Entry{Name: "three", Files: []*os.File{w3}})
	m.Drop("two")
	if !holderHas(c, "one", "three")() {
		t.Errorf("after Put three and Drop two, the holder has %q", names(list(t, c, false)))
	}

	// A holder that restarts (empty, on the same socket) gets them again.
	stop()
	serve(t, path, 0)
	c = dial(t, path)
	eventually(t, "a restarted holder gets every entry again", holderHas(c, "one", "three"))
	got = list(t, c, true)
	if !fdtest.SameFile(t, got[1].Files[0], w3) {
		t.Error("the restarted holder's three is not the file put")
	}

	// Close leaves the holder's entries: napitapd's exit must not empty it.
	m.Close()
	if !holderHas(c, "one", "three")() {
		t.Errorf("after Mirror.Close, the holder has %q", names(list(t, c, false)))
	}
}

func TestAMirrorsFirstSyncDropsWhatItWasNotGiven(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	serve(t, path, 0)
	c := dial(t, path)
	// What a dead napitapd left: napitapd adopts "kept" and not "stale".
	_, w := pipe(t)
	for _, name := range []string{"kept", "stale"} {
		if err := c.Put(Entry{Name: name, Files: []*os.File{w}}); err != nil {
			t.Fatal(err)
		}
	}
	recovered, err := Recover(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	logger, _ := testLog(t)
	m := NewMirror(path, logger)
	defer m.Close()
	for _, e := range recovered {
		if e.Name == "kept" {
			m.Put(e)
		}
		closeFiles(e.Files)
	}
	if got := names(list(t, c, false)); !slices.Equal(got, []string{"kept", "stale"}) {
		t.Fatalf("before Start, the holder has %q: it must keep all until the first sync", got)
	}
	m.Start()
	eventually(t, "the first sync drops stale", func() bool {
		got, err := c.List(false)
		return err == nil && slices.Equal(names(got), []string{"kept"})
	})
}

// TestWhileAloneActsOnlyWhenNoClientHasBeenServedForTheTimeGiven: the
// holder's entries are its to act on (pkg/plainqueue) only once no
// napitapd has been there for a while, and none is served meanwhile.
func TestWhileAloneActsOnlyWhenNoClientHasBeenServedForTheTimeGiven(t *testing.T) {
	nstest.RequireRoot(t)
	path := filepath.Join(t.TempDir(), "fdstore.sock")
	h, _, _ := serve(t, path, 0)
	c := dial(t, path)
	_, w := pipe(t)
	if err := c.Put(Entry{Name: "p", Files: []*os.File{w}}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	record := func(name string, files []*os.File) { seen = append(seen, name) }
	if h.WhileAlone(0, record) {
		t.Fatal("WhileAlone ran while a client is served")
	}
	c.Close()
	eventually(t, "the holder alone", func() bool { return h.WhileAlone(0, func(string, []*os.File) {}) })
	if h.WhileAlone(time.Hour, record) {
		t.Fatal("WhileAlone(1h) ran just after the client left")
	}
	time.Sleep(20 * time.Millisecond)
	if !h.WhileAlone(10*time.Millisecond, record) || !slices.Equal(seen, []string{"p"}) {
		t.Fatalf("WhileAlone(10ms) 20 ms after the client left saw %q, want [p]", seen)
	}

	// A client that comes while fn runs is served once fn returns.
	listed := make(chan []Entry, 1)
	h.WhileAlone(0, func(string, []*os.File) {
		go func() {
			c, err := Dial(path)
			if err != nil {
				t.Error(err)
				close(listed)
				return
			}
			defer c.Close()
			entries, err := c.List(false)
			if err != nil {
				t.Error(err)
			}
			listed <- entries
		}()
		select {
		case <-listed:
			t.Error("a client was served while WhileAlone's fn ran")
		case <-time.After(200 * time.Millisecond):
		}
	})
	if got := names(<-listed); !slices.Equal(got, []string{"p"}) {
		t.Errorf("the client after WhileAlone listed %q, want [p]", got)
	}
}
