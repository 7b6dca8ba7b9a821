package threadcred_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/threadcred"
)

// status is the lines of /proc/thread-self/status that hold credentials.
func status(t *testing.T) map[string]string {
	t.Helper()
	return statusOf(t, "/proc/thread-self/status")
}

// threads is the status of each thread of this process.
func threads(t *testing.T) []map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	var all []map[string]string
	for _, e := range ents {
		st := statusOf(t, "/proc/self/task/"+e.Name()+"/status")
		st["tid"] = e.Name()
		all = append(all, st)
	}
	return all
}

func statusOf(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			switch k {
			case "Uid", "Gid", "Groups", "CapEff", "CapPrm":
				got[k] = strings.Join(strings.Fields(v), " ")
			}
		}
	}
	return got
}

func TestTheThreadTakesOnTheCredentialsAndNothingElseDoes(t *testing.T) {
	nstest.RequireRoot(t)
	tests := []struct {
		name  string
		creds threadcred.Creds
		want  map[string]string
	}{
		{
			name:  "a uid with its groups and no capability",
			creds: threadcred.Creds{UID: 65534, GID: 65533, Groups: []uint32{1001, 1002}},
			want: map[string]string{"Uid": "0 65534 0 65534", "Gid": "0 65533 0 65533",
				"Groups": "1001 1002", "CapEff": "0000000000000000"},
		},
		{
			name:  "a uid with CAP_NET_ADMIN keeps only that",
			creds: threadcred.Creds{UID: 107, GID: 107, Caps: 1 << unix.CAP_NET_ADMIN},
			want: map[string]string{"Uid": "0 107 0 107", "Gid": "0 107 0 107",
				"Groups": "", "CapEff": "0000000000001000"},
		},
		{
			name:  "root with CAP_NET_ADMIN changes only its effective set",
			creds: threadcred.Creds{Caps: 1 << unix.CAP_NET_ADMIN},
			want: map[string]string{"Uid": "0 0 0 0", "Gid": "0 0 0 0",
				"Groups": "", "CapEff": "0000000000001000"},
		},
		{
			name:  "root with another gid and groups keeps its uid",
			creds: threadcred.Creds{GID: 107, Groups: []uint32{1001}},
			want: map[string]string{"Uid": "0 0 0 0", "Gid": "0 107 0 107",
				"Groups": "1001", "CapEff": "0000000000000000"},
		},
		{
			name:  "root without capabilities",
			creds: threadcred.Creds{},
			want: map[string]string{"Uid": "0 0 0 0", "Gid": "0 0 0 0",
				"Groups": "", "CapEff": "0000000000000000"},
		},
	}
	before := status(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got map[string]string
			if err := threadcred.Run(tc.creds, func() error { got = status(t); return nil }); err != nil {
				t.Fatal(err)
			}
			for k, want := range tc.want {
				if got[k] != want {
					t.Errorf("%s: %q, want %q", k, got[k], want)
				}
			}
			if got["CapPrm"] != before["CapPrm"] {
				t.Errorf("CapPrm %s, want napitapd's %s kept, for the way back", got["CapPrm"], before["CapPrm"])
			}
			// Between calls every thread of the process, those kept for
			// the next call among them, has the process's credentials.
			for _, th := range threads(t) {
				if th["Uid"] != before["Uid"] || th["Gid"] != before["Gid"] || th["CapEff"] != before["CapEff"] || th["Groups"] != before["Groups"] {
					t.Errorf("thread %s has %v, want %v", th["tid"], th, before)
				}
			}
		})
	}
}

