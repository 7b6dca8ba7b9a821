package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
)

func TestMain(m *testing.M) { mainexec.Run(m, "napitapctl", main) }

func napitapctl(t *testing.T, args ...string) (int, string) {
	t.Helper()
	return napitapctlAs(t, nil, os.Args[0], args...)
}

// napitapctlAs runs napitapctl's main from the test binary bin, as cred
// (nil: as the test).
func napitapctlAs(t *testing.T, cred *syscall.Credential, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := mainexec.CommandContext(ctx, "napitapctl", args...)
	cmd.Path, cmd.Args[0] = bin, bin
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
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

// TestMessages: napitapctl's command-line mistakes say what is wrong
// without connecting, --help prints the usage, and a socket the caller may
// not connect to names the socket and the group that would let it in.
func TestMessages(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "none.sock")
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     []string
		notWant  []string
	}{
		{"--container without --ifname says both are needed", []string{"--socket", missing, "exec", "--container", "c1", "--", "true"}, 2,
			[]string{"--container and --ifname name an attachment together: give both, or neither"}, []string{"unreachable"}},
		{"--ifname without --container says both are needed", []string{"--socket", missing, "exec", "--ifname", "net1", "--", "true"}, 2,
			[]string{"--container and --ifname name an attachment together: give both, or neither"}, []string{"unreachable"}},
		{"exec without a command says so", []string{"--socket", missing, "exec", "--container", "c1", "--ifname", "net1"}, 2,
			[]string{"exec: no command to run"}, []string{"unreachable"}},
		{"list --help prints list's usage alone and connects to nothing", []string{"--socket", missing, "list", "--help"}, 0,
			[]string{"usage:", "napitapctl [--socket PATH] list"}, []string{"unreachable", "napitapctl wait"}},
		{"help prints every verb's usage", []string{"help"}, 0,
			[]string{"usage:", "napitapctl [--socket PATH] list", "napitapctl wait", "napitapctl help [VERB]"}, nil},
		{"help VERB prints that verb's usage alone", []string{"help", "queues"}, 0,
			[]string{"usage:", "napitapctl queues --netns PATH --tap NAME", "--container ID --ifname IF"}, []string{"napitapctl wait"}},
		{"help of an unknown verb says so", []string{"help", "lsit"}, 2,
			[]string{`help: no verb "lsit"`}, nil},
		{"--socket after the verb is the socket napitapctl dials", []string{"list", "--socket", missing}, 1,
			[]string{"napitapd unreachable", missing}, []string{"flag provided but not defined"}},
		{"list -h prints the usage", []string{"--socket", missing, "list", "-h"}, 0,
			[]string{"usage:"}, []string{"unreachable"}},
		{"exec --help prints the usage and connects to nothing", []string{"--socket", missing, "exec", "--help"}, 0,
			[]string{"usage:", "{fds}"}, []string{"unreachable"}},
		{"launch --help prints the usage", []string{"launch", "--help"}, 0,
			[]string{"usage:"}, nil},
		{"napitapctl --help prints the usage", []string{"--help"}, 0,
			[]string{"usage:"}, nil},
		{"probe --help prints the usage", []string{"probe", "--help"}, 0,
			[]string{"usage:", "napitapctl probe"}, nil},
		{"seccomp-profile --help prints the usage", []string{"seccomp-profile", "--help"}, 0,
			[]string{"usage:", "seccomp-profile"}, nil},
		{"install-plugin --help prints the usage", []string{"install-plugin", "--help"}, 0,
			[]string{"usage:", "napitapctl install-plugin"}, nil},
		{"install-plugin without --dir says it is needed", []string{"install-plugin", "--from", missing}, 2,
			[]string{"--dir names the CNI bin dir"}, nil},
		{"install-plugin from a missing binary names it", []string{"install-plugin", "--from", missing, "--dir", dir}, 1,
			[]string{"install " + filepath.Join(dir, "none.sock"), "no such file"}, nil},
		{"list with an argument is a usage error", []string{"--socket", missing, "list", "extra"}, 2,
			[]string{`list takes no arguments, got ["extra"]`}, []string{"unreachable"}},
		{"an unknown flag of list is a usage error", []string{"--socket", missing, "list", "--bogus"}, 2,
			[]string{"flag provided but not defined: -bogus", "usage:"}, []string{"unreachable"}},
		{"--version prints napitapctl's version and connects to nothing", []string{"--socket", missing, "--version"}, 0,
			[]string{"napitapctl dev"}, []string{"usage:", "unreachable"}},
		{"version without napitapd prints napitapctl's and says why napitapd's is missing", []string{"--socket", missing, "version"}, 1,
			[]string{"napitapctl dev", "napitapd unreachable", "is the napitap DaemonSet running on this node?"}, []string{"usage:"}},
		{"an unknown command is named", []string{"--socket", missing, "lsit"}, 2,
			[]string{`unknown command "lsit"`}, []string{"unreachable"}},
		{"no napitapd at the socket names it and asks for the DaemonSet, without the group hint", []string{"--socket", missing, "list"}, 1,
			[]string{"napitapd unreachable", missing, "is the napitap DaemonSet running on this node?"}, []string{"--socket-group"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out := napitapctl(t, tc.args...)
			check(t, code, out, tc.wantCode, tc.want, tc.notWant)
		})
	}

	t.Run("permission denied on the socket names it and the group the caller needs", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root, to run napitapctl as another user")
		}
		// A dir and binary that uid 65534 may reach; t.TempDir's are 0700.
		pub, err := os.MkdirTemp("", "napitapctl-test-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(pub) })
		if err := os.Chmod(pub, 0o755); err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(pub, "napitapctl.test")
		self, err := os.ReadFile(os.Args[0])
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(bin, self, 0o755); err != nil {
			t.Fatal(err)
		}
		socket := filepath.Join(pub, "napitapd.sock")
		l, err := net.Listen("unixpacket", socket)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := os.Chmod(socket, 0o660); err != nil { // as napitapd makes it
			t.Fatal(err)
		}
		// A group other than root's, so the message must name it: gid 1,
		// "daemon" on Debian, and nobody is not in it.
		if err := os.Chown(socket, 0, 1); err != nil {
			t.Fatal(err)
		}
		group, err := user.LookupGroupId("1")
		if err != nil {
			t.Fatal(err)
		}
		nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
		for _, args := range [][]string{
			{"--socket", socket, "list"},
			{"--socket", socket, "exec", "--", "true"},
			{"--socket", socket, "exec", "--container", "c1", "--ifname", "net1", "--", "true"},
		} {
			code, out := napitapctlAs(t, nobody, bin, args...)
			check(t, code, out, 1, []string{
				"connect: permission denied",
				"only root and the socket's group may connect to " + socket,
				fmt.Sprintf("add this user to group %q (gid 1)", group.Name),
				"napitapd --socket-group chooses the group",
			}, nil)
		}
		// Root's group: joining it is no advice to give.
		if err := os.Chown(socket, 0, 0); err != nil {
			t.Fatal(err)
		}
		code, out := napitapctlAs(t, nobody, bin, "--socket", socket, "list")
		check(t, code, out, 1, []string{"only root may connect to " + socket, "run napitapctl as root"}, []string{"add this user to"})
	})
}

