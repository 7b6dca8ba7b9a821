package daemon

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/takeover"
)

// TestTheHoldersEntriesAreTakenOnlyWhenTheyAreWhatTheirNamesSay: the next
// napitapd builds itself from the holder's entries; one whose meta is not
// its name's item, or whose files do not fit its kind, is left out.
func TestTheHoldersEntriesAreTakenOnlyWhenTheyAreWhatTheirNamesSay(t *testing.T) {
	key := handoff.Key{ContainerID: "c1", IfName: "net1"}
	meta := func(item takeover.Item) json.RawMessage {
		b, err := json.Marshal(item)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	listener := takeover.Item{Kind: takeover.KindListener, UID: 107, Origin: "pod x", ID: "0123456789abcdef"}
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
		{"an attachment's queues are queues", fdstore.Entry{Name: "queues/" + key.String(), Meta: meta(takeover.Item{Kind: takeover.KindQueue, Key: &key})}, 4,
			[]string{takeover.KindQueue, takeover.KindQueue, takeover.KindQueue, takeover.KindQueue}},
		{"queues under another attachment's name are left out", fdstore.Entry{Name: "queues/c2/net1", Meta: meta(takeover.Item{Kind: takeover.KindQueue, Key: &key})}, 2, nil},
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
