package seccompagent

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// The slot (slot.go): a napitapd that dies between RECV and SEND leaves
// the notification and its attach in the slot, which the fd holder keeps
// with the listener, and the next napitapd answers the caller from them.
// The tests play the napitapd that dies themselves, with the package's
// own code, and hand listener and slot to a fresh agent as the holder
// would, through Adopt.

// TestANotificationReceivedByADeadAgentIsAnsweredByTheNext: RECV puts the
// notification in the slot and napitapd dies before doing anything with
// it; the caller's TUNSETIFF, which no new RECV would return, is answered
// by the agent that adopts listener and slot, with a NAPI queue.
func TestANotificationReceivedByADeadAgentIsAnsweredByTheNext(t *testing.T) {
	pod, tap, reg := slotTestPod(t, "seccompslot")
	before := openFDs(t)
	listener, res := callerUnderFilter(t, pod, tap)
	dead := receiveInSlot(t, listener)
	expectBlocked(t, res)

	logs := &syncbuf.Buffer{}
	store := &recordingStore{t: t}
	agent := newSlotTestAgent(t, reg, logs, store)
	deadIno := inode(t, dead.f)
	if err := agent.Adopt(Listener{File: listener, Slot: dead.release(), Origin: "a napitapd that died", ID: "fromtheholder"}); err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	r := awaitCaller(t, res)
	if r.errno != 0 || r.flags&unix.IFF_NAPI == 0 {
		t.Errorf("the caller's TUNSETIFF: %v, flags 0x%x; want 0 and IFF_NAPI\n%s", r.errno, r.flags, logs.String())
	}
	if !strings.Contains(logs.String(), "answering a TUNSETIFF the previous napitapd received and never answered") {
		t.Errorf("the agent did not say it answered the dead one's notification:\n%s", logs.String())
	}
	if c := store.get(); len(c) == 0 || c[0] != (storeCall{op: "keep", id: "fromtheholder", slot: deadIno}) {
		t.Errorf("store calls %+v, want first a Keep of the listener's own ID with the dead agent's slot (inode %d)", c, deadIno)
	}
	waitServed(t, agent, 0)
	agent.Close()
	waitFDs(t, before, "after the agent closed")
}

// TestACallerAttachedByADeadAgentGetsZeroNotEEXIST: napitapd dies after
// attaching the caller's fd and before answering. The next one finds the
// fd attached, which the kernel would answer with EEXIST (QEMU and
// libvirt fail to start); the attach recorded in the slot makes it 0.
func TestACallerAttachedByADeadAgentGetsZeroNotEEXIST(t *testing.T) {
	pod, tap, reg := slotTestPod(t, "seccompslot")
	tests := []struct {
		name string
		// forget: the record is wiped after the attach, to show what it
		// is there for.
		forget    bool
		wantErrno unix.Errno
	}{
		{"with the dead agent's record of the attach, the caller gets 0 and its NAPI queue", false, 0},
		{"without the record, the kernel's EEXIST: what the slot prevents", true, unix.EEXIST},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			listener, res := callerUnderFilter(t, pod, tap)
			dead := receiveInSlot(t, listener)
			// What the dying agent's answer does up to NOTIF_SEND.
			deadLogs := &syncbuf.Buffer{}
			deadAgent := newSlotTestAgent(t, reg, deadLogs, nil)
			sock := newNetnsSocket()
			rc, err := listener.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var v verdict
			if err := rc.Control(func(fd uintptr) { v = deadAgent.decide(int(fd), dead.notif(), sock, nil, dead, nil) }); err != nil {
				t.Fatal(err)
			}
			sock.close()
			if v.queue == nil {
				t.Fatalf("the dying agent did not attach: %+v\n%s", v, deadLogs.String())
			}
			dead.setLast(dead.notif().Pid, *v.queue)
			if tc.forget {
				dead.putLast(lastAttach{})
			}
			deadAgent.Close()
			expectBlocked(t, res)

			logs := &syncbuf.Buffer{}
			agent := newSlotTestAgent(t, reg, logs, nil)
			if err := agent.Adopt(Listener{File: listener, Slot: dead.release(), Origin: "a napitapd that died"}); err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			r := awaitCaller(t, res)
			if r.errno != tc.wantErrno {
				t.Errorf("the caller's TUNSETIFF: %v, want %v\n%s", r.errno, tc.wantErrno, logs.String())
			}
			if r.errno == 0 && r.flags&unix.IFF_NAPI == 0 {
				t.Errorf("the caller's queue: flags 0x%x lack IFF_NAPI", r.flags)
			}
			if restarted := strings.Contains(logs.String(), "napitapd attached the queue: 0, not EEXIST"); restarted == tc.forget {
				t.Errorf("the agent answered from the record: %v, want %v\n%s", restarted, !tc.forget, logs.String())
			}
			waitServed(t, agent, 0)
			agent.Close()
			waitFDs(t, before, "after the agent closed")
		})
	}
}

