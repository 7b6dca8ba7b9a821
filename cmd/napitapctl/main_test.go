package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// mainEnv makes the re-executed test binary run napitapctl's main with
// the arguments that follow "--".
const mainEnv = "NAPITAPCTL_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" {
		for i, a := range os.Args {
			if a == "--" {
				os.Args = append([]string{"napitapctl"}, os.Args[i+1:]...)
				break
			}
		}
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func napitapctl(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^$", "--"}, args...)...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, out.String()
}

func TestLaunch(t *testing.T) {
	dir := t.TempDir()
	socket := filepath.Join(dir, "seccomp.sock")
	stop, err := seccompagent.Start(socket, 0o600, -1, &seccompagent.MapRegistry{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"a command runs under the agent and its exit status is its own", []string{"launch", "--seccomp-socket", socket, "--", "sh", "-c", "exit 7"}, 7, ""},
		{"the command runs under the filter", []string{"launch", "--seccomp-socket", socket, "--", "grep", "^Seccomp:", "/proc/self/status"}, 0, "Seccomp:\t2"},
		{"a command's output passes through", []string{"launch", "--seccomp-socket", socket, "--", "echo", "hello"}, 0, "hello"},
		{"no agent at the socket is an error naming it, and nothing runs", []string{"launch", "--seccomp-socket", filepath.Join(dir, "none.sock"), "--", "echo", "ran"}, 1, "none.sock"},
		{"a command that does not exist is an error before any filter", []string{"launch", "--seccomp-socket", socket, "--", "napitap-no-such-command"}, 1, "executable file not found"},
		{"launch without a command is a usage error", []string{"launch", "--seccomp-socket", socket}, 2, "usage"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := napitapctl(t, tc.args...)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Errorf("exit %d, output %q; want exit %d, output with %q", code, out, tc.wantCode, tc.wantOut)
			}
			if tc.wantCode == 1 && strings.Contains(out, "ran") {
				t.Errorf("the command ran: %q", out)
			}
		})
	}
}

func TestExpandArgs(t *testing.T) {
	withMAC := &handoff.Attachment{Key: handoff.Key{ContainerID: "c1", IfName: "net1"}, TapName: "tap1", Queues: 2, MAC: "02:00:00:00:00:aa"}
	noMAC := &handoff.Attachment{Key: handoff.Key{ContainerID: "c1", IfName: "net1"}, TapName: "tap1", Queues: 2}
	tests := []struct {
		name    string
		att     *handoff.Attachment
		argv    []string
		want    []string
		wantErr string
	}{
		{"QEMU's placeholders become fds, the queue count and the guest MAC", withMAC,
			[]string{"qemu", "-netdev", "tap,id=n0,fds={fds},queues={queues}", "-device", "virtio-net-pci,netdev=n0,mac={mac}"},
			[]string{"qemu", "-netdev", "tap,id=n0,fds=3:4,queues=2", "-device", "virtio-net-pci,netdev=n0,mac=02:00:00:00:00:aa"}, ""},
		{"Cloud Hypervisor's fd list is comma-separated", withMAC,
			[]string{"cloud-hypervisor", "--net", "fd=[{fds,}],mac={mac}"},
			[]string{"cloud-hypervisor", "--net", "fd=[3,4],mac=02:00:00:00:00:aa"}, ""},
		{"an attachment without a MAC serves a command line that does not ask for one", noMAC,
			[]string{"qemu", "fds={fds}"}, []string{"qemu", "fds=3:4"}, ""},
		{"an attachment without a MAC fails {mac} naming the attachment, not with an empty mac=", noMAC,
			[]string{"qemu", "mac={mac}"}, nil, `{mac}: napitapd has no guest MAC for attachment c1/net1 (tap "tap1")`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := expandArgs(tc.att, 2, tc.argv)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("expandArgs = %q, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("expandArgs = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
