package install_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/pkg/install"
)

var (
	newPlugin = []byte("#!/bin/sh\necho new napitap\n")
	oldPlugin = []byte("#!/bin/sh\necho old napitap\n")
)

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func write(t *testing.T, path string, b []byte, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
}

func TestExecutable(t *testing.T) {
	tests := []struct {
		name string
		// prepare makes the source and the bin dir's contents, and returns
		// the source, the dir and the name to install as.
		prepare func(t *testing.T, src, dir string) (string, string, string)
		wantErr string
		// want is what dir/name holds afterwards; nil: nothing there.
		want     []byte
		wantPrev string // Result.Previous
		wantLink bool   // dir/name is still a symlink
	}{
		{
			name:    "a first install writes the plugin, executable",
			prepare: func(t *testing.T, src, dir string) (string, string, string) { return src, dir, "napitap" },
			want:    newPlugin,
		},
		{
			name: "an install replaces an older plugin and names its digest",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				write(t, filepath.Join(dir, "napitap"), oldPlugin, 0o755)
				return src, dir, "napitap"
			},
			want:     newPlugin,
			wantPrev: digest(oldPlugin),
		},
		{
			name: "an install fixes the mode of a plugin that was not executable",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				write(t, filepath.Join(dir, "napitap"), newPlugin, 0o600)
				return src, dir, "napitap"
			},
			want:     newPlugin,
			wantPrev: digest(newPlugin),
		},
		{
			name: "a symlink where the plugin goes is refused and left alone",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				elsewhere := filepath.Join(t.TempDir(), "napitap")
				write(t, elsewhere, oldPlugin, 0o755)
				if err := os.Symlink(elsewhere, filepath.Join(dir, "napitap")); err != nil {
					t.Fatal(err)
				}
				return src, dir, "napitap"
			},
			wantErr:  "is a symlink",
			want:     oldPlugin,
			wantLink: true,
		},
		{
			name: "a directory where the plugin goes is refused",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				if err := os.Mkdir(filepath.Join(dir, "napitap"), 0o755); err != nil {
					t.Fatal(err)
				}
				return src, dir, "napitap"
			},
			wantErr: "is a directory",
		},
		{
			name: "a missing source fails and leaves the installed plugin",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				write(t, filepath.Join(dir, "napitap"), oldPlugin, 0o755)
				return src + ".missing", dir, "napitap"
			},
			wantErr: "no such file",
			want:    oldPlugin,
		},
		{
			name: "a directory as the source is refused",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				return filepath.Dir(src), dir, "napitap"
			},
			wantErr: "is a directory, not a file",
		},
		{
			name: "a bin dir that is a file is refused",
			prepare: func(t *testing.T, src, dir string) (string, string, string) {
				file := filepath.Join(dir, "file")
				write(t, file, nil, 0o644)
				return src, file, "napitap"
			},
			wantErr: "is not a directory",
		},
		{
			name:    "a name that is a path is refused",
			prepare: func(t *testing.T, src, dir string) (string, string, string) { return src, dir, "../napitap" },
			wantErr: "not a file name",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(t.TempDir(), "napitap")
			write(t, src, newPlugin, 0o644)
			dir := t.TempDir()
			src, into, name := tc.prepare(t, src, dir)
			before := entries(t, dir)

			res, err := install.Executable(src, into, name)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Executable: %v, want an error saying %q", err, tc.wantErr)
				}
				// A failed install leaves no temporary file behind.
				if after := entries(t, dir); !slices.Equal(after, before) {
					t.Errorf("the bin dir held %v, now %v", before, after)
				}
			} else {
				if err != nil {
					t.Fatalf("Executable: %v", err)
				}
				t.Log(res)
				if res.Path != filepath.Join(dir, name) || res.Size != int64(len(newPlugin)) || res.SHA256 != digest(newPlugin) || res.Previous != tc.wantPrev {
					t.Errorf("result %+v, want %d bytes of sha256 %s replacing %q", res, len(newPlugin), digest(newPlugin), tc.wantPrev)
				}
				if after := entries(t, dir); !slices.Equal(after, []string{name}) {
					t.Errorf("the bin dir holds %v, want only %s", after, name)
				}
			}
			dst := filepath.Join(dir, "napitap")
			st, lerr := os.Lstat(dst)
			if tc.wantLink != (lerr == nil && st.Mode()&os.ModeSymlink != 0) {
				t.Errorf("%s: %v, %v; still a symlink: want %v", dst, st, lerr, tc.wantLink)
			}
			if tc.want != nil {
				got, err := os.ReadFile(dst)
				if err != nil || !bytes.Equal(got, tc.want) {
					t.Errorf("%s holds %q (%v), want %q", dst, got, err, tc.want)
				}
			}
			if tc.wantErr == "" {
				if st.Mode() != 0o755 {
					t.Errorf("%s: mode %v, want 0755", dst, st.Mode())
				}
			}
		})
	}
}

// The reason for the rename: the plugin is replaced while an old one
// runs, and the next exec runs the new one.
func TestExecutableReplacesARunningPlugin(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary to stand in for a running plugin")
	}
	old, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dst := filepath.Join(dir, "napitap")
	write(t, dst, old, 0o755)
	running := exec.Command(dst, "30")
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = running.Process.Kill(); _ = running.Wait() })
	time.Sleep(50 * time.Millisecond)

	// What the rename avoids: opening a running executable for writing.
	if f, err := os.OpenFile(dst, os.O_WRONLY, 0); errors.Is(err, syscall.ETXTBSY) {
		t.Logf("writing into the running plugin: %v", err)
	} else if err == nil {
		f.Close()
		t.Log("this kernel lets a running executable be opened for writing; the rename still keeps an exec from seeing half a file")
	}

	src := filepath.Join(t.TempDir(), "napitap")
	write(t, src, newPlugin, 0o644)
	res, err := install.Executable(src, dir, "napitap")
	if err != nil {
		t.Fatalf("install over the running plugin: %v", err)
	}
	t.Log(res)
	if res.Previous != digest(old) {
		t.Errorf("replaced sha256 %s, want the running one's %s", res.Previous, digest(old))
	}
	if out, err := exec.Command(dst).Output(); err != nil || string(out) != "new napitap\n" {
		t.Errorf("the installed plugin runs: %q, %v", out, err)
	}
	if err := running.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("the old plugin stopped running: %v", err)
	}
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}
