package takeover

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	_ "github.com/napitap/napitap/internal/ownuserns"
	"github.com/napitap/napitap/pkg/buildinfo"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/peer"
)

// dialEnv makes the re-executed test binary send a hello to the takeover
// socket it names and print the answer.
const dialEnv = "NAPITAP_TAKEOVER_DIAL"

// fakeServerEnv makes the re-executed test binary serve a takeover
// socket at the path it names as an impostor would: accept any hello,
// claim the pid in fakeClaimEnv (its own if empty), and send a file.
const (
	fakeServerEnv = "NAPITAP_TAKEOVER_FAKE_SERVER"
	fakeClaimEnv  = "NAPITAP_TAKEOVER_FAKE_CLAIM"
)

func TestMain(m *testing.M) {
	if path := os.Getenv(fakeServerEnv); path != "" {
		fakeServer(path, os.Getenv(fakeClaimEnv))
		os.Exit(0)
	}
	if path := os.Getenv(dialEnv); path != "" {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			if err = send(c, &message{Op: opHello, Versions: []int{Version}}, nil); err == nil {
				_, _, err = recv(c, opAccept)
			}
		}
		fmt.Println("answer:", err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func fakeServer(path, claim string) {
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		fmt.Println("listen:", err)
		return
	}
	fmt.Println("ready")
	c, err := l.AcceptUnix()
	if err != nil {
		return
	}
	pid := os.Getpid()
	if claim != "" {
		fmt.Sscan(claim, &pid)
	}
	f, _ := os.Open(os.DevNull)
	if _, _, err := recv(c, opHello); err == nil && send(c, &message{Op: opAccept, Pid: pid}, nil) == nil {
		_ = sendFiles(c, []File{{Item: Item{Kind: KindLock}, File: f}})
		_, _, _ = recv(c, opReady)
	}
}

// fakeDaemon hands over files and records what became of them.
type fakeDaemon struct {
	files           []File
	detached        chan struct{}
	resumed, handed chan []File
}

func (d *fakeDaemon) Detach() []File      { close(d.detached); return d.files }
func (d *fakeDaemon) Resume(files []File) { d.resumed <- files }
func (d *fakeDaemon) Handed(files []File) { d.handed <- files }

// serveFake serves a takeover socket in a new state dir with a fakeDaemon
// holding n files (/dev/null opens), and those of more, and returns both.
func serveFake(t *testing.T, n int, more func(stateDir string) []File) (string, *fakeDaemon, *bytes.Buffer) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the peer must be uid 0")
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	d := &fakeDaemon{detached: make(chan struct{}), resumed: make(chan []File, 1), handed: make(chan []File, 1)}
	for i := range n {
		f, err := os.Open(os.DevNull)
		if err != nil {
			t.Fatal(err)
		}
		item := Item{Kind: KindQueue, Key: &handoff.Key{ContainerID: fmt.Sprintf("c%d", i/4), IfName: "net1"}}
		if i%3 == 0 {
			item = Item{Kind: KindListener, UID: uint32(i), Origin: strings.Repeat("pod x/y container \"vmm\" ", 10) + fmt.Sprint(i)}
		}
		d.files = append(d.files, File{Item: item, File: f})
	}
	if more != nil {
		d.files = append(d.files, more(stateDir)...)
	}
	t.Cleanup(func() { CloseAll(d.files) })
	l, err := Listen(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	done := make(chan struct{})
	go func() { _ = Serve(context.Background(), l, d, slog.New(slog.NewTextHandler(&log, nil))); close(done) }()
	t.Cleanup(func() { l.Close(); <-done })
	return stateDir, d, &log
}

func sameFile(a, b *os.File) bool {
	var sa, sb unix.Stat_t
	return unix.Fstat(int(a.Fd()), &sa) == nil && unix.Fstat(int(b.Fd()), &sb) == nil && sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestATakeoverHandsEveryFileOverOrNone(t *testing.T) {
	tests := []struct {
		name  string
		files int
		// end is what the new napitapd does with the offer.
		end        func(o *Offer) error
		wantHanded bool
	}{
		{"a new napitapd that accepts gets every file, in batches, and the old one lets go", 600, (*Offer).Accept, true},
		{"a new napitapd that declines makes the old one serve again", 5, func(o *Offer) error { o.Decline(errors.New("test")); return nil }, false},
		{"a new napitapd that hangs up before ready makes the old one serve again", 5, func(o *Offer) error { o.conn.Close(); CloseAll(o.Files); return nil }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stateDir, d, log := serveFake(t, tc.files, nil)
			o, err := Request(stateDir)
			if err != nil {
				t.Fatalf("Request: %v", err)
			}
			if len(o.Files) != tc.files {
				t.Fatalf("offer of %d files, want %d", len(o.Files), tc.files)
			}
			if o.From != buildinfo.Version() || !strings.Contains(log.String(), "new_version="+buildinfo.Version()) {
				t.Errorf("the offer names the old napitapd's version %q, want %q; each side logs the other's:\n%s", o.From, buildinfo.Version(), log.String())
			}
			for i, f := range o.Files {
				if f.Item.Kind != d.files[i].Item.Kind || f.Item.Origin != d.files[i].Item.Origin || !sameFile(f.File, d.files[i].File) {
					t.Fatalf("file %d: %+v, want %+v and the same file", i, f.Item, d.files[i].Item)
				}
			}
			if err := tc.end(o); err != nil {
				t.Fatalf("end: %v", err)
			}
			if tc.wantHanded {
				CloseAll(o.Files)
			}
			select {
			case got := <-d.handed:
				if !tc.wantHanded || len(got) != tc.files {
					t.Errorf("handed %d files, want handed: %v", len(got), tc.wantHanded)
				}
			case got := <-d.resumed:
				if tc.wantHanded || len(got) != tc.files {
					t.Errorf("resumed with %d files, want handed: %v", len(got), tc.wantHanded)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("the old napitapd neither let go nor resumed; log:\n%s", log)
			}
		})
	}
}

func TestARequestTheOldOneCannotServeStopsNothing(t *testing.T) {
	tests := []struct {
		name  string
		hello []byte
		// as runs the hello as another uid (0: the test's own).
		as       uint32
		wantLog  string
		wantSaid string // in the answer (a hang-up: EOF or EPIPE)
	}{
		{"a hello of another version only is refused with the version spoken", []byte(`{"version":2,"op":"hello","versions":[2]}`), 0, "no version in common", "speaks takeover version 1, not [2]"},
		{"a malformed hello is refused", []byte(`{"op":`), 0, "no hello", "malformed"},
		{"a hello that is not a hello is refused", []byte(`{"version":1,"op":"ready"}`), 0, "no hello", `got "ready"`},
		{"a peer that is not root is refused", nil, 65534, "refused a peer that is not root", ""},
		{"a root peer without napitapd's capabilities is refused before a word", nil, capless, "refused a peer that is not a napitapd", ""},
		{"a root peer with every capability in a user namespace of its own is refused before a word", nil, inOwnUserns, "only in a user namespace of its own", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stateDir, d, log := serveFake(t, 1, nil)
			var answer string
			if tc.as != 0 {
				// Let the other uid reach the socket; napitapd's is root's.
				for _, p := range []string{filepath.Dir(filepath.Dir(stateDir)), filepath.Dir(stateDir), stateDir} {
					if err := os.Chmod(p, 0o755); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Chmod(Socket(stateDir), 0o666); err != nil {
					t.Fatal(err)
				}
				// The test binary's own dir is root's alone.
				bin := filepath.Join(filepath.Dir(stateDir), "takeover.test")
				if b, err := os.ReadFile(os.Args[0]); err != nil || os.WriteFile(bin, b, 0o755) != nil {
					t.Fatalf("copy the test binary: %v", err)
				}
				cmd := exec.Command(bin, "-test.run=^$")
				cmd.Env = append(os.Environ(), dialEnv+"="+Socket(stateDir))
				switch tc.as {
				case capless:
					cmd = nstest.AsCaplessRoot(t, cmd)
				case inOwnUserns:
					cmd = nstest.AsRootInOwnUserns(t, cmd)
				default:
					cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: tc.as, Gid: tc.as}}
				}
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("helper: %v: %s", err, out)
				}
				answer = string(out)
			} else {
				c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: Socket(stateDir), Net: "unixpacket"})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := c.Write(tc.hello); err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, _, err = recv(c, opAccept)
				answer = fmt.Sprint(err)
			}
			if !strings.Contains(answer, tc.wantSaid) {
				t.Errorf("answer %q lacks %q", answer, tc.wantSaid)
			}
			// The old one serves on, and takes a proper request after.
			o, err := Request(stateDir)
			if err != nil {
				t.Fatalf("Request after: %v", err)
			}
			o.Decline(errors.New("test"))
			<-d.resumed
			if !strings.Contains(log.String(), tc.wantLog) {
				t.Errorf("log lacks %q:\n%s", tc.wantLog, log)
			}
		})
	}
}

