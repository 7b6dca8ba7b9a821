package safefile_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/safefile"
)

func TestTrustedDir(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name    string
		prepare func(dir string) string // returns the path to check
		wantErr string
	}{
		{"a directory it makes is trusted", func(dir string) string { return filepath.Join(dir, "new", "state") }, ""},
		{"a root-owned 0755 directory is trusted", func(dir string) string {
			p := filepath.Join(dir, "ok")
			mustMkdir(t, p, 0o755)
			return p
		}, ""},
		{"a directory another uid owns is refused", func(dir string) string {
			p := filepath.Join(dir, "theirs")
			mustMkdir(t, p, 0o700)
			if err := os.Chown(p, 3000, 3000); err != nil {
				t.Fatal(err)
			}
			return p
		}, "owned by uid 3000"},
		{"a directory others may write is refused", func(dir string) string {
			p := filepath.Join(dir, "open")
			mustMkdir(t, p, 0o777)
			return p
		}, "lets group or others write"},
		{"a group-writable directory is refused", func(dir string) string {
			p := filepath.Join(dir, "group")
			mustMkdir(t, p, 0o770)
			return p
		}, "lets group or others write"},
		{"a symlink to a directory is refused", func(dir string) string {
			p := filepath.Join(dir, "link")
			if err := os.Symlink(dir, p); err != nil {
				t.Fatal(err)
			}
			return p
		}, "not a directory"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := safefile.TrustedDir(tc.prepare(t.TempDir()), 0o700)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("TrustedDir: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("TrustedDir: %v, want an error saying %q", err, tc.wantErr)
			}
		})
	}
}

func TestWriteAtomicNeverWritesThroughASymlink(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ctr:net1.json")
	if err := os.Symlink(victim, path+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := safefile.WriteAtomic(path, []byte("state"), 0o600); err != nil {
		t.Fatalf("WriteAtomic: %v", err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "precious" {
		t.Errorf("the symlink's target now holds %q", b)
	}
	if b, _ := os.ReadFile(path); string(b) != "state" {
		t.Errorf("%s holds %q, want %q", path, b, "state")
	}
	if _, err := os.Lstat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temp file left behind: %v", err)
	}
}

func mustMkdir(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}
