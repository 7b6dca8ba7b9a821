package handoff_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestAConnectionSpeaksAsItsProcessWasWhenItConnected replays security
// round 6's first attack: a uid in the pod's netns that may not attach
// the tap connects, hands the connection to a child, and execs a program
// that gains privilege and lingers; the child then fetches. The connecting
// pid is then privileged, but the connection speaks as it was.
func TestAConnectionSpeaksAsItsProcessWasWhenItConnected(t *testing.T) {
	nstest.RequireRoot(t)
	sockDir := sharedSockDir(t)
	d := startCappedDaemon(t, filepath.Join(t.TempDir(), "state"), filepath.Join(sockDir, "napitapd.sock"))
	root := d.client()

	const owner, stranger = 107, 3000
	const queues = 2
	const tap = "napihob0"
	key := handoff.Key{ContainerID: "vm", IfName: "net1"}
	pod := nstest.New(t, "handoff")
	register(t, root, withOwner(attachmentFor(pod, key, "net-a", tap, queues), owner, owner),
		newTap(t, pod, tap, queues, ptr[uint32](owner), ptr[uint32](owner)))
	t.Cleanup(func() { _ = root.Release(key) })
	// A copy of this binary that the attacker's uid may run.
	self := filepath.Join(sockDir, "napiho-test")
	copyFile(t, os.Args[0], self, 0o755)

	for _, tc := range []struct {
		name string
		make func(path string) error // makes the copy of sleep at path privileged
	}{
		{name: "a program with file capability cap_net_admin+ep exec'd after the connect lends the connection nothing", make: setNetAdminFileCap},
		{name: "a setuid-root program exec'd after the connect lends the connection nothing", make: func(path string) error { return unix.Chmod(path, 0o4755) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prog := filepath.Join(sockDir, "napiho-sleep")
			copyFile(t, "/bin/sleep", prog, 0o755)
			t.Cleanup(func() { os.Remove(prog) })
			if err := tc.make(prog); err != nil {
				t.Fatalf("make %s privileged: %v", prog, err)
			}
			res := runBorrower(t, d.socket, pod.Path(), stranger, key, prog, self)
			t.Logf("the child's fetch: %+v", res)
			if !res.Gained {
				t.Fatalf("the connecting process never showed CAP_NET_ADMIN or euid 0 after its exec: the attack did not run")
			}
			if res.Code != handoff.CodeDenied || res.FDs != 0 {
				t.Errorf("the child got code %q and %d fds (%s), want %q and none", res.Code, res.FDs, res.Err, handoff.CodeDenied)
			}
			if want := fmt.Sprintf("uid %d gid %d may not attach tap %q", stranger, stranger, tap); !strings.Contains(res.Err, want) {
				t.Errorf("error %q, want it to name %q", res.Err, want)
			}
			if n := heldBy(t, root); n != queues {
				t.Errorf("napitapd holds %d fds, want %d", n, queues)
			}
		})
	}
}

// setNetAdminFileCap gives path the file capability cap_net_admin+ep, as
// setcap(8) writes it (struct vfs_cap_data, revision 2).
func setNetAdminFileCap(path string) error {
	const revision2, effective = 0x02000000, 0x1
	b := make([]byte, 20)
	binary.LittleEndian.PutUint32(b[0:], revision2|effective)
	binary.LittleEndian.PutUint32(b[4:], 1<<unix.CAP_NET_ADMIN) // permitted, low word
	return unix.Setxattr(path, "security.capability", b, 0)
}