// capless, as a uid in TestARequestTheOldOneCannotServeStopsNothing, is
// root without any capability: a pod's root. inOwnUserns is capless root
// with every capability in a user namespace of its own (DESIGN.md fact 25).
const (
	capless     = ^uint32(0)
	inOwnUserns = ^uint32(1)
)

// TestANapitapdTakesNothingFromAPeerThatIsNotANapitapd: whatever answers
// on the takeover socket must be a napitapd holding the other end of the
// connection, or the new napitapd takes none of its files.
func TestANapitapdTakesNothingFromAPeerThatIsNotANapitapd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	tests := []struct {
		name    string
		capless bool
		userns  bool   // capless, with every capability in a user namespace of its own
		claim   string // the pid the impostor says it is
		want    string
	}{
		{"a root impostor without napitapd's capabilities", true, false, "", "lacks capabilities"},
		{"a root impostor with every capability in a user namespace of its own", false, true, "", "only in a user namespace of its own"},
		{"an impostor that names a real napitapd's pid", true, false, fmt.Sprint(os.Getpid()), "does not hold the other end"},
		{"a root impostor with every capability but naming pid 1", false, false, "1", "does not hold the other end"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stateDir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(stateDir, 0o700); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fakeServerEnv+"="+Socket(stateDir), fakeClaimEnv+"="+tc.claim)
			switch {
			case tc.capless:
				cmd = nstest.AsCaplessRoot(t, cmd)
			case tc.userns:
				cmd = nstest.AsRootInOwnUserns(t, cmd)
			}
			out, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
				t.Fatalf("impostor: %q", line)
			}
			o, err := Request(stateDir)
			if err == nil {
				CloseAll(o.Files)
				t.Fatalf("took %d files from an impostor", len(o.Files))
			}
			if !errors.Is(err, peer.ErrNotNapitapd) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Request: %v; want a refusal saying %q", err, tc.want)
			}
		})
	}
}

