package daemon

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/fdtest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/takeover"
)

// TestTheHoldersEntriesAreTakenOnlyWhenTheyAreWhatTheirNamesSay: the next
// napitapd builds itself from the holder's entries; one whose meta is not
// its name's item, or whose files do not fit its kind, is left out.
func TestTheHoldersEntriesAreTakenOnlyWhenTheyAreWhatTheirNamesSay(t *testing.T) {
	key := handoff.Key{ContainerID: "c1", IfName: "net1"}
	other := handoff.Key{ContainerID: "c2", IfName: "net1"}
	meta := func(item takeover.Item) json.RawMessage {
		b, err := json.Marshal(item)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	listener := takeover.Item{Kind: takeover.KindListener, UID: 107, Origin: "pod x", ID: "0123456789abcdef", OwnTaps: true}
	tests := []struct {
		name  string
		entry fdstore.Entry // Files: how many
		files int
		kinds []string // of the files taken, none if left out
	}{
		{"a listener with its slot is a listener and a slot", fdstore.Entry{Name: "listener/0123456789abcdef", Meta: meta(listener)}, 2,
			[]string{takeover.KindListener, takeover.KindSlot}},
		{"a listener without a slot is a listener", fdstore.Entry{Name: "listener/0123456789abcdef", Meta: meta(listener)}, 1,
			[]string{takeover.KindListener}},
		{"a listener with three files is left out", fdstore.Entry{Name: "listener/0123456789abcdef", Meta: meta(listener)}, 3, nil},
		{"a listener under another listener's name is left out", fdstore.Entry{Name: "listener/ffffffffffffffff", Meta: meta(listener)}, 2, nil},
		{"a listener without an ID is left out", fdstore.Entry{Name: "listener/", Meta: meta(takeover.Item{Kind: takeover.KindListener})}, 1, nil},
		{"an attachment's queues are queues", fdstore.Entry{Name: queuesEntry(key), Meta: meta(takeover.Item{Kind: takeover.KindQueue, Key: &key})}, 4,
			[]string{takeover.KindQueue, takeover.KindQueue, takeover.KindQueue, takeover.KindQueue}},
		{"queues under another attachment's name are left out", fdstore.Entry{Name: queuesEntry(other), Meta: meta(takeover.Item{Kind: takeover.KindQueue, Key: &key})}, 2, nil},
		{"queues under their key itself, not its hash, are left out", fdstore.Entry{Name: "queues/" + key.String(), Meta: meta(takeover.Item{Kind: takeover.KindQueue, Key: &key})}, 2, nil},
		{"a socket is a socket", fdstore.Entry{Name: "socket/handoff", Meta: meta(takeover.Item{Kind: takeover.KindSocket, Name: "handoff"})}, 1,
			[]string{takeover.KindSocket}},
		{"a socket of two files is left out", fdstore.Entry{Name: "socket/handoff", Meta: meta(takeover.Item{Kind: takeover.KindSocket, Name: "handoff"})}, 2, nil},
		{"the state dir's lock is never taken from the holder", fdstore.Entry{Name: "socket/lock", Meta: meta(takeover.Item{Kind: takeover.KindLock})}, 1, nil},
		{"an entry of a name napitapd does not make is left out", fdstore.Entry{Name: "other/x", Meta: meta(takeover.Item{Kind: takeover.KindSocket, Name: "x"})}, 1, nil},
		{"meta that is no item is left out", fdstore.Entry{Name: "socket/handoff", Meta: json.RawMessage(`"x"`)}, 1, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var all []*os.File
			for range tc.files {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				w.Close()
				all = append(all, r)
			}
			tc.entry.Files = all
			got, skipped := filesOf([]fdstore.Entry{tc.entry})
			defer takeover.CloseAll(got)
			var kinds []string
			for _, f := range got {
				kinds = append(kinds, f.Kind)
				if f.Kind == takeover.KindListener && f.Item != listener {
					t.Errorf("the listener came back as %+v, not as kept (%+v)", f.Item, listener)
				}
			}
			if len(kinds) != len(tc.kinds) || (tc.kinds == nil) != (len(skipped) == 1) {
				t.Fatalf("took %v, left out %v; want %v", kinds, skipped, tc.kinds)
			}
			for i := range kinds {
				if kinds[i] != tc.kinds[i] {
					t.Errorf("file %d is taken as %q, want %q", i, kinds[i], tc.kinds[i])
				}
			}
			if tc.kinds == nil {
				// Left out: its files are closed, not leaked.
				for _, f := range all {
					if err := f.Close(); err == nil {
						t.Errorf("file %s of an entry left out is still open", f.Name())
					}
				}
			}
		})
	}
}