// TestASlotThatIsNotATrustedMemfdIsReplacedAndTheListenerServed: a slot
// comes from another process (the fd holder, a takeover); one napitapd
// could not map safely, or whose layout it does not know, is replaced by
// a fresh one, and the listener is served all the same.
func TestASlotThatIsNotATrustedMemfdIsReplacedAndTheListenerServed(t *testing.T) {
	pod, tap, reg := slotTestPod(t, "seccompslot")
	tests := []struct {
		name    string
		make    func(t *testing.T) *os.File
		trusted bool
	}{
		{"a sealed memfd of one page with the agent's layout is kept", func(t *testing.T) *os.File {
			return slotFile(t, true, slotSize, slotSeals|unix.F_SEAL_SEAL, slotMagic, slotVersion)
		}, true},
		{"a regular file is replaced: it could be truncated under the mapping", func(t *testing.T) *os.File {
			f, err := os.CreateTemp(t.TempDir(), "slot")
			if err != nil {
				t.Fatal(err)
			}
			writeSlotHeader(t, f, slotSize, slotMagic, slotVersion)
			return f
		}, false},
		{"a memfd of two pages is replaced", func(t *testing.T) *os.File {
			return slotFile(t, true, 2*slotSize, slotSeals|unix.F_SEAL_SEAL, slotMagic, slotVersion)
		}, false},
		{"a memfd not sealed against shrinking is replaced", func(t *testing.T) *os.File {
			return slotFile(t, true, slotSize, unix.F_SEAL_GROW, slotMagic, slotVersion)
		}, false},
		{"a memfd that cannot be sealed is replaced", func(t *testing.T) *os.File {
			return slotFile(t, false, slotSize, 0, slotMagic, slotVersion)
		}, false},
		{"a memfd with another magic number is replaced", func(t *testing.T) *os.File {
			return slotFile(t, true, slotSize, slotSeals, 0xdeadbeef, slotVersion)
		}, false},
		{"a slot of another layout version is replaced", func(t *testing.T) *os.File {
			return slotFile(t, true, slotSize, slotSeals, slotMagic, slotVersion+1)
		}, false},
		{"a sealed memfd that may not be written is replaced", func(t *testing.T) *os.File {
			return slotFile(t, true, slotSize, slotSeals|unix.F_SEAL_WRITE, slotMagic, slotVersion)
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := openFDs(t)
			given := tc.make(t)
			givenIno := inode(t, given)
			listener, res := callerUnderFilter(t, pod, tap)
			logs := &syncbuf.Buffer{}
			store := &recordingStore{t: t}
			agent := newSlotTestAgent(t, reg, logs, store)
			if err := agent.Adopt(Listener{File: listener, Slot: given, Origin: "test"}); err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			r := awaitCaller(t, res)
			if r.errno != 0 || r.flags&unix.IFF_NAPI == 0 {
				t.Errorf("the caller's TUNSETIFF: %v, flags 0x%x; want 0 and IFF_NAPI\n%s", r.errno, r.flags, logs.String())
			}
			c := store.get()
			if len(c) == 0 || c[0].op != "keep" || c[0].slot == 0 || len(c[0].id) != 16 {
				t.Fatalf("store calls %+v, want first a Keep with a slot and a fresh 16-character ID", c)
			}
			if kept := c[0].slot == givenIno; kept != tc.trusted {
				t.Errorf("the agent kept the slot it was given: %v, want %v", kept, tc.trusted)
			}
			if replaced := strings.Contains(logs.String(), "slot not trusted: a fresh one replaces it"); replaced == tc.trusted {
				t.Errorf("the agent logged a replacement: %v, want %v\n%s", replaced, !tc.trusted, logs.String())
			}
			waitServed(t, agent, 0)
			agent.Close()
			waitFDs(t, before, "after the agent closed")
		})
	}
}

