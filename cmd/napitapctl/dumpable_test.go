package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/internal/nstest"
)

// TestTheVerbsThatWriteHostDirsAreClosedToARootWithoutCAPSYSPTRACE: the
// init containers' verbs write into the host's CNI bin dir and kubelet
// seccomp dir; a dumpable one would let a uid-0 process with hostPID and
// no capabilities hold a dirfd on /proc/PID/root/<host dir> and write
// there after it exits. Each verb runs as in the DaemonSet, as uid 0
// with no capability, and is held alive, its work done, by a
// stdout pipe that is already full.
func TestTheVerbsThatWriteHostDirsAreClosedToARootWithoutCAPSYSPTRACE(t *testing.T) {
	nstest.RequireRoot(t)
	plugin := filepath.Join(t.TempDir(), "napitap")
	if err := os.WriteFile(plugin, []byte("plugin"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    func(dir string) []string
		written string
	}{
		{"install-plugin", func(dir string) []string { return []string{"install-plugin", "--from=" + plugin, "--dir=" + dir} }, "napitap"},
		{"seccomp-profile --install", func(dir string) []string { return []string{"seccomp-profile", "--install=" + dir} }, "vmm.json"},
	}
	for _, tc := range tests {
		t.Run(tc.name+" is not dumpable", func(t *testing.T) {
			dir := t.TempDir()
			r, w := fullPipe(t)
			// As the init containers run: uid 0, no capability.
			cmd := nstest.AsCaplessRoot(t, mainexec.Command("napitapctl", tc.args(dir)...))
			cmd.Stdout, cmd.Stderr = w, w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			w.Close()
			drained := make(chan error, 1)
			defer func() {
				go func() { _, err := io.Copy(io.Discard, r); drained <- err }()
				if err := cmd.Wait(); err != nil {
					t.Errorf("napitapctl %s: %v", tc.name, err)
				}
				<-drained
			}()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if _, err := os.Stat(filepath.Join(dir, tc.written)); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("napitapctl %s wrote no %s in 10 s", tc.name, tc.written)
				}
			}
			nstest.CheckProcClosed(t, cmd.Process.Pid)
		})
	}
}

// fullPipe is a pipe whose buffer is full, so that the first write to w
// blocks until r is read.
func fullPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	rc, err := w.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	err = rc.Control(func(fd uintptr) {
		chunk := make([]byte, 4096)
		for {
			if _, werr = unix.Write(int(fd), chunk); werr != nil {
				break
			}
		}
	})
	if err != nil || !errors.Is(werr, unix.EAGAIN) {
		t.Fatalf("filling the pipe: %v, %v", err, werr)
	}
	return r, w
}