// TestAnAttachmentsQueuesAreKeptInTheHolderWhateverItsContainerIDsLength:
// CNI allows container IDs of up to 254 characters, and the holder names
// of up to fdstore.MaxName bytes (and meta of fdstore.MaxMeta, which the
// key in the meta must fit too); the queues of every attachment must come
// back to a napitapd that restarts after a crash.
func TestAnAttachmentsQueuesAreKeptInTheHolderWhateverItsContainerIDsLength(t *testing.T) {
	nstest.RequireRoot(t)
	tests := []struct {
		name string
		key  handoff.Key
	}{
		{"a short container ID", handoff.Key{ContainerID: "c1", IfName: "net1"}},
		{"a container ID of 64 hex digits, as containerd and CRI-O make", handoff.Key{ContainerID: strings.Repeat("0123456789abcdef", 4), IfName: "eth0"}},
		{"a container ID of 254 characters, the most CNI allows, and an ifName of 15", handoff.Key{ContainerID: strings.Repeat("a", 254), IfName: strings.Repeat("n", 15)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "fdstore.sock")
			holder(t, path)
			var log syncbuf.Buffer
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("mirror's log:\n%s", log.String())
				}
			})
			s := &holderStore{m: fdstore.NewMirror(path, slog.New(slog.NewTextHandler(&log, nil)))}
			defer s.m.Close()
			if err := s.m.Sync(); err != nil {
				t.Fatal(err)
			}
			var queues []*os.File
			for range 2 {
				r, w, err := os.Pipe()
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				defer w.Close()
				queues = append(queues, r, w)
			}
			// Connected: the entry is in the holder when KeepQueues returns.
			s.KeepQueues(tc.key, queues)

			got, skipped := recoverFromHolder(t, path)
			if len(got) != len(queues) || len(skipped) != 0 {
				t.Fatalf("the holder gave back %d files (%d wanted), and entries %q left out", len(got), len(queues), skipped)
			}
			for i, f := range got {
				if f.Kind != takeover.KindQueue || f.Key == nil || *f.Key != tc.key {
					t.Errorf("file %d came back as %+v, want a queue of %s", i, f.Item, tc.key)
				}
				if !fdtest.SameFile(t, f.File, queues[i]) {
					t.Errorf("file %d that came back is not the queue kept", i)
				}
			}

			s.ForgetQueues(tc.key)
			if got, skipped := recoverFromHolder(t, path); len(got) != 0 || len(skipped) != 0 {
				t.Errorf("after ForgetQueues the holder still gives back %d files, and entries %q left out", len(got), skipped)
			}
		})
	}
}

// holder serves an fd holder on path until the test ends.
func holder(t *testing.T, path string) {
	t.Helper()
	l, err := fdstore.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	h := fdstore.NewHolder(slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := h.Serve(l); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() { l.Close(); <-done; h.Close() })
}

// recoverFromHolder is what a napitapd that restarts gets from the holder.
func recoverFromHolder(t *testing.T, path string) ([]takeover.File, []string) {
	t.Helper()
	entries, err := fdstore.Recover(path, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	files, skipped := filesOf(entries)
	t.Cleanup(func() { takeover.CloseAll(files) })
	return files, skipped
}