// TestTheStoreKeepsAListenerFromAddOrAdoptUntilItsProcessesExit: the fd
// holder gets each listener as Add or Adopt accepts it, before Add
// returns, and lets it go only when its processes have exited: neither a
// takeover's Detach nor the Close of a napitapd stopped by SIGTERM (a
// liveness probe's restart) takes it from the holder.
func TestTheStoreKeepsAListenerFromAddOrAdoptUntilItsProcessesExit(t *testing.T) {
	nstest.RequireRoot(t)
	before := openFDs(t)
	logs := &syncbuf.Buffer{}
	oldStore, newStore := &recordingStore{t: t}, &recordingStore{t: t}
	old := newSlotTestAgent(t, &MapRegistry{}, logs, oldStore)
	next := newSlotTestAgent(t, &MapRegistry{}, logs, newStore)

	exit1, exit2 := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		for _, c := range []chan struct{}{exit1, exit2} {
			select {
			case <-c:
			default:
				close(c)
			}
		}
	})
	for i, exit := range []chan struct{}{exit1, exit2} {
		fd := filterUntil(t, exit)
		if err := old.Add(fd, 0, fmt.Sprintf("listener %d", i+1)); err != nil {
			t.Fatalf("Add: %v", err)
		}
		if c := oldStore.get(); len(c) != i+1 || c[i].op != "keep" || c[i].slot == 0 || len(c[i].id) != 16 {
			t.Fatalf("after Add %d: store calls %+v, want a Keep with a slot and a fresh ID", i+1, c)
		}
	}
	kept := oldStore.get()
	if kept[0].id == kept[1].id {
		t.Fatalf("two listeners share the ID %s", kept[0].id)
	}

	ls := old.Detach()
	if len(ls) != 2 {
		t.Fatalf("Detach: %d listeners, want 2", len(ls))
	}
	for _, l := range ls {
		if l.Slot == nil {
			t.Fatalf("Detach: %s without its slot", l.Origin)
		}
	}
	for _, l := range ls {
		if err := next.Adopt(l); err != nil {
			t.Fatalf("Adopt: %v", err)
		}
	}
	if c := oldStore.get(); len(c) != 2 {
		t.Errorf("the store heard from the agent that detached: %+v", c[2:])
	}
	adopted := newStore.get()
	if len(adopted) != 2 {
		t.Fatalf("after Adopt: store calls %+v, want two Keeps", adopted)
	}
	// The same listeners, by the same names, with the same slots.
	for _, k := range kept {
		if !slices.Contains(adopted, k) {
			t.Errorf("Keep %+v of the detaching agent was not kept again as it was by the adopting one: %+v", k, adopted)
		}
	}

	close(exit1)
	for deadline := time.Now().Add(5 * time.Second); len(newStore.get()) < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first listener's process exited 5 s ago: store calls %+v, want a Forget", newStore.get())
		}
	}
	if c := newStore.get(); len(c) != 3 || c[2] != (storeCall{op: "forget", id: kept[0].id}) {
		t.Fatalf("after the first listener's process exited: store calls %+v, want Forget(%s)", c, kept[0].id)
	}
	waitServed(t, next, 1)

	next.Close()
	old.Close()
	if c := newStore.get(); len(c) != 3 {
		t.Errorf("Close told the store %+v", c[3:])
	}
	close(exit2)
	waitFDs(t, before, "after both agents closed")
}

