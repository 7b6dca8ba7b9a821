package peer

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	_ "github.com/napitap/napitap/internal/ownuserns"
)

const helperEnv = "NAPITAP_PEER_HELPER"

// TestHelperProcess is the other end of a connection: it dials the socket
// given (or listens on it and accepts one), says its pid, and holds the
// connection until stdin closes.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		t.Skip("a helper process")
	}
	path := os.Getenv("NAPITAP_PEER_SOCKET")
	if os.Getenv("NAPITAP_PEER_UNDUMPABLE") == "1" {
		// As napitapd makes itself.
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if mode == "judge" {
		os.Exit(judge(path))
	}
	var c net.Conn
	var err error
	if mode == "listen" {
		var l *net.UnixListener
		if l, err = net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"}); err == nil {
			fmt.Println(os.Getpid())
			if c, err = l.Accept(); err == nil {
				fmt.Println("accepted")
			}
		}
	} else {
		c, err = net.Dial("unix", path)
		fmt.Println(os.Getpid())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	defer c.Close()
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	os.Exit(0)
}

// judge listens on path, judges the one peer that connects, and says
// "napitapd" or why not.
func judge(path string) int {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("listening")
	c, err := l.AcceptUnix()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	p, err := Connected(c)
	if err == nil {
		defer p.Close()
		err = p.Napitapd()
	}
	if err != nil {
		fmt.Println(err)
	} else {
		fmt.Println("napitapd")
	}
	return 0
}

type who int

const (
	rootWithCaps who = iota
	caplessRoot
	rootInOwnUserns
)

// startPeer runs the helper as w, dialing path (or listening on it), and
// returns its pid once it has connected (or listens), with a function that
// waits for a listening helper's accept.
func startPeer(t *testing.T, w who, mode, path string) (int, func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "NAPITAP_PEER_SOCKET="+path)
	switch w {
	case caplessRoot:
		cmd = nstest.AsCaplessRoot(t, cmd)
	case rootInOwnUserns:
		cmd = nstest.AsRootInOwnUserns(t, cmd)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	out := bufio.NewReader(stdout)
	var pid int
	if _, err := fmt.Fscanln(out, &pid); err != nil {
		t.Fatalf("helper's pid: %v", err)
	}
	return pid, func() {
		if line, err := out.ReadString('\n'); line != "accepted\n" {
			t.Fatalf("helper did not accept: %q %v", line, err)
		}
	}
}

// checkAttacker: the process is what fact 25 says: every capability shown,
// in a user namespace that is not this test's.
func checkAttacker(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	c, err := parseStatus(b)
	if err != nil {
		t.Fatal(err)
	}
	theirs, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/user", pid))
	ours, _ := os.Readlink("/proc/self/ns/user")
	if c.EUID != 0 || c.CapEff&Required != Required || theirs == ours {
		t.Fatalf("the attacker runs as uid %d with CapEff 0x%x in %s (the test in %s): not root with every capability in a user namespace of its own", c.EUID, c.CapEff, theirs, ours)
	}
}

func TestOnlyRootWithNapitapdsCapabilitiesInNapitapdsUserNamespaceIsNapitapd(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name string
		who  who
		want string // "" for napitapd's equal, else the refusal's words
	}{
		{"root with every capability is napitapd's equal", rootWithCaps, ""},
		{"root without capabilities (a pod's root) is not", caplessRoot, "lacks capabilities"},
		{"root with every capability in a user namespace of its own is not", rootInOwnUserns, "only in a user namespace of its own"},
	}
	for _, side := range []string{"connected", "accepting"} {
		for _, tc := range cases {
			t.Run(side+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				if err := os.Chmod(dir, 0o777); err != nil {
					t.Fatal(err)
				}
				path := filepath.Join(dir, "s")
				var p *Process
				var pid int
				if side == "connected" {
					l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
					if err != nil {
						t.Fatal(err)
					}
					defer l.Close()
					if err := os.Chmod(path, 0o777); err != nil {
						t.Fatal(err)
					}
					pid, _ = startPeer(t, tc.who, "dial", path)
					c, err := l.AcceptUnix()
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					if p, err = Connected(c); err != nil {
						t.Fatal(err)
					}
				} else {
					var accepted func()
					pid, accepted = startPeer(t, tc.who, "listen", path)
					c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					accepted()
					if p, err = Accepting(c, pid); err != nil {
						t.Fatal(err)
					}
				}
				defer p.Close()
				if tc.who == rootInOwnUserns {
					checkAttacker(t, pid)
				}
				err := p.Napitapd()
				switch {
				case tc.want == "" && err != nil:
					t.Errorf("refused: %v", err)
				case tc.want != "" && (!errors.Is(err, ErrNotNapitapd) || !strings.Contains(err.Error(), tc.want)):
					t.Errorf("Napitapd() = %v; want a refusal saying %q", err, tc.want)
				}
			})
		}
	}
}

