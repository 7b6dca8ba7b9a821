package handoff_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
	"golang.org/x/sys/unix"
)

// daemonSetCaps are the capabilities deploy/base/daemonset.yaml gives
// napitapd, and all it has in cappedDaemon.
var daemonSetCaps = []string{"net_admin", "setgid", "setuid", "sys_admin", "sys_ptrace"}

const daemonSetCapMask = 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SETGID | 1<<unix.CAP_SETUID | 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_SYS_PTRACE

// cappedDaemon is napitapd in a process of its own, root with the
// DaemonSet's capabilities and no others, as it runs on a node.
type cappedDaemon struct {
	socket string
	cmd    *exec.Cmd
}

// startCappedDaemon runs this test binary as napitapd under setpriv, which
// drops every capability but the DaemonSet's from the bounding set before
// the exec.
func startCappedDaemon(t testing.TB, stateDir, socket string) *cappedDaemon {
	t.Helper()
	bounding := "-all"
	for _, c := range daemonSetCaps {
		bounding += ",+" + c
	}
	cmd := exec.Command("setpriv", "--bounding-set="+bounding, "--inh-caps=-all", "--",
		os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "NAPITAP_HELPER_DAEMON="+socket, "NAPITAP_HELPER_STATE="+stateDir)
	cmd.Stderr = &testLogWriter{t: t}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start napitapd under setpriv: %v", err)
	}
	d := &cappedDaemon{socket: socket, cmd: cmd}
	t.Cleanup(d.stop)
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		ready <- line
	}()
	select {
	case line := <-ready:
		if strings.TrimSpace(line) != "ready" {
			t.Fatalf("napitapd did not start: %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("napitapd did not start in 10 s")
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("CapEff:\t%016x", daemonSetCapMask); !strings.Contains(string(status), want+"\n") {
		t.Fatalf("napitapd runs with other capabilities than the DaemonSet's, want %q in:\n%s", want, status)
	}
	return d
}

func (d *cappedDaemon) stop() {
	if d.cmd.ProcessState != nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = d.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
}

func (d *cappedDaemon) client() *handoff.Client {
	return &handoff.Client{Socket: d.socket, Timeout: 10 * time.Second}
}

func (d *cappedDaemon) pid() string { return fmt.Sprint(d.cmd.Process.Pid) }

// settledFDs counts napitapd's fds once they stopped changing.
func (d *cappedDaemon) settledFDs(t testing.TB) int {
	t.Helper()
	last, same := fdsOf(t, d.pid()), 0
	for deadline := time.Now().Add(3 * time.Second); same < 10 && time.Now().Before(deadline); {
		time.Sleep(3 * time.Millisecond)
		if n := fdsOf(t, d.pid()); n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// waitFDs waits until napitapd has at most want fds open. Fewer is no
// leak: on a loaded machine the count can hold still for settledFDs's
// 30 ms while napitapd has yet to close what an earlier request opened,
// and the baseline then counts it (a clean clone's make test beside other
// work, 2026-12-06: 10 fds, want 12).
func (d *cappedDaemon) waitFDs(t testing.TB, want int, what string) {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := fdsOf(t, d.pid())
		if got <= want {
			if got < want {
				t.Logf("%s: napitapd has %d fds open, %d fewer than the baseline counted", what, got, want-got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s: napitapd has %d fds open, want %d", what, got, want)
			return
		}
	}
}

// testLogWriter passes a child's stderr to the test log.
type testLogWriter struct{ t testing.TB }

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// runDaemonHelper is napitapd's main loop in the helper process.
func runDaemonHelper(socket, stateDir string) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	srv, err := handoff.NewServer(stateDir, logger)
	if err != nil {
		logger.Error("NewServer", "err", err)
		return 2
	}
	l, err := handoff.Listen(socket, 0o666, -1)
	if err != nil {
		logger.Error("Listen", "err", err)
		return 2
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	go func() { <-stop; l.Close() }()
	fmt.Println("ready")
	err = srv.Serve(context.Background(), l)
	srv.Close()
	if err != nil {
		logger.Error("Serve", "err", err)
		return 2
	}
	return 0
}

// heldBy sums the fds napitapd holds, as root's list reports them.
// overflowID is what an id that a user namespace does not map reads as
// there (kernel/overflowuid, overflowgid).
func overflowID(t testing.TB, kind string) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/overflow" + kind)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func heldBy(t testing.TB, c *handoff.Client) int {
	t.Helper()
	n := 0
	for _, a := range listed(t, c) {
		n += a.Held
	}
	return n
}

// TestAuthorization runs napitapd with exactly the DaemonSet's
// capabilities, and peers as other uids in and out of the pod's netns.
func TestAuthorization(t *testing.T) {
	nstest.RequireRoot(t)
	// The socket must be reachable for uid 107: a world-searchable dir and
	// a 0666 socket.
	sockDir := sharedSockDir(t)
	d := startCappedDaemon(t, filepath.Join(t.TempDir(), "state"), filepath.Join(sockDir, "napitapd.sock"))
	root := d.client()
	other := nstest.New(t, "handoff")

	const owner, group, stranger = 107, 108, 3000
	const queues = 4
	const tap = "napiho7"
	key := handoff.Key{ContainerID: "vm", IfName: "net1"}
	missing := handoff.Key{ContainerID: "nosuchvm", IfName: "net1"}

	type where int
	const (
		inPod where = iota
		inOther
		inHost
	)
	cases := []struct {
		name      string
		where     where
		uid, gid  *int
		groups    []int
		unowned   bool // the tap has neither owner nor group
		op        string
		byNetns   bool         // fetch without a key
		key       *handoff.Key // another key than the attachment's
		wantCode  string
		wantErr   string // the whole message, where it must not tell more
		wantFDs   int
		wantList  []string
		keepsHeld bool // napitapd still holds the queues afterwards
		capless   bool // root without any capability: a pod's root
		userns    bool // capless, with every capability in a user namespace of its own
		ownTap    bool // the register carries the queues of a tap of the peer's own
	}{
		{name: "the tap owner in the tap group in the pod netns gets the queues", where: inPod, uid: ptr(owner), gid: ptr(group), op: "fetch", wantFDs: queues},
		{name: "the tap owner with the tap group as a supplementary group gets the queues", where: inPod, uid: ptr(owner), gid: ptr(stranger), groups: []int{group}, op: "fetch", wantFDs: queues},
		{name: "the tap owner fetching by its own netns without a key gets the queues", where: inPod, uid: ptr(owner), gid: ptr(group), op: "fetch", byNetns: true, wantFDs: queues},
		{name: "root in another netns gets the queues", where: inOther, op: "fetch", wantFDs: queues},
		{name: "any uid in the pod netns gets the queues of a tap with neither owner nor group, as the kernel would", where: inPod, uid: ptr(stranger), gid: ptr(stranger), unowned: true, op: "fetch", wantFDs: queues},
		{name: "the tap owner outside the tap group is denied, as the kernel would when both are set", where: inPod, uid: ptr(owner), gid: ptr(stranger), op: "fetch", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a member of the tap group that is not its owner is denied", where: inPod, uid: ptr(stranger), gid: ptr(group), op: "fetch", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "another uid and gid in the pod netns are denied", where: inPod, uid: ptr(stranger), gid: ptr(stranger), op: "fetch", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "the tap owner in another netns is told the key does not exist", where: inOther, uid: ptr(owner), gid: ptr(group), op: "fetch", wantCode: handoff.CodeNotFound, wantErr: "not-found: no attachment vm/net1", keepsHeld: true},
		{name: "a key that does not exist gets the same answer in another netns", where: inOther, uid: ptr(owner), gid: ptr(group), op: "fetch", key: &missing, wantCode: handoff.CodeNotFound, wantErr: "not-found: no attachment nosuchvm/net1", keepsHeld: true},
		{name: "the tap owner in the host netns is told the key does not exist", where: inHost, uid: ptr(owner), gid: ptr(group), op: "fetch", wantCode: handoff.CodeNotFound, wantErr: "not-found: no attachment vm/net1", keepsHeld: true},
		{name: "the tap owner in another netns fetching by netns finds nothing", where: inOther, uid: ptr(owner), gid: ptr(group), op: "fetch", byNetns: true, wantCode: handoff.CodeNotFound, keepsHeld: true},
		{name: "a release by the tap owner is denied", where: inPod, uid: ptr(owner), gid: ptr(group), op: "release", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a gc by the tap owner is denied", where: inPod, uid: ptr(owner), gid: ptr(group), op: "gc", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a register by the tap owner is denied and its fds are closed", where: inPod, uid: ptr(owner), gid: ptr(group), op: "register", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a release by root without napitapd's capabilities (a pod's root) is denied", where: inHost, capless: true, op: "release", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a gc by root without napitapd's capabilities is denied", where: inHost, capless: true, op: "gc", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a register by root without napitapd's capabilities is denied and its fds are closed", where: inHost, capless: true, op: "register", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a release by root with every capability in a user namespace of its own is denied", where: inHost, userns: true, op: "release", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a gc by root with every capability in a user namespace of its own is denied", where: inHost, userns: true, op: "gc", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a register by root with every capability in a user namespace of its own is denied", where: inHost, userns: true, op: "register", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a register of a tap of its own under another pod's key and netns is denied", where: inHost, userns: true, ownTap: true, op: "register", wantCode: handoff.CodeDenied, keepsHeld: true},
		{name: "a fetch by root without napitapd's capabilities outside the pod netns is told the key does not exist", where: inHost, capless: true, op: "fetch", wantCode: handoff.CodeNotFound, wantErr: "not-found: no attachment vm/net1", keepsHeld: true},
		{name: "a fetch by root with every capability in a user namespace of its own is told the key does not exist", where: inHost, userns: true, op: "fetch", wantCode: handoff.CodeNotFound, wantErr: "not-found: no attachment vm/net1", keepsHeld: true},
		{name: "a list by root without napitapd's capabilities outside the pod netns is empty", where: inHost, capless: true, op: "list", keepsHeld: true},
		{name: "a list by root with every capability in a user namespace of its own is empty", where: inHost, userns: true, op: "list", keepsHeld: true},
		{name: "a list by a non-root peer in another netns is empty", where: inOther, uid: ptr(owner), gid: ptr(group), op: "list", keepsHeld: true},
		{name: "a list by a non-root peer in the pod netns shows that pod's attachment", where: inPod, uid: ptr(stranger), gid: ptr(stranger), op: "list", wantList: []string{key.String()}, keepsHeld: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "handoff")
			att := attachmentFor(pod, key, "net-a", tap, queues)
			var tapOwner, tapGroup *uint32
			if !tc.unowned {
				att = withOwner(att, owner, group)
				tapOwner, tapGroup = ptr[uint32](owner), ptr[uint32](group)
			}
			register(t, root, att, newTap(t, pod, tap, queues, tapOwner, tapGroup))
			t.Cleanup(func() { _ = root.Release(key) })

			args := helperArgs{uid: tc.uid, gid: tc.gid, groups: tc.groups, op: tc.op, capless: tc.capless, userns: tc.userns}
			var wantNetns uint64
			switch tc.where {
			case inPod:
				args.netns = pod.Path()
				wantNetns = netnsID(t, pod.Path())
			case inOther:
				args.netns = other.Path()
				wantNetns = netnsID(t, other.Path())
			default:
				wantNetns = hostNetnsID(t)
			}
			switch {
			case tc.key != nil:
				args.key = tc.key
			case !tc.byNetns:
				args.key = &key
			}
			if tc.op == "register" {
				args.key = nil
				args.att = withOwner(attachmentFor(pod, handoff.Key{ContainerID: "forged", IfName: "net1"}, "net-a", tap, 2), owner, group)
			}
			if tc.ownTap {
				// The victim's key and netns path; the attacker's own tap.
				args.op = "register-own-tap"
				args.att = withOwner(attachmentFor(pod, key, "net-a", "napihoevil", queues), owner, group)
			}
			before := d.settledFDs(t)
			res := runPeer(t, d.socket, args)
			t.Logf("peer: %+v", res)

			// The peer is who and where the case says.
			wantUID, wantGID := 0, 0
			if tc.uid != nil {
				wantUID, wantGID = *tc.uid, *tc.gid
			}
			if tc.userns {
				// Its uid 0 is unmapped in its namespace: it sees the
				// overflow uid. It shows every capability there.
				wantUID, wantGID = overflowID(t, "uid"), overflowID(t, "gid")
				ours, _ := os.Readlink("/proc/self/ns/user")
				if res.UserNS == ours || res.CapEff&daemonSetCapMask != daemonSetCapMask {
					t.Fatalf("peer ran in %s with CapEff 0x%x, want every capability in a user namespace of its own", res.UserNS, res.CapEff)
				}
			}
			if res.Uid != wantUID || res.Gid != wantGID || res.NetnsID != wantNetns {
				t.Fatalf("peer ran as %d/%d in netns %d, want %d/%d in %d", res.Uid, res.Gid, res.NetnsID, wantUID, wantGID, wantNetns)
			}

			if res.Code != tc.wantCode {
				t.Errorf("code %q (%s), want %q", res.Code, res.Err, tc.wantCode)
			}
			if tc.wantErr != "" && !strings.HasSuffix(res.Err, tc.wantErr) {
				t.Errorf("error %q, want it to end in %q and say no more", res.Err, tc.wantErr)
			}
			if res.FDs != tc.wantFDs {
				t.Errorf("peer got %d fds, want %d", res.FDs, tc.wantFDs)
			}
			if tc.wantFDs > 0 {
				if !res.NAPI || len(res.TapNames) != tc.wantFDs || slices.IndexFunc(res.TapNames, func(n string) bool { return n != tap }) >= 0 {
					t.Errorf("peer got queues of %v, NAPI=%v, want %d NAPI queues of %s", res.TapNames, res.NAPI, tc.wantFDs, tap)
				}
			}
			if tc.op == "list" && !slices.Equal(res.Attachments, tc.wantList) {
				t.Errorf("peer lists %v, want %v", res.Attachments, tc.wantList)
			}

			wantHeld := 0
			if tc.keepsHeld {
				wantHeld = queues
			}
			if n := heldBy(t, root); n != wantHeld {
				t.Errorf("napitapd holds %d fds, want %d", n, wantHeld)
			}
			all := listed(t, root)
			if _, ok := all[handoff.Key{ContainerID: "forged", IfName: "net1"}]; ok {
				t.Errorf("a non-root register went through")
			}
			if tc.keepsHeld && (all[key].TapName != tap || all[key].Netns != pod.Path()) {
				t.Errorf("napitapd records %s as %+v, want the pod's own tap %s in %s", key, all[key], tap, pod.Path())
			}
			// A peer that got the queues has exited: they are detached now.
			if tc.wantFDs > 0 {
				checkAttached(t, pod, tap, 0)
			} else {
				checkAttached(t, pod, tap, queues)
			}
			// napitapd kept nothing a peer sent it or it refused to hand out.
			d.waitFDs(t, before-(queues-wantHeld), "after the peer exited")
		})
	}
}

// TestAStaleKeyNeverReachesTheNextPodsTap replays the review's attack: the
// pod's netns goes without a DEL, a new netns takes its path (and, the
// kernel reusing inodes, its inode), and a new pod gets a tap of the same
// name there. The old key must not reach the new pod's queues.
func TestAStaleKeyNeverReachesTheNextPodsTap(t *testing.T) {
	nstest.RequireRoot(t)
	d := newDaemon(t)
	c := d.client()
	name := "napitap-handoff-reuse-" + nstest.RandomSuffix()
	path := filepath.Join("/run/netns", name)
	addNetns := func() {
		t.Helper()
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", name, err, out)
		}
	}
	delNetns := func() { _ = exec.Command("ip", "netns", "del", name).Run() }
	t.Cleanup(delNetns)

	const tap, queues = "napihor", 2
	oldKey := handoff.Key{ContainerID: "ctrOld", IfName: "net1"}
	newKey := handoff.Key{ContainerID: "ctrNew", IfName: "net1"}
	addNetns()
	var oldIno unix.Stat_t
	_ = unix.Stat(path, &oldIno)
	register(t, c, attachmentForPath(path, oldKey, tap, queues), newTapAt(t, path, tap, queues))
	_, files, err := c.Fetch(&oldKey)
	if err != nil {
		t.Fatalf("fetch %s: %v", oldKey, err)
	}
	tapsetup.CloseQueues(files)
	delNetns() // no DEL reaches napitapd
	// The kernel frees the old netns's inode once its teardown has run and
	// hands it to the next netns: try until the new netns has it, which is
	// what made an inode key hand out the next pod's queues.
	var newIno unix.Stat_t
	for try := 0; ; try++ {
		addNetns()
		_ = unix.Stat(path, &newIno)
		if newIno.Ino == oldIno.Ino || try == 50 {
			break
		}
		delNetns()
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("netns inode before %d, after %d (reused: %v)", oldIno.Ino, newIno.Ino, newIno.Ino == oldIno.Ino)
	register(t, c, attachmentForPath(path, newKey, tap, queues), newTapAt(t, path, tap, queues))
	_, files, err = c.Fetch(&newKey)
	if err != nil {
		t.Fatalf("the new pod's fetch: %v", err)
	}
	tapsetup.CloseQueues(files)

	_, files, err = c.Fetch(&oldKey)
	if err == nil || len(files) > 0 {
		tapsetup.CloseQueues(files)
		t.Fatalf("the stale key %s got %d fds of the new pod's tap", oldKey, len(files))
	}
	t.Logf("stale key: %v", err)
	if n := d.srv.Sweep(); n != 1 {
		t.Errorf("sweep released %d attachments, want the stale one", n)
	}
	got := listed(t, c)
	if _, ok := got[oldKey]; ok {
		t.Errorf("the stale attachment survived the sweep")
	}
	if _, ok := got[newKey]; !ok {
		t.Errorf("the sweep dropped the new pod's attachment")
	}
	_, files, err = c.Fetch(&newKey)
	if err != nil {
		t.Fatalf("the new pod's second fetch: %v", err)
	}
	tapsetup.CloseQueues(files)
}

func attachmentForPath(path string, key handoff.Key, tap string, queues int) *handoff.Attachment {
	return &handoff.Attachment{
		Key: key, Network: "net-a", Netns: path, TapName: tap,
		Queues: queues, MultiQueue: queues > 1, NAPI: true, VnetHdr: true, VnetHdrSize: 12,
	}
}

// TestAStateDirSomeoneElseControlsIsRefused replays the review's attack: a
// state dir made beforehand by another uid, holding a symlink where
// napitapd writes its temp file, must not make napitapd write through it.
func TestAStateDirSomeoneElseControlsIsRefused(t *testing.T) {
	nstest.RequireRoot(t)
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		prepare func(dir string)
	}{
		{"a state dir owned by another uid", func(dir string) {
			if err := os.Chown(dir, 3000, 3000); err != nil {
				t.Fatal(err)
			}
		}},
		{"a state dir anyone may write", func(dir string) {
			if err := os.Chmod(dir, 0o777); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, filepath.Join(dir, "ctr:net1.json.tmp")); err != nil {
				t.Fatal(err)
			}
			tc.prepare(dir)
			srv, err := handoff.NewServer(dir, newLogger(t))
			if err == nil {
				srv.Close()
				t.Fatalf("NewServer accepted %s", dir)
			}
			t.Logf("NewServer: %v", err)
			if b, _ := os.ReadFile(victim); string(b) != "precious" {
				t.Errorf("the symlink's target now holds %q", b)
			}
		})
	}
}

// TestNAPIFragsQueuesOnlyForAFetcherTheKernelWouldGiveThem: napitap opened
// the queues with IFF_NAPI_FRAGS, and a reopen would again with napitapd's
// own CAP_NET_ADMIN; the kernel gives that flag only to CAP_NET_ADMIN in
// the initial user namespace, so napitapd hands such queues to no one else.
func TestNAPIFragsQueuesOnlyForAFetcherTheKernelWouldGiveThem(t *testing.T) {
	nstest.RequireRoot(t)
	sockDir := sharedSockDir(t)
	d := startCappedDaemon(t, filepath.Join(t.TempDir(), "state"), filepath.Join(sockDir, "napitapd.sock"))
	root := d.client()
	pod := nstest.New(t, "handoff")
	const owner, queues, tap = 107, 2, "napihofr"
	key := handoff.Key{ContainerID: "vm", IfName: "net1"}
	att := withOwner(attachmentFor(pod, key, "net-a", tap, queues), owner, owner)
	att.NAPIFrags = true
	var files []*os.File
	pod.Run(t, func() error {
		var err error
		_, files, err = tapsetup.Create(tapsetup.Spec{Name: tap, Queues: queues, VnetHdrSize: 12, Owner: ptr[uint32](owner), Group: ptr[uint32](owner),
			Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true, NAPIFrags: true}})
		return err
	})
	t.Cleanup(func() { _ = pod.Do(func(ns.NetNS) error { return tapsetup.DeleteTap(tap, "") }) })
	register(t, root, att, files)
	t.Cleanup(func() { _ = root.Release(key) })

	steps := []struct {
		name     string
		uid      *int
		wantCode string
		wantFDs  int
	}{
		{name: "the tap's owner without CAP_NET_ADMIN is denied the held queues", uid: ptr(owner), wantCode: handoff.CodeDenied},
		{name: "root with CAP_NET_ADMIN gets them", wantFDs: queues},
		{name: "the tap's owner is denied the reopened queues too", uid: ptr(owner), wantCode: handoff.CodeDenied},
		{name: "root gets the reopened queues", wantFDs: queues},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			res := runPeer(t, d.socket, helperArgs{uid: st.uid, gid: st.uid, netns: pod.Path(), op: "fetch", key: &key})
			if res.Code != st.wantCode || res.FDs != st.wantFDs {
				t.Fatalf("code %q (%s) with %d fds, want %q with %d", res.Code, res.Err, res.FDs, st.wantCode, st.wantFDs)
			}
			if st.wantCode != "" && !strings.Contains(res.Err, "napiFrags") {
				t.Errorf("error %q does not name napiFrags", res.Err)
			}
		})
	}
}