// slotTestPod is a pod netns with a persistent multiqueue tap that no
// queue holds, as napitap leaves one in intercept mode, and a registry
// that names it.
func slotTestPod(t *testing.T, role string) (string, string, *MapRegistry) {
	t.Helper()
	nstest.RequireRoot(t)
	pod := nstest.New(t, role)
	const tap = "napislot0"
	pod.Run(t, func() error { return nstest.MakePersistentTap(tap) })
	netnsID, err := tapsetup.NetnsID(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	reg := &MapRegistry{}
	reg.Set(netnsID, tap, Target{Key: "slot-test/net1", NAPI: true, MultiQueue: true})
	return pod.Path(), tap, reg
}

func newSlotTestAgent(t *testing.T, reg Registry, logs *syncbuf.Buffer, store Store) *Agent {
	t.Helper()
	a, err := New(reg, slog.New(slog.NewTextHandler(logs, nil)), Options{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

type callResult struct {
	errno unix.Errno
	flags uint16
	err   error
}

// callerUnderFilter is a QEMU-like TUNSETIFF on tap from a thread of this
// process in netnsPath that carries the filter; its listener is the
// test's to serve. The thread ends with the call.
func callerUnderFilter(t *testing.T, netnsPath, tap string) (*os.File, <-chan callResult) {
	t.Helper()
	return callerUnderFilterUntil(t, netnsPath, tap, nil)
}

// callerUnderFilterUntil is callerUnderFilter whose thread, as a VMM does,
// stays after the call until release is closed (nil: it does not stay),
// so that its listener stays served.
func callerUnderFilterUntil(t *testing.T, netnsPath, tap string, release <-chan struct{}) (*os.File, <-chan callResult) {
	t.Helper()
	fds := make(chan int, 1)
	res := make(chan callResult, 1)
	nstest.OnThreadThatEnds(func() {
		fd, err := func() (int, error) {
			nsfd, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return -1, err
			}
			err = unix.Setns(nsfd, unix.CLONE_NEWNET)
			unix.Close(nsfd)
			if err != nil {
				return -1, fmt.Errorf("setns: %w", err)
			}
			return installFilter(filterFlags)
		}()
		if err != nil {
			res <- callResult{err: err}
			fds <- -1
			return
		}
		fds <- fd
		errno, flags, err := attachOnce(tap)
		res <- callResult{errno, flags, err}
		if release != nil {
			<-release
		}
	})
	fd := <-fds
	if fd < 0 {
		t.Fatalf("under the filter: %v", (<-res).err)
	}
	return os.NewFile(uintptr(fd), "seccomp-listener"), res
}

// filterUntil puts a thread of this process under the filter until exit
// is closed, and returns its listener.
func filterUntil(t *testing.T, exit <-chan struct{}) int {
	t.Helper()
	fds := make(chan int, 1)
	errs := make(chan error, 1)
	nstest.OnThreadThatEnds(func() {
		fd, err := installFilter(filterFlags)
		if err != nil {
			errs <- err
			return
		}
		fds <- fd
		<-exit
	})
	select {
	case fd := <-fds:
		return fd
	case err := <-errs:
		t.Fatalf("under the filter: %v", err)
	}
	return -1
}

// receiveInSlot is what a napitapd does with the caller's notification
// before it dies: RECV into a slot.
func receiveInSlot(t *testing.T, listener *os.File) *slot {
	t.Helper()
	s, err := newSlot()
	if err != nil {
		t.Fatal(err)
	}
	rc, err := listener.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var recvErr error
	if err := rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(pfd, 10_000); n != 1 {
			recvErr = fmt.Errorf("no notification within 10 s: %v", err)
			return
		}
		recvErr = notifRecv(int(fd), s.notif())
	}); err != nil {
		t.Fatal(err)
	}
	if recvErr != nil {
		t.Fatalf("SECCOMP_IOCTL_NOTIF_RECV: %v", recvErr)
	}
	if n := s.notif(); n.ID == 0 || uint32(n.Data.Args[1]) != tunSetIffLo {
		t.Fatalf("received %+v, not a TUNSETIFF", *n)
	}
	return s
}

// expectBlocked checks that the caller still waits: nobody answered.
func expectBlocked(t *testing.T, res <-chan callResult) {
	t.Helper()
	select {
	case r := <-res:
		t.Fatalf("the caller returned before any agent answered: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
}

func awaitCaller(t *testing.T, res <-chan callResult) callResult {
	t.Helper()
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("caller: %v", r.err)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("the caller's TUNSETIFF still waits after 10 s")
	}
	return callResult{}
}

// waitServed waits for the agent to serve n listeners.
func waitServed(t *testing.T, a *Agent, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); a.Listeners() != n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the agent serves %d listeners, want %d", a.Listeners(), n)
		}
	}
}