func TestAProcessThatDoesNotHoldTheOtherEndIsNotAccepted(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "s")
	_, accepted := startPeer(t, rootWithCaps, "listen", path)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	accepted()
	// This test's own pid, a root with every capability, holds this end,
	// not the other.
	if p, err := Accepting(c, os.Getpid()); err == nil || !errors.Is(err, ErrNotNapitapd) {
		if p != nil {
			p.Close()
		}
		t.Errorf("Accepting named the wrong process: %v", err)
	}
}

func TestAPeerThatExitedIsGone(t *testing.T) {
	nstest.RequireRoot(t)
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{Pid: cmd.Process.Pid, pidfd: pidfd}
	defer p.Close()
	if _, err := p.Creds(-1); err != nil {
		t.Fatalf("a live process: %v", err)
	}
	_ = cmd.Process.Kill()
	// Exited, not yet reaped: its pid is still its own, and the pidfd tells.
	time.Sleep(100 * time.Millisecond)
	if _, err := p.Creds(-1); !errors.Is(err, ErrGone) {
		t.Errorf("an exited process: %v, want ErrGone", err)
	}
	_ = cmd.Wait()
}

func TestRootInTheInitialUserNamespaceHoldsNetAdminOverItsNetns(t *testing.T) {
	nstest.RequireRoot(t)
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	tid := unix.Gettid()
	if !pidfdThreads() {
		// Before Linux 6.9 only a thread group leader has a pidfd, so the
		// seccomp agent judges no other thread (it leaves its TUNSETIFF to
		// the kernel): judge the leader, as the agent would.
		tid = os.Getpid()
		t.Logf("no PIDFD_THREAD (Linux < 6.9): the thread judged is the leader, pid %d", tid)
	}
	c := threadCreds(t, tid, fd)
	if c.EUID != 0 || !c.NetAdmin || !c.InitNetAdmin {
		t.Errorf("root in the initial user namespace reads as %+v", c)
	}
}

// pidfdThreads: the kernel opens a pidfd of any thread (PIDFD_THREAD,
// Linux 6.9); before, pidfd_open knows no flag but PIDFD_NONBLOCK (EINVAL).
func pidfdThreads() bool {
	fd, err := unix.PidfdOpen(unix.Gettid(), unix.O_EXCL)
	if err == nil {
		unix.Close(fd)
	}
	return err == nil
}

