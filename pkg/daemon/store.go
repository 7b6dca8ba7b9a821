package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/takeover"
)

// holderStore is napitapd's side of the fd holder (pkg/fdstore), a
// process in a second container of napitapd's pod: every file a takeover
// would hand over, but the lock, is kept there as it changes, each entry's
// meta being the takeover item of its first file. A napitapd killed by
// SIGKILL, the OOM killer or a liveness probe leaves them there, and the
// next one builds itself from them with the code a takeover uses
// (prepare). The lock never goes there: a copy of the locked file would
// hold the lock for ever.
type holderStore struct {
	m    *fdstore.Mirror
	book *queueBook // told each listener's origin, for the holder's let-go calls
}

// Entry names: one kind per prefix, so that nothing of one kind can take
// the name of another.
const (
	entrySocket   = "socket/"
	entryListener = "listener/"
	entryQueues   = "queues/"
)

// queuesEntry names an attachment's held queues by a hash of its key: a
// container ID may be 254 characters, and "queues/" and the key itself
// would exceed fdstore.MaxName. The key is in the meta (the item's Key).
func queuesEntry(key handoff.Key) string {
	sum := sha256.Sum256([]byte(key.String()))
	return entryQueues + hex.EncodeToString(sum[:])
}

func (s *holderStore) put(name string, item takeover.Item, files ...*os.File) {
	meta, err := json.Marshal(item)
	if err != nil {
		panic(err) // an Item always marshals
	}
	s.m.Put(fdstore.Entry{Name: name, Meta: meta, Files: files})
}

// Keep and Forget are the seccomp agent's (seccompagent.Store).
func (s *holderStore) Keep(l seccompagent.Listener) {
	files := []*os.File{l.File}
	if l.Slot != nil {
		files = append(files, l.Slot)
	}
	s.book.keepOrigin(entryListener+l.ID, l.Origin)
	s.put(entryListener+l.ID, takeover.Item{Kind: takeover.KindListener, UID: l.UID, PodRoot: l.PodRoot, Origin: l.Origin, ID: l.ID, OwnTaps: l.OwnTaps}, files...)
}

func (s *holderStore) Forget(id string) {
	s.book.forgetOrigin(entryListener + id)
	s.m.Drop(entryListener + id)
}

// KeepQueues and ForgetQueues are the hand-off server's
// (handoff.QueueStore).
func (s *holderStore) KeepQueues(key handoff.Key, files []*os.File) {
	s.put(queuesEntry(key), takeover.Item{Kind: takeover.KindQueue, Key: &key}, files...)
}

func (s *holderStore) ForgetQueues(key handoff.Key) { s.m.Drop(queuesEntry(key)) }

// keepSocket keeps a listening socket: while napitapd is down, a runtime's
// connect waits in its backlog for the next one instead of failing.
func (s *holderStore) keepSocket(name string, l *net.UnixListener) error {
	f, err := l.File() // a copy
	if err != nil {
		return fmt.Errorf("socket %s: %w", l.Addr(), err)
	}
	defer f.Close()
	s.put(entrySocket+name, takeover.Item{Kind: takeover.KindSocket, Name: name}, f)
	return nil
}

// filesOf turns the holder's entries into takeover files; the holder
// keeps its own copies. An entry whose meta is not an item napitapd
// knows, or whose files do not match its kind, is left out and closed:
// the holder's next sync drops it.
func filesOf(entries []fdstore.Entry) (files []takeover.File, skipped []string) {
	seen := map[string]bool{}
	for _, e := range entries {
		var item takeover.Item
		err := json.Unmarshal(e.Meta, &item)
		ok := err == nil && len(e.Files) > 0 && !seen[e.Name]
		// The name is the item's: two entries never make one listener
		// (and one slot) twice.
		switch {
		case !ok:
		case strings.HasPrefix(e.Name, entrySocket):
			ok = item.Kind == takeover.KindSocket && len(e.Files) == 1 && e.Name == entrySocket+item.Name
		case strings.HasPrefix(e.Name, entryListener):
			ok = item.Kind == takeover.KindListener && item.ID != "" && len(e.Files) <= 2 && e.Name == entryListener+item.ID
		case strings.HasPrefix(e.Name, entryQueues):
			ok = item.Kind == takeover.KindQueue && item.Key != nil && e.Name == queuesEntry(*item.Key)
		default:
			ok = false
		}
		seen[e.Name] = true
		if !ok {
			skipped = append(skipped, e.Name)
			for _, f := range e.Files {
				f.Close()
			}
			continue
		}
		for i, f := range e.Files {
			it := item
			if item.Kind == takeover.KindListener && i == 1 {
				it = takeover.Item{Kind: takeover.KindSlot, ID: item.ID}
			}
			files = append(files, takeover.File{Item: it, File: f})
		}
	}
	return files, skipped
}