// TestARegisterIsCheckedAgainstTheKernel: napitapd holds only queues it
// has seen to be the attachment's: each fd a queue of the tap the register
// names (TUNGETIFF), in the netns at the path it names (TUNGETDEVNETNS),
// the tap marked as the key's; and a key is never replaced. A refused
// register leaves napitapd as it was and its fds closed.
func TestARegisterIsCheckedAgainstTheKernel(t *testing.T) {
	nstest.RequireRoot(t)
	d := newDaemon(t)
	c := d.client()
	const queues = 2
	key := handoff.Key{ContainerID: "vmreg", IfName: "net1"}
	cases := []struct {
		name string
		// send makes the queues the register carries; a tap's are named
		// by its netns and name, for the check that they were closed.
		send     func(t *testing.T, pod, other *nstest.NetNS, att *handoff.Attachment) ([]*os.File, *nstest.NetNS, string)
		unmarked bool
		wantCode string
		wantErr  string
	}{
		{name: "the queues of the marked tap in the named netns are held",
			send: func(t *testing.T, pod, _ *nstest.NetNS, att *handoff.Attachment) ([]*os.File, *nstest.NetNS, string) {
				return newTap(t, pod, att.TapName, queues, nil, nil), pod, att.TapName
			}},
		{name: "fds that are not tun queues are refused", wantCode: handoff.CodeBadRequest, wantErr: "not /dev/net/tun",
			send: func(t *testing.T, pod, _ *nstest.NetNS, att *handoff.Attachment) ([]*os.File, *nstest.NetNS, string) {
				newTap(t, pod, att.TapName, queues, nil, nil)
				return devNull(t, queues), nil, ""
			}},
		{name: "the queues of a tap of that name in another netns are refused", wantCode: handoff.CodeBadRequest, wantErr: "in another netns",
			send: func(t *testing.T, pod, other *nstest.NetNS, att *handoff.Attachment) ([]*os.File, *nstest.NetNS, string) {
				newTap(t, pod, att.TapName, queues, nil, nil)
				return newTap(t, other, att.TapName, queues, nil, nil), other, att.TapName
			}},
		{name: "the queues of another tap than the one named are refused", wantCode: handoff.CodeBadRequest, wantErr: `a queue of "napiregy"`,
			send: func(t *testing.T, pod, _ *nstest.NetNS, att *handoff.Attachment) ([]*os.File, *nstest.NetNS, string) {
				newTap(t, pod, att.TapName, queues, nil, nil)
				return newTap(t, pod, "napiregy", queues, nil, nil), pod, "napiregy"
			}},
		{name: "a tap not marked as the attachment's is refused", unmarked: true, wantCode: handoff.CodeBadRequest, wantErr: "is not marked as the attachment's",
			send: func(t *testing.T, pod, _ *nstest.NetNS, att *handoff.Attachment) ([]*os.File, *nstest.NetNS, string) {
				return newTap(t, pod, att.TapName, queues, nil, nil), pod, att.TapName
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod, other := nstest.New(t, "handoff"), nstest.New(t, "handoff")
			att := attachmentFor(pod, key, "net-reg", "napiregx", queues)
			files, sentNS, sentTap := tc.send(t, pod, other, att)
			if !tc.unmarked {
				markTap(t, att)
			}
			err := c.Register(att, files)
			tapsetup.CloseQueues(files)
			t.Cleanup(func() { _ = c.Release(key) })
			code := ""
			var perr *handoff.Error
			if errors.As(err, &perr) {
				code = perr.Code
			}
			if code != tc.wantCode || (tc.wantErr != "") != (err != nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Register: %v (code %q); want code %q saying %q", err, code, tc.wantCode, tc.wantErr)
			}
			_, registered := listed(t, c)[key]
			if registered != (tc.wantCode == "") {
				t.Errorf("registered: %v, want %v", registered, tc.wantCode == "")
			}
			if tc.wantCode == "" {
				checkAttached(t, pod, att.TapName, queues)
				return
			}
			// napitapd closed what it refused: nothing keeps a queue attached.
			if sentNS != nil {
				if n, _ := tapQueues(t, sentNS, sentTap); n != 0 {
					t.Errorf("tap %s has %d queues attached after a refused register, want 0", sentTap, n)
				}
			}
			if n := heldBy(t, c); n != 0 {
				t.Errorf("napitapd holds %d fds after a refused register", n)
			}
		})
	}

	t.Run("a key already registered is refused and keeps its queues", func(t *testing.T) {
		pod, other := nstest.New(t, "handoff"), nstest.New(t, "handoff")
		first := attachmentFor(pod, key, "net-reg", "napiregx", queues)
		register(t, c, first, newTap(t, pod, first.TapName, queues, nil, nil))
		t.Cleanup(func() { _ = c.Release(key) })
		second := attachmentFor(other, key, "net-reg", "napiregx", queues)
		files := newTap(t, other, second.TapName, queues, nil, nil)
		markTap(t, second)
		err := c.Register(second, files)
		tapsetup.CloseQueues(files)
		if !handoff.IsCode(err, handoff.CodeExists) {
			t.Fatalf("a second register of %s: %v, want %s", key, err, handoff.CodeExists)
		}
		if got := listed(t, c)[key]; got.Netns != pod.Path() || got.Held != queues {
			t.Errorf("napitapd records %s as %+v, want the first register's %d queues in %s", key, got, queues, pod.Path())
		}
	})
}