// threadCreds is Thread for tid, pinned by a pidfd of that thread, opened
// as the seccomp agent opens it: with PIDFD_THREAD, or before Linux 6.9 a
// pidfd of the process, which only a thread group leader's tid gets.
func threadCreds(t *testing.T, tid, netnsFD int) Creds {
	t.Helper()
	pidfd, err := unix.PidfdOpen(tid, unix.O_EXCL) // PIDFD_THREAD
	if errors.Is(err, unix.EINVAL) && !pidfdThreads() {
		pidfd, err = unix.PidfdOpen(tid, 0)
	}
	if err != nil {
		t.Fatalf("pidfd_open of tid %d: %v", tid, err)
	}
	defer unix.Close(pidfd)
	netns, err := NetnsOf(netnsFD)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Thread(tid, pidfd, netns)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tqemu\nTgid:\t4242\nUid:\t107\t107\t107\t107\nGid:\t1\t108\t108\t108\nGroups:\t36 108 \nCapEff:\t0000000000001000\n"
	c, err := parseStatus([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if c.EUID != 107 || c.EGID != 108 || len(c.Groups) != 2 || c.Groups[1] != 108 || c.CapEff != 1<<unix.CAP_NET_ADMIN || c.PID != 4242 {
		t.Errorf("parsed %+v", c)
	}
	if _, err := parseStatus([]byte("Name:\tx\n")); err == nil {
		t.Error("a status without Uid, Gid and CapEff parsed")
	}
}

// TestCapabilitiesHoldWhereTheKernelSaysTheyDo: NetAdmin over a netns owned
// by a user namespace uid 1000 made follows the kernel's cap_capable: that
// namespace's owner has every capability in it, root in the parent has its
// own, another uid none; and no process of a user namespace of its own has
// CAP_NET_ADMIN over the node's netns or in napitapd's user namespace.
func TestCapabilitiesHoldWhereTheKernelSaysTheyDo(t *testing.T) {
	nstest.RequireRoot(t)
	// sleep starts cmd and returns its pid once it runs sleep (setpriv and
	// unshare have done their work).
	sleep := func(t *testing.T, cmd *exec.Cmd) int {
		t.Helper()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid)); string(comm) == "sleep\n" || string(comm) == "unshare\n" {
				return cmd.Process.Pid
			}
		}
		t.Fatalf("%v never ran", cmd.Args)
		return 0
	}
	asUID := func(uid string, args ...string) *exec.Cmd {
		return exec.Command("setpriv", append([]string{"--reuid", uid, "--regid", uid, "--clear-groups", "--"}, args...)...)
	}
	// unshare forks: the sleep whose netns is the child's is unshare's child.
	owner := sleep(t, asUID("1000", "unshare", "--user", "--net", "--fork", "sleep", "60"))
	var childNS string
	for deadline := time.Now().Add(5 * time.Second); childNS == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", owner, owner))
		if f := strings.Fields(string(b)); len(f) > 0 {
			childNS = "/proc/" + f[0] + "/ns/net"
		}
	}
	if childNS == "" {
		t.Fatal("unshare's child never started")
	}
	uid1000 := sleep(t, asUID("1000", "sleep", "60"))
	uid2000 := sleep(t, asUID("2000", "sleep", "60"))
	path := filepath.Join(t.TempDir(), "s")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	attacker, _ := startPeer(t, rootInOwnUserns, "dial", path)
	checkAttacker(t, attacker)
	cases := []struct {
		name                string
		pid                 int
		netns               string
		netAdmin, initAdmin bool
	}{
		{"root has CAP_NET_ADMIN over the node's netns and in napitapd's namespace", os.Getpid(), "/proc/self/ns/net", true, true},
		{"root has it over a netns of a child user namespace", os.Getpid(), childNS, true, true},
		{"the uid that owns a child user namespace has it over its netns", uid1000, childNS, true, false},
		{"another uid has it over neither", uid2000, childNS, false, false},
		{"root in a user namespace of its own has it over none of the node's", attacker, "/proc/self/ns/net", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fd, err := unix.Open(tc.netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(fd)
			c := threadCreds(t, tc.pid, fd)
			if want, err := readCreds(tc.pid, nil); err != nil || c.EUID != want.EUID || c.EGID != want.EGID || c.CapEff != want.CapEff {
				t.Errorf("pid %d: Thread says euid %d egid %d CapEff 0x%x; /proc/PID/status %+v (%v)", tc.pid, c.EUID, c.EGID, c.CapEff, want, err)
			}
			if c.NetAdmin != tc.netAdmin || c.InitNetAdmin != tc.initAdmin {
				t.Errorf("pid %d (euid %d, CapEff 0x%x): NetAdmin %v, InitNetAdmin %v; want %v, %v", tc.pid, c.EUID, c.CapEff, c.NetAdmin, c.InitNetAdmin, tc.netAdmin, tc.initAdmin)
			}
		})
	}
}

