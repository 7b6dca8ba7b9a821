package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/handoff"
)

// TestReadyPassesOnlyForTheContainersOwnNapitapd: during a rollout the old
// pod's napitapd answers the shared socket until the new one takes over,
// so the readiness probe asks which napitapd answers, not only whether one
// does. A probe in another mount namespace (another container) than the
// napitapd's is not ready.
func TestReadyPassesOnlyForTheContainersOwnNapitapd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, for napitapd's state dir and a mount namespace")
	}
	dir := t.TempDir()
	socket := filepath.Join(dir, "napitapd.sock")
	logs := &syncbuf.Buffer{}
	srv, err := handoff.NewServer(filepath.Join(dir, "state"), slog.New(slog.NewTextHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	l, err := handoff.Listen(socket, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), l) }()
	t.Cleanup(func() { l.Close(); <-done; srv.Close() })

	tests := []struct {
		name     string
		verb     string
		unshare  uintptr
		wantCode int
		want     string
	}{
		{"a probe in napitapd's own mount namespace is ready", "ready", 0, 0, "of this container, serves " + socket},
		{"a probe in another container's mount namespace is not", "ready", syscall.CLONE_NEWNS, 1, "of another container"},
		{"version names the answering napitapd's version and pid", "version", 0, 0, fmt.Sprintf("napitapd dev (pid %d, at %s)", os.Getpid(), socket)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := mainexec.Command("napitapctl", "--socket", socket, tc.verb)
			cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: tc.unshare}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			check(t, code, out.String(), tc.wantCode, []string{tc.want}, nil)
		})
	}
}
