package threadcred_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/threadcred"
)

// status is the lines of /proc/thread-self/status that hold credentials.
func status(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/status")
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
			want: map[string]string{"Uid": "65534 65534 65534 65534", "Gid": "65533 65533 65533 65533",
				"Groups": "1001 1002", "CapEff": "0000000000000000", "CapPrm": "0000000000000000"},
		},
		{
			name:  "a uid with CAP_NET_ADMIN keeps only that",
			creds: threadcred.Creds{UID: 107, GID: 107, Caps: 1 << unix.CAP_NET_ADMIN},
			want: map[string]string{"Uid": "107 107 107 107", "Gid": "107 107 107 107",
				"Groups": "", "CapEff": "0000000000001000", "CapPrm": "0000000000001000"},
		},
		{
			name:  "root without capabilities",
			creds: threadcred.Creds{},
			want: map[string]string{"Uid": "0 0 0 0", "Gid": "0 0 0 0",
				"Groups": "", "CapEff": "0000000000000000", "CapPrm": "0000000000000000"},
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
			// The process and the calling goroutine keep their own.
			for i := 0; i < 10; i++ {
				if now := status(t); now["Uid"] != before["Uid"] || now["CapEff"] != before["CapEff"] {
					t.Fatalf("after Run, this thread has %v, want %v", now, before)
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