// slotFile is a memfd (sealable or not) of size bytes with seals and a
// header of magic and version.
func slotFile(t *testing.T, sealable bool, size int, seals int, magic, version uint32) *os.File {
	t.Helper()
	flags := unix.MFD_CLOEXEC
	if sealable {
		flags |= unix.MFD_ALLOW_SEALING
	}
	fd, err := unix.MemfdCreate(slotName, flags)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "memfd:"+slotName)
	writeSlotHeader(t, f, size, magic, version)
	if seals != 0 {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
			t.Fatalf("F_ADD_SEALS 0x%x: %v", seals, err)
		}
	}
	return f
}

func writeSlotHeader(t *testing.T, f *os.File, size int, magic, version uint32) {
	t.Helper()
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	binary.NativeEndian.PutUint32(b[:4], magic)
	binary.NativeEndian.PutUint32(b[4:], version)
	if _, err := f.WriteAt(b[:], 0); err != nil {
		t.Fatal(err)
	}
}

func inode(t *testing.T, f *os.File) uint64 {
	t.Helper()
	st, err := statFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// statFile fstat's f without taking it out of Go's poller, as Fd would.
func statFile(f *os.File) (unix.Stat_t, error) {
	var st unix.Stat_t
	rc, err := f.SyscallConn()
	if err != nil {
		return st, err
	}
	var statErr error
	if err := rc.Control(func(fd uintptr) { statErr = unix.Fstat(int(fd), &st) }); err != nil {
		return st, err
	}
	return st, statErr
}

// storeCall is one call a Store got: Keep with the inode of the slot it
// was lent (0: none), or Forget.
type storeCall struct {
	op   string
	id   string
	slot uint64
}

// recordingStore records the calls; it keeps no copies, and checks during
// Keep what it was lent: a seccomp listener, and a slot that is a sealed
// memfd of one page.
type recordingStore struct {
	t     *testing.T
	mu    sync.Mutex
	calls []storeCall
}

func (s *recordingStore) Keep(l Listener) {
	c := storeCall{op: "keep", id: l.ID}
	rc, err := l.File.SyscallConn()
	if err == nil {
		err = rc.Control(func(fd uintptr) {
			target, _ := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(fd)))
			if target != "anon_inode:seccomp notify" {
				s.t.Errorf("Keep: File is %q, not a seccomp listener", target)
			}
		})
	}
	if err != nil {
		s.t.Errorf("Keep: File: %v", err)
	}
	if l.Slot != nil {
		st, err := statFile(l.Slot)
		if err != nil || st.Size != int64(slotSize) {
			s.t.Errorf("Keep: Slot: %d bytes, %v", st.Size, err)
		}
		c.slot = st.Ino
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

func (s *recordingStore) Forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, storeCall{op: "forget", id: id})
}

func (s *recordingStore) get() []storeCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]storeCall(nil), s.calls...)
}