func TestAcquireNeverMakesTwoDaemonsOfOneStateDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	t.Run("with no napitapd it takes the lock, and a second Acquire finds it held", func(t *testing.T) {
		stateDir := filepath.Join(t.TempDir(), "state")
		lock, offer, err := Acquire(context.Background(), stateDir, filepath.Join(stateDir, "none.sock"), quiet)
		if err != nil || lock == nil || offer != nil {
			t.Fatalf("Acquire: %v, %v, %v; want the lock", lock, offer, err)
		}
		defer lock.Close()
		if _, err := TryLock(stateDir); !errors.Is(err, ErrLocked) {
			t.Errorf("TryLock while held: %v, want ErrLocked", err)
		}
	})
	t.Run("with a napitapd serving it takes over, and the lock comes along", func(t *testing.T) {
		var lock *os.File
		stateDir, d, _ := serveFake(t, 0, func(stateDir string) []File {
			var err error
			if lock, err = TryLock(stateDir); err != nil {
				t.Fatal(err)
			}
			return []File{{Item: Item{Kind: KindLock}, File: lock}}
		})
		got, offer, err := Acquire(context.Background(), stateDir, "", quiet)
		if err != nil || got != nil || offer == nil {
			t.Fatalf("Acquire: %v, %v, %v; want an offer", got, offer, err)
		}
		if err := offer.Accept(); err != nil {
			t.Fatal(err)
		}
		<-d.handed
		lock.Close() // the old one exits
		d.files = nil
		if _, err := TryLock(stateDir); !errors.Is(err, ErrLocked) {
			t.Errorf("TryLock after the old one closed its copy: %v, want ErrLocked (the new one holds it)", err)
		}
		CloseAll(offer.Files)
	})
	t.Run("with a napitapd that holds the lock and no takeover socket it waits for its exit", func(t *testing.T) {
		stateDir := filepath.Join(t.TempDir(), "state")
		lock, err := TryLock(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		var log bytes.Buffer
		time.AfterFunc(500*time.Millisecond, func() { lock.Close() })
		start := time.Now()
		got, offer, err := Acquire(context.Background(), stateDir, "", slog.New(slog.NewTextHandler(&log, nil)))
		if err != nil || got == nil || offer != nil {
			t.Fatalf("Acquire: %v, %v, %v; want the lock", got, offer, err)
		}
		got.Close()
		if waited := time.Since(start); waited < 400*time.Millisecond {
			t.Errorf("Acquire returned after %v, before the other let go", waited)
		}
		if !strings.Contains(log.String(), "cannot be taken over") {
			t.Errorf("log lacks why it waits:\n%s", log.String())
		}
	})
	t.Run("with a napitapd from before the lock serving the socket it waits", func(t *testing.T) {
		dir := t.TempDir()
		socket := filepath.Join(dir, "napitapd.sock")
		l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		time.AfterFunc(500*time.Millisecond, func() { l.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		got, _, err := Acquire(ctx, filepath.Join(dir, "state"), socket, quiet)
		if err != nil || got == nil {
			t.Fatalf("Acquire: %v, %v", got, err)
		}
		got.Close()
		if waited := time.Since(start); waited < 400*time.Millisecond {
			t.Errorf("Acquire returned after %v, while the old one served", waited)
		}
	})
	t.Run("a napitapd restarted while it waits for one from before the lock still waits", func(t *testing.T) {
		dir := t.TempDir()
		socket := filepath.Join(dir, "napitapd.sock")
		l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for i := range 2 {
			ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
			got, _, err := Acquire(ctx, filepath.Join(dir, "state"), socket, quiet)
			cancel()
			if err == nil {
				got.Close()
				t.Fatalf("Acquire %d took the lock while the old napitapd served", i+1)
			}
		}
	})
	t.Run("with a lock file left by a napitapd that died and its socket kept by the fd holder it takes the lock at once", func(t *testing.T) {
		dir := t.TempDir()
		stateDir := filepath.Join(dir, "state")
		dead, err := TryLock(stateDir)
		if err != nil {
			t.Fatal(err)
		}
		dead.Close()
		socket := filepath.Join(dir, "napitapd.sock")
		held, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socket, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer held.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		got, offer, err := Acquire(ctx, stateDir, socket, quiet)
		if err != nil || got == nil || offer != nil {
			t.Fatalf("Acquire: %v, %v, %v; want the lock at once", got, offer, err)
		}
		got.Close()
	})
}
