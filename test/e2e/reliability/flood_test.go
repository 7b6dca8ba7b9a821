package reliability

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// TestAFloodFromAPodsRootLeavesADDAndLaunchServed replays security round
// 6's second attack against the real napitapd: uid 0 with no capability
// (a root container that mounts /run/napitap) holds 300 idle connections
// on the hand-off socket and sends 300 seccomp listeners through
// napitapctl launch. It is a tenant like any other uid: it keeps its
// uid's share of each, and the plugin's ADD (fds mode, required) and a
// launch by root with napitapd's capabilities, as runc's, are served.
func TestAFloodFromAPodsRootLeavesADDAndLaunchServed(t *testing.T) {
	nstest.RequireRoot(t)
	f := newFixture(t)
	seccompSocket := filepath.Join(f.d.dir, "seccomp.sock")

	kept := holdIdleAsCaplessRoot(t, f.d.Socket, 300)
	if kept != handoff.DefaultMaxConnsPerUID {
		t.Errorf("napitapd kept %d of the pod root's 300 idle connections, want its uid's share %d", kept, handoff.DefaultMaxConnsPerUID)
	}
	launched, refused := launchMany(t, seccompSocket, 300, nstest.AsCaplessRoot)
	t.Logf("the pod root's launches: %d served, %d refused (%s)", launched, len(refused), firstWords(strings.Join(refused, " | "), 40))
	if launched != seccompagent.DefaultMaxListenersPerUID || len(refused) != 300-launched ||
		!strings.Contains(refused[0], "too many listeners: the uid is at its own limit") {
		t.Errorf("the pod root's listeners: %d served, want its uid's share %d, the rest refused for it", launched, seccompagent.DefaultMaxListenersPerUID)
	}

	// The plugin's ADD, and DEL.
	c := tapConf{Queues: 4, Handoff: "required", IPAM: true}
	p := newPodNS(t, "flood")
	list, r := f.list("net-flood", c), rt("flood-"+nstest.RandomSuffix(), p, "net1")
	if _, err := f.env.Add(list, r); err != nil {
		t.Fatalf("ADD during the flood: %v", err)
	}
	if err := f.env.Del(list, r); err != nil {
		t.Errorf("DEL during the flood: %v", err)
	}
	// runc's listener: root with napitapd's capabilities.
	if n, refused := launchMany(t, seccompSocket, 1, nil); n != 1 {
		t.Errorf("a launch by root with napitapd's capabilities during the flood was refused: %v", refused)
	}
}

const idleEnv = "NAPITAP_REL_IDLE"

// holdIdleAsCaplessRoot runs this binary as uid 0 without capabilities to
// open n connections to socket and hold them; it returns how many napitapd
// did not hang up on. The holder ends with the test.
func holdIdleAsCaplessRoot(t *testing.T, socket string, n int) int {
	t.Helper()
	cmd := nstest.AsCaplessRoot(t, exec.Command(os.Args[0], "-test.run=^$"))
	cmd.Env = append(os.Environ(), idleEnv+"="+socket, fmt.Sprintf("NAPITAP_REL_IDLE_N=%d", n))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	kept, cerr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || cerr != nil {
		t.Fatalf("idle holder: %q %v %v", line, err, cerr)
	}
	return kept
}

// holdIdle is the holder's main: it prints how many of its connections
// napitapd kept, and holds them until stdin closes.
func holdIdle() int {
	socket := os.Getenv(idleEnv)
	n, _ := strconv.Atoi(os.Getenv("NAPITAP_REL_IDLE_N"))
	var fds []int
	for range n {
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
		if err == nil {
			err = unix.Connect(fd, &unix.SockaddrUnix{Name: socket})
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "connection %d: %v\n", len(fds)+1, err)
			return 2
		}
		fds = append(fds, fd)
	}
	// napitapd hangs up at once on those beyond its limits.
	time.Sleep(500 * time.Millisecond)
	kept := 0
	for _, fd := range fds {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(pfd, 0); err == nil && n == 0 {
			kept++
		}
	}
	fmt.Println(kept)
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	return 0
}

// launchMany runs n `napitapctl launch` (through as, if set), each of a
// shell that says so and sleeps; it returns how many were served and the
// errors of those refused. The served ones end with the test.
func launchMany(t *testing.T, socket string, n int, as func(testing.TB, *exec.Cmd) *exec.Cmd) (int, []string) {
	t.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	served, refused := 0, []string(nil)
	sem := make(chan struct{}, 16)
	for range n {
		cmd := exec.Command(filepath.Join(binDir, "napitapctl"), "launch", "--seccomp-socket", socket, "--",
			"/bin/sh", "-c", "echo served; exec sleep 600")
		if as != nil {
			cmd = as(t, cmd)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		sem <- struct{}{}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		wg.Go(func() {
			defer func() { <-sem }()
			line, _ := bufio.NewReader(out).ReadString('\n')
			mu.Lock()
			defer mu.Unlock()
			if line == "served\n" {
				served++
				return
			}
			_ = cmd.Wait()
			refused = append(refused, strings.TrimSpace(stderr.String()))
		})
	}
	wg.Wait()
	return served, refused
}
