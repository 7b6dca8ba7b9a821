package handoff_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// copyStore keeps copies of what it is told to keep, as napitapd's fd
// holder does.
type copyStore struct {
	mu   sync.Mutex
	kept map[handoff.Key][]*os.File
}

func (s *copyStore) KeepQueues(key handoff.Key, files []*os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tapsetup.CloseQueues(s.kept[key])
	var copies []*os.File
	for _, f := range files {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			panic(err)
		}
		copies = append(copies, os.NewFile(uintptr(fd), f.Name()))
	}
	s.kept[key] = copies
}

func (s *copyStore) ForgetQueues(key handoff.Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tapsetup.CloseQueues(s.kept[key])
	delete(s.kept, key)
}

func (s *copyStore) count(key handoff.Key) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.kept[key])
}

func (s *copyStore) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, files := range s.kept {
		tapsetup.CloseQueues(files)
		delete(s.kept, k)
	}
}

// TestTheStoreKeepsCopiesOfExactlyTheQueuesTheServerHolds: a copy kept
// past a fetch would hold a queue attached that no runtime reads; one
// missing would be lost in a crash.
func TestTheStoreKeepsCopiesOfExactlyTheQueuesTheServerHolds(t *testing.T) {
	nstest.RequireRoot(t)
	const tap, queues = "napihos1", 4
	pod := nstest.New(t, "handoff")
	store := &copyStore{kept: map[handoff.Key][]*os.File{}}
	t.Cleanup(store.close)
	dir := t.TempDir()
	stateDir, socket := filepath.Join(dir, "state"), filepath.Join(dir, "napitapd.sock")
	d := startDaemon(t, stateDir, socket, 0o660, func(s *handoff.Server) { s.Store = store })
	c := d.client()
	key := handoff.Key{ContainerID: "store", IfName: "net1"}
	want := func(step string, n int) {
		t.Helper()
		if got := store.count(key); got != n {
			t.Errorf("%s: the store keeps %d queues of %s, want %d", step, got, key, n)
		}
	}

	registerNew(t, c, pod, key, tap, queues)
	want("after register", queues)

	fetched := fetchQueues(t, c, key, tap, queues, "Fetch")
	want("after a fetch", 0)
	tapsetup.CloseQueues(fetched)
	// napitapd closes its own copies of what it sent once the send is
	// done, which may be just after the runtime got them.
	waitDetached := func(step string) {
		t.Helper()
		a := -1
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if a, _ = tapQueues(t, pod, tap); a == 0 {
				return
			}
		}
		t.Errorf("%s: tap %s has %d queues attached 5 s after, want 0: a copy outlived the fetch", step, tap, a)
	}
	waitDetached("once the runtime closed what it fetched")

	again := fetchQueues(t, c, key, tap, queues, "Fetch after the runtime closed its queues")
	want("after a fetch that reopened the queues", 0)
	tapsetup.CloseQueues(again)
	waitDetached("once the runtime closed the reopened queues")

	other := handoff.Key{ContainerID: "store", IfName: "net2"}
	registerNew(t, c, pod, other, "napihos2", queues)
	if got := store.count(other); got != queues {
		t.Fatalf("after register of %s the store keeps %d queues, want %d", other, got, queues)
	}
	if err := c.Release(other); err != nil {
		t.Fatal(err)
	}
	if got := store.count(other); got != 0 {
		t.Errorf("after release of %s the store keeps %d queues, want 0", other, got)
	}

	// SIGTERM's Close leaves the store alone: a liveness probe's restart
	// is a SIGTERM.
	last := handoff.Key{ContainerID: "store", IfName: "net3"}
	registerNew(t, c, pod, last, "napihos3", queues)
	d.stop()
	if got := store.count(last); got != queues {
		t.Errorf("after the server closed, the store keeps %d queues of %s, want %d", got, last, queues)
	}
}
