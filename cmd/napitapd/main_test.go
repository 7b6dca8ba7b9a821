package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/mainexec"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/buildinfo"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"golang.org/x/sys/unix"
)

// launchEnv makes the re-executed test binary `napitapctl launch -- true`
// against the seccomp socket it names.
const launchEnv = "NAPITAPD_TEST_LAUNCH"

// makeTapEnv, with launchEnv, launches the test binary again, which makes
// the tap it names in a network namespace of its own, and exits.
const makeTapEnv = "NAPITAPD_TEST_MAKE_TAP"

func TestMain(m *testing.M) {
	if tap := os.Getenv(makeTapEnv); tap != "" && os.Getenv(launchEnv) == "" {
		os.Exit(makeTap(tap))
	}
	if socket := os.Getenv(launchEnv); socket != "" {
		argv := []string{"true"}
		env := os.Environ()
		if os.Getenv(makeTapEnv) != "" {
			argv = []string{os.Args[0], "-test.run=^$"}
			env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, launchEnv+"=") })
		}
		err := seccompagent.Launch(socket, argv, env)
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

// makeTap makes tap name, as a Kata Go shim does, in a netns of its own.
func makeTap(name string) int {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		os.Stderr.WriteString("unshare: " + err.Error() + "\n")
		return 2
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		var ifr *unix.Ifreq
		if ifr, err = unix.NewIfreq(name); err == nil {
			ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
			err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		}
	}
	if err != nil {
		os.Stderr.WriteString("TUNSETIFF: " + err.Error() + "\n")
		return 2
	}
	return 0
}

// TestMetricsSayWhatNapitapdHoldsAndAnswered: /metrics on
// --metrics-address carries napitapd's version, what it holds, how the
// agent answered a TUNSETIFF (a launched tree making its own tap: NAPI) and
// the hand-off requests.
func TestMetricsSayWhatNapitapdHoldsAndAnswered(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	socket, seccomp := filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock")
	cmd := mainexec.Command("napitapd", "--socket", socket, "--state-dir", filepath.Join(dir, "state"),
		"--seccomp-socket", seccomp, "--metrics-address", "127.0.0.1:0")
	log := &syncbuf.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFile(t, seccomp)
	m := regexp.MustCompile(`msg="metrics: serving /metrics" address=(\S+)`).FindStringSubmatch(log.String())
	if m == nil {
		t.Fatalf("napitapd does not say where it serves metrics:\n%s", log.String())
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	launch := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	launch.Env = append(os.Environ(), launchEnv+"="+seccomp, makeTapEnv+"=napimetrics0")
	if out, err := launch.CombinedOutput(); err != nil {
		t.Fatalf("a launched tree making its tap: %v: %s", err, out)
	}
	if _, err := (&handoff.Client{Socket: socket}).List(); err != nil {
		t.Fatal(err)
	}

	// The agent counts an attach once its answer is out, which the
	// launched tree may outrun.
	var body []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(body, []byte(`napitapd_tunsetiff_total{outcome="napi"} 1`)) || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range []string{
		`napitapd_build_info{version="` + buildinfo.Version() + `"} 1`,
		"napitapd_attachments 0",
		"napitapd_held_queues 0",
		`napitapd_tunsetiff_total{outcome="napi"} 1`,
		`napitapd_tunsetiff_total{outcome="passed_through"} 0`,
		`napitapd_tunsetiff_answer_seconds_count{outcome="napi"} 1`,
		`napitapd_handoff_requests_total{op="list",result="ok"} 1`,
		"napitapd_seccomp_listeners ",
		"napitapd_takeovers_total 0",
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s\nnapitapd's log:\n%s", body, log.String())
	}
}