func copyFile(t testing.TB, from, to string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err == nil {
		err = os.WriteFile(to, b, mode)
	}
	if err == nil {
		err = os.Chmod(to, mode)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// borrowResult is what the borrowing child saw.
type borrowResult struct {
	helperResult
	Gained bool // its parent showed the privilege its exec gave
}

// runBorrower runs the attacker as uid in netns: it connects to socket,
// starts a child (self, a copy of this binary) holding the connection, and
// execs prog (which sleeps).
// The child waits until that exec took effect, fetches key over the
// connection, and reports.
func runBorrower(t testing.TB, socket, netns string, uid int, key handoff.Key, prog, self string) borrowResult {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "NAPITAP_HELPER_OP=borrow",
		"NAPITAP_HELPER_SOCKET="+socket, "NAPITAP_HELPER_NETNS="+netns, "NAPITAP_HELPER_KEY="+key.String(),
		fmt.Sprintf("NAPITAP_HELPER_UID=%d", uid), fmt.Sprintf("NAPITAP_HELPER_GID=%d", uid),
		"NAPITAP_HELPER_PROG="+prog, "NAPITAP_HELPER_SELF="+self)
	cmd.Stderr = &testLogWriter{t: t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill() // the privileged sleep, our child
		_ = cmd.Wait()
	}()
	got := make(chan borrowResult, 1)
	go func() {
		var res borrowResult
		if err := json.NewDecoder(out).Decode(&res); err != nil {
			res.Code, res.Err = "error", fmt.Sprintf("no result from the child: %v", err)
		}
		got <- res
	}()
	select {
	case res := <-got:
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("the borrowing child did not report in 30 s")
		return borrowResult{}
	}
}

// runBorrow is the attacker's process (op "borrow"), already the uid and in
// the netns runBorrower asked for. It never returns once it execs.
func runBorrow(fail func(string, ...any) int) int {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET, 0)
	if err != nil {
		return fail("socket: %v", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: os.Getenv("NAPITAP_HELPER_SOCKET")}); err != nil {
		return fail("connect: %v", err)
	}
	child := exec.Command(os.Getenv("NAPITAP_HELPER_SELF"), "-test.run=^TestHelperProcess$")
	for _, kv := range os.Environ() {
		// The child is already where and who it must be.
		if !strings.HasPrefix(kv, "NAPITAP_HELPER_") {
			child.Env = append(child.Env, kv)
		}
	}
	child.Env = append(child.Env, "NAPITAP_HELPER_OP=borrowed-fetch", "NAPITAP_HELPER_KEY="+os.Getenv("NAPITAP_HELPER_KEY"),
		fmt.Sprintf("NAPITAP_HELPER_PARENT=%d", os.Getpid()))
	child.ExtraFiles = []*os.File{os.NewFile(uintptr(fd), "handoff")}
	child.Stdout, child.Stderr = os.Stdout, os.Stderr
	if err := child.Start(); err != nil {
		return fail("start the child: %v", err)
	}
	prog := os.Getenv("NAPITAP_HELPER_PROG")
	err = syscall.Exec(prog, []string{prog, "60"}, nil)
	return fail("exec %s: %v", prog, err)
}

// runBorrowedFetch is the child (op "borrowed-fetch"): it fetches over the
// connection it inherited as fd 3 once its parent has gained privilege.
func runBorrowedFetch(fail func(string, ...any) int) int {
	var res borrowResult
	res.Uid, res.Gid = os.Getuid(), os.Getgid()
	parent := os.Getenv("NAPITAP_HELPER_PARENT")
	for deadline := time.Now().Add(10 * time.Second); !res.Gained && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile("/proc/" + parent + "/status")
		if err != nil {
			return fail("parent: %v", err)
		}
		res.Gained = privileged(string(b))
	}
	f := os.NewFile(3, "handoff")
	fc, err := net.FileConn(f)
	if err != nil {
		return fail("fd 3: %v", err)
	}
	conn := fc.(*net.UnixConn)
	cid, ifName, _ := strings.Cut(os.Getenv("NAPITAP_HELPER_KEY"), "/")
	req, _ := json.Marshal(handoff.Request{Version: handoff.Version, Op: handoff.OpFetch, Key: &handoff.Key{ContainerID: cid, IfName: ifName}})
	if _, err := conn.Write(req); err != nil {
		return fail("send: %v", err)
	}
	buf, oob := make([]byte, handoff.MaxHeader), make([]byte, unix.CmsgSpace(handoff.MaxFDs*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil && err != io.EOF {
		return fail("receive: %v", err)
	}
	var resp handoff.Response
	if err := json.Unmarshal(buf[:n], &resp); err != nil {
		return fail("response %q: %v", buf[:n], err)
	}
	if resp.Error != nil {
		res.Code, res.Err = resp.Error.Code, resp.Error.Error()
	}
	msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
	for _, m := range msgs {
		fds, _ := unix.ParseUnixRights(&m)
		for _, fd := range fds {
			q := os.NewFile(uintptr(fd), "queue")
			name, _ := queueName(q)
			flags, _ := tapsetup.QueueFlagsOf(q)
			res.TapNames = append(res.TapNames, name)
			res.NAPI = flags&unix.IFF_NAPI != 0
			res.FDs++
			q.Close()
		}
	}
	return report(res, fail)
}

// privileged: a /proc status shows CAP_NET_ADMIN or euid 0.
func privileged(status string) bool {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			if c, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && c&(1<<unix.CAP_NET_ADMIN) != 0 {
				return true
			}
		}
		if v, ok := strings.CutPrefix(line, "Uid:"); ok && slices.Index(strings.Fields(v), "0") == 1 {
			return true
		}
	}
	return false
}

func report(v any, fail func(string, ...any) int) int {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		return fail("%v", err)
	}
	return 0
}
