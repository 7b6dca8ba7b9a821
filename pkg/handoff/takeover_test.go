package handoff_test

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
)

// TestATakeoverHandsHeldQueuesToTheNextServer: the queues one server
// holds go to the next on the same state dir, which checks that they are
// the attachment's before it holds them.
func TestATakeoverHandsHeldQueuesToTheNextServer(t *testing.T) {
	nstest.RequireRoot(t)
	const tap, other = "napiho7", "napiho8"
	key := handoff.Key{ContainerID: "takeover", IfName: "net1"}
	tests := []struct {
		name string
		// files replaces what the old server hands over; nil keeps it.
		files   func(t *testing.T, pod *nstest.NetNS) []*os.File
		wantErr bool
		noState bool // the attachment's state file went before the takeover
	}{
		{"the held queues of a multiqueue tap are adopted and fetched as NAPI queues", nil, false, false},
		{"queues of another tap are refused", func(t *testing.T, pod *nstest.NetNS) []*os.File {
			return newTap(t, pod, other, 4, nil, nil)
		}, true, false},
		{"fds that are no tap queues are refused", func(t *testing.T, pod *nstest.NetNS) []*os.File {
			var files []*os.File
			for range 4 {
				f, err := os.Open(os.DevNull)
				if err != nil {
					t.Fatal(err)
				}
				files = append(files, f)
			}
			return files
		}, true, false},
		{"the queues of an attachment released before a crash are closed as such", nil, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "handoff")
			dir := t.TempDir()
			stateDir := filepath.Join(dir, "state")
			old := startDaemon(t, stateDir, filepath.Join(dir, "old.sock"), 0o660)
			register(t, old.client(), attachmentFor(pod, key, "net-a", tap, 4), newTap(t, pod, tap, 4, nil, nil))

			old.l.Close()
			<-old.done
			old.srv.Drain()
			held := old.srv.TakeHeld()
			if n := old.srv.HeldFDs(); n != 0 || len(held[key]) != 4 {
				t.Fatalf("TakeHeld gave %d fds for %s and left %d held; want 4 and 0", len(held[key]), key, n)
			}
			files := held[key]
			if tc.files != nil {
				keep(t, files)
				files = tc.files(t, pod)
			}

			if tc.noState {
				states, _ := filepath.Glob(filepath.Join(stateDir, "*.json"))
				for _, p := range states {
					os.Remove(p)
				}
			}
			next := startDaemon(t, stateDir, filepath.Join(dir, "next.sock"), 0o660)
			err := next.srv.AdoptHeld(key, files)
			if (err != nil) != tc.wantErr || errors.Is(err, handoff.ErrNoState) != tc.noState {
				t.Fatalf("AdoptHeld: %v, want an error: %v (ErrNoState: %v)", err, tc.wantErr, tc.noState)
			}
			if tc.wantErr {
				t.Logf("AdoptHeld: %v", err)
				if n := next.srv.HeldFDs(); n != 0 {
					t.Errorf("after a refused adoption the server holds %d fds", n)
				}
				return
			}
			if got := listed(t, next.client())[key]; got.Held != 4 {
				t.Errorf("List after the takeover shows %d held queues, want 4", got.Held)
			}
			old.stop() // closes nothing it handed over
			checkAttached(t, pod, tap, 4)
			fetchQueues(t, next.client(), key, tap, 4, "Fetch after the takeover")
		})
	}
}
