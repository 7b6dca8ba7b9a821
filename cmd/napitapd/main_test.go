package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// launchEnv makes the re-executed test binary `napitapctl launch -- true`
// against the seccomp socket it names.
const launchEnv = "NAPITAPD_TEST_LAUNCH"

func TestMain(m *testing.M) {
	if socket := os.Getenv(launchEnv); socket != "" {
		err := seccompagent.Launch(socket, []string{"true"}, os.Environ())
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
	mainexec.Run(m, "napitapd", main)
}

func waitFile(t testing.TB, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTheSeccompSocketIsServedBesideTheHandoffOne(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name    string
		seccomp string // the flag's value
	}{
		{"--seccomp-socket serves listeners from launch", filepath.Join(dir, "seccomp.sock")},
		{"an empty --seccomp-socket disables the agent", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sub := t.TempDir()
			socket := filepath.Join(sub, "napitapd.sock")
			cmd := mainexec.Command("napitapd", "--socket", socket, "--state-dir", filepath.Join(sub, "state"), "--seccomp-socket", tc.seccomp)
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			var log strings.Builder
			logDone := make(chan struct{})
			go func() {
				defer close(logDone)
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					log.WriteString(sc.Text() + "\n")
				}
			}()
			waitFile(t, socket)
			if tc.seccomp != "" {
				waitFile(t, tc.seccomp)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				launch := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
				launch.Env = append(os.Environ(), launchEnv+"="+tc.seccomp)
				if out, err := launch.CombinedOutput(); err != nil {
					t.Errorf("launch -- true against napitapd: %v: %s", err, out)
				}
			}
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			<-logDone
			if err := cmd.Wait(); err != nil {
				t.Fatalf("napitapd after SIGTERM: %v\n%s", err, log.String())
			}
			if tc.seccomp != "" {
				if _, err := os.Stat(tc.seccomp); err == nil {
					t.Errorf("%s is left after napitapd stopped", tc.seccomp)
				}
			}
			want := "seccomp-socket=" + tc.seccomp
			if tc.seccomp == "" {
				want = `seccomp-socket=""`
			}
			if !strings.Contains(log.String(), want) {
				t.Errorf("log lacks %q:\n%s", want, log.String())
			}
		})
	}
}