func TestTheKernelJudgesTheThreadByTheCredentials(t *testing.T) {
	nstest.RequireRoot(t)
	secret := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(secret, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	// TempDir is 0700 root: let others reach the file itself.
	if err := os.Chmod(filepath.Dir(secret), 0o755); err != nil {
		t.Fatal(err)
	}
	err := threadcred.Run(threadcred.Creds{UID: 65534, GID: 65534}, func() error {
		_, err := os.ReadFile(secret)
		return err
	})
	if !errors.Is(err, unix.EACCES) {
		t.Errorf("reading a root-only file as 65534: %v, want EACCES", err)
	}
	if _, err := os.ReadFile(secret); err != nil {
		t.Errorf("root reading it after: %v", err)
	}
}

func TestAProcessOfTheCallersUIDCannotSignalTheThread(t *testing.T) {
	nstest.RequireRoot(t)
	err := threadcred.Run(threadcred.Creds{UID: 107, GID: 107}, func() error {
		// kill(tid, 0) checks the permission to signal that very thread.
		cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -0 %d", unix.Gettid()))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 107, Gid: 107}}
		// Forked from another thread: this one may not set a uid.
		type res struct {
			out []byte
			err error
		}
		done := make(chan res)
		go func() { out, err := cmd.CombinedOutput(); done <- res{out, err} }()
		r := <-done
		out, err := r.out, r.err
		if err == nil {
			return fmt.Errorf("uid 107 may signal the thread acting as it, and so SIGKILL napitapd")
		}
		if !strings.Contains(string(out), "not permitted") {
			return fmt.Errorf("kill -0 as uid 107: %v: %s", err, out)
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// runRecovering is threadcred.Run with a panic out of it recovered, on the
// calling goroutine.
func runRecovering(c threadcred.Creds, fn func() error) (panicked any, err error) {
	defer func() { panicked = recover() }()
	err = threadcred.Run(c, fn)
	return nil, err
}

func TestTheThreadGoesBackToItsOwnCredentialsHoweverFnEnds(t *testing.T) {
	nstest.RequireRoot(t)
	errFn := errors.New("fn failed")
	const panicked = "fn panicked"
	tests := []struct {
		name      string
		creds     threadcred.Creds
		fn        func() error
		wantErr   error // errors.Is, when not a *threadcred.Error
		credErr   bool  // a *threadcred.Error, and fn did not run
		wantPanic any
	}{
		{name: "fn returns nil, and so does Run", creds: threadcred.Creds{UID: 65534, GID: 65534},
			fn: func() error { return nil }},
		{name: "fn returns an error, and Run returns it", creds: threadcred.Creds{UID: 65534, GID: 65534},
			fn: func() error { return errFn }, wantErr: errFn},
		{name: "fn panics, and the panic goes on to Run's caller", creds: threadcred.Creds{UID: 65534, GID: 65534, Groups: []uint32{1001}},
			fn: func() error { panic(panicked) }, wantPanic: panicked},
		// The uid is changed before the capabilities are found wanting.
		{name: "a capability napitapd lacks stops Run halfway, before fn", creds: threadcred.Creds{UID: 65534, GID: 65534, Caps: 1 << 63},
			fn: func() error { return nil }, credErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Locked here too (the locks nest), so that this goroutine is
			// still on Run's thread after Run, whether Run let go of its
			// own lock or not, and reads that thread's credentials.
			runtime.LockOSThread()
			before := status(t)
			tid := unix.Gettid()
			ran := false
			p, err := runRecovering(tc.creds, func() error { ran = true; return tc.fn() })
			after := status(t)
			if unix.Gettid() != tid {
				t.Fatalf("the test's goroutine moved from thread %d to %d", tid, unix.Gettid())
			}
			var credErr *threadcred.Error
			switch {
			case p != tc.wantPanic:
				t.Errorf("Run panicked with %v, want %v", p, tc.wantPanic)
			case tc.credErr && (!errors.As(err, &credErr) || ran):
				t.Errorf("Run: %v, fn ran: %v; want a *threadcred.Error, and fn not run", err, ran)
			case !tc.credErr && !errors.Is(err, tc.wantErr):
				t.Errorf("Run: %v, want %v", err, tc.wantErr)
			}
			back := true
			for _, k := range []string{"Uid", "Gid", "Groups", "CapEff", "CapPrm"} {
				if after[k] != before[k] {
					t.Errorf("%s after Run: %q, want the thread's own %q", k, after[k], before[k])
					back = false
				}
			}
			if back {
				runtime.UnlockOSThread()
			}
			// Else still locked: Go ends the thread with this goroutine,
			// and no other test runs with what was left on it.
		})
	}
}

// BenchmarkRun measures Run around an empty fn, with the credentials the
// seccomp agent gives KubeVirt's QEMU (uid 107, no capability) and a root
// runtime (CAP_NET_ADMIN over its netns).
//
//	CI=true go test -run '^$' -bench Run ./pkg/threadcred/
func BenchmarkRun(b *testing.B) {
	nstest.RequireRoot(b)
	for _, bc := range []struct {
		name  string
		creds threadcred.Creds
	}{
		{"uid 107", threadcred.Creds{UID: 107, GID: 107}},
		{"root with CAP_NET_ADMIN", threadcred.Creds{Caps: 1 << unix.CAP_NET_ADMIN}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := threadcred.Run(bc.creds, func() error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