// TestAJudgeWithoutCapabilitiesTellsNapitapdFromAUserNamespaceOfItsOwn: the
// fd holder runs with no capability, so it may not look at a napitapd's
// (not dumpable) /proc/PID/ns/user; it still knows napitapd's equal, and
// still refuses a root with every capability in a namespace of its own.
func TestAJudgeWithoutCapabilitiesTellsNapitapdFromAUserNamespaceOfItsOwn(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name       string
		who        who
		undumpable bool
		want       string
	}{
		{"a napitapd that is not dumpable is napitapd's equal", rootWithCaps, true, "napitapd"},
		{"root with every capability in a user namespace of its own is not", rootInOwnUserns, false, "only in a user namespace of its own"},
		{"the same, not dumpable, is not", rootInOwnUserns, true, "only in a user namespace of its own"},
		{"root without capabilities is not", caplessRoot, false, "lacks capabilities"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "s")
			j := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
			j.Env = append(os.Environ(), helperEnv+"=judge", "NAPITAP_PEER_SOCKET="+path)
			j = nstest.AsCaplessRoot(t, j)
			out, err := j.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			j.Stderr = os.Stderr
			if err := j.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Process.Kill(); _ = j.Wait() })
			said := bufio.NewReader(out)
			if line, _ := said.ReadString('\n'); line != "listening\n" {
				t.Fatalf("judge: %q", line)
			}
			if err := os.Chmod(path, 0o777); err != nil {
				t.Fatal(err)
			}
			if tc.undumpable {
				t.Setenv("NAPITAP_PEER_UNDUMPABLE", "1")
			}
			startPeer(t, tc.who, "dial", path)
			verdict, _ := said.ReadString('\n')
			if !strings.Contains(verdict, tc.want) {
				t.Errorf("the judge said %q, want %q", verdict, tc.want)
			}
		})
	}
}

// TestCapsOverFollowsCapCapable walks made-up chains of user namespaces as
// the kernel's cap_capable walks the real ones, and ownedBy says when a
// caller without capabilities must be looked up at all.
func TestCapsOverFollowsCapCapable(t *testing.T) {
	initNS, pod, inner := nsID{1, 1}, nsID{1, 2}, nsID{1, 3}
	const netAdmin = 1 << unix.CAP_NET_ADMIN
	// A netns of inner, which uid 1000 made in pod, which uid 0 made in
	// the initial namespace.
	chain := userNSChain{{inner, 1000}, {pod, 0}, {initNS, 0}}
	cases := []struct {
		name    string
		c       Creds
		want    uint64
		ownedBy bool
	}{
		{"a caller in the owning namespace has its effective set", Creds{userNS: inner, EUID: 5, CapEff: netAdmin}, netAdmin, false},
		{"a caller in an ancestor has its effective set there", Creds{userNS: initNS, EUID: 5, CapEff: netAdmin}, netAdmin, false},
		{"the owner of a child of the caller's namespace has every capability", Creds{userNS: pod, EUID: 1000}, ^uint64(0), true},
		{"another uid in that parent has only its effective set", Creds{userNS: pod, EUID: 2000, CapEff: netAdmin}, netAdmin, false},
		{"root in the initial namespace owns pod, and so has everything below it", Creds{userNS: initNS, EUID: 0}, ^uint64(0), true},
		{"a caller in a namespace off the chain has nothing", Creds{userNS: nsID{1, 9}, EUID: 1000, CapEff: ^uint64(0)}, 0, true},
		{"a caller whose namespace is unknown has nothing", Creds{EUID: 5, CapEff: ^uint64(0)}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.c.capsOver(chain); got != tc.want {
				t.Errorf("capsOver: 0x%x, want 0x%x", got, tc.want)
			}
			if got := (&Netns{chain}).ownedBy(tc.c.EUID); got != tc.ownedBy {
				t.Errorf("ownedBy(%d): %v, want %v", tc.c.EUID, got, tc.ownedBy)
			}
		})
	}
	if (*Netns)(nil).ownedBy(0) {
		t.Error("no netns is owned by uid 0")
	}
}