func devNull(t testing.TB, n int) []*os.File {
	t.Helper()
	var files []*os.File
	for range n {
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return files
}

// TestARequestWhoseCallerHungUpIsNotActedOn: a plugin that gave up while
// napitapd was down (its ADD timed out) leaves its register in the
// socket's backlog and undoes its tap. napitapd, back, reads it: it
// registers nothing, keeps none of its fds, and logs no refusal.
func TestARequestWhoseCallerHungUpIsNotActedOn(t *testing.T) {
	nstest.RequireRoot(t)
	dir := t.TempDir()
	var log syncbuf.Buffer
	srv, err := handoff.NewServer(filepath.Join(dir, "state"), slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "napitapd.sock")
	l, err := handoff.Listen(socket, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	pod := nstest.New(t, "handoff")
	key := handoff.Key{ContainerID: "gaveup", IfName: "net1"}
	att := attachmentFor(pod, key, "net-a", "napihogu", 2)
	queues := newTap(t, pod, att.TapName, 2, nil, nil)
	markTap(t, att)

	// napitapd is down: the connection waits in the backlog.
	fd, err := dialSeqpacket(socket)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(handoff.Request{Version: handoff.Version, Op: handoff.OpRegister, Attachment: att})
	if err != nil {
		t.Fatal(err)
	}
	rights := unix.UnixRights(int(queues[0].Fd()), int(queues[1].Fd()))
	if err := unix.Sendmsg(fd, b, rights, nil, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	tapsetup.CloseQueues(queues)

	done := make(chan struct{})
	go func() { _ = srv.Serve(context.Background(), l); close(done) }()
	t.Cleanup(func() { l.Close(); <-done; srv.Close() })
	c := &handoff.Client{Socket: socket, Timeout: 10 * time.Second}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(log.String(), "caller has hung up"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("napitapd never read the request:\n%s", log.String())
		}
	}
	if _, ok := listed(t, c)[key]; ok {
		t.Errorf("napitapd registered %s for a caller that had hung up", key)
	}
	if n, _ := tapQueues(t, pod, att.TapName); n != 0 {
		t.Errorf("tap %s has %d queues attached: napitapd kept the fds of a request nobody waits for", att.TapName, n)
	}
	if strings.Contains(log.String(), "level=WARN") {
		t.Errorf("napitapd logged a warning for it:\n%s", log.String())
	}
}