func check(t *testing.T, code int, out string, wantCode int, want, notWant []string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("exit %d, want %d; output:\n%s", code, wantCode, out)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	for _, w := range notWant {
		if strings.Contains(out, w) {
			t.Errorf("output has %q:\n%s", w, out)
		}
	}
}

// install-plugin installs the binary under its own name and says what it
// replaced.
func TestInstallPlugin(t *testing.T) {
	src := filepath.Join(t.TempDir(), "napitap")
	if err := os.WriteFile(src, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "napitap"), []byte("old"), 0o755); err != nil {
		t.Fatal(err)
	}
	code, out := napitapctl(t, "install-plugin", "--from="+src, "--dir="+dir)
	check(t, code, out, 0, []string{"installed " + filepath.Join(dir, "napitap") + " (3 bytes, sha256 ", ", replacing one with sha256 "}, nil)
	if b, err := os.ReadFile(filepath.Join(dir, "napitap")); err != nil || string(b) != "new" {
		t.Errorf("the CNI bin dir's napitap holds %q, %v", b, err)
	}
	// --name: the same file under another name (the Kata wrapper's second).
	code, out = napitapctl(t, "install-plugin", "--from="+src, "--dir="+dir, "--name=other")
	check(t, code, out, 0, []string{"installed " + filepath.Join(dir, "other")}, nil)
	code, out = napitapctl(t, "install-plugin", "--from="+src, "--dir="+dir, "--name=../escape")
	check(t, code, out, 2, []string{`--name "../escape" is not a file name`}, nil)
}

func TestWaitEndsWithTheContainersStopSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String()+" ends it with status 0", func(t *testing.T) {
			cmd := mainexec.Command("napitapctl", "wait")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				t.Fatalf("wait returned before any signal: %v", err)
			case <-time.After(300 * time.Millisecond):
			}
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("after %v: %v, want status 0", sig, err)
				}
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("still waiting 10 s after %v", sig)
			}
		})
	}
}
