package fdstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/unixsock"
)

// Listen makes the holder's socket at path, root's alone: a stale socket
// is removed, and the umask keeps it so from bind on. Its directory is made
// if missing, but not checked as unixsock.Listen does: the holder's is a
// kubelet emptyDir, mode 0777, seen only by the pod's containers.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("fdstore %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("fdstore %s: remove stale socket: %w", path, err)
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("fdstore %s: %w", path, err)
	}
	return l, nil
}

// Holder keeps entries of fds for its clients. Make it with NewHolder.
type Holder struct {
	// MaxFiles bounds the fds held in all entries; DefaultMaxFiles if 0.
	MaxFiles int

	log     *slog.Logger
	mu      sync.Mutex
	entries map[string]*held
	files   int // in all entries
	conns   map[*net.UnixConn]struct{}
	closed  bool
	// serving counts the clients that passed the checks; alone is when
	// the last of them left (or the holder started).
	serving int
	alone   time.Time
	// letGo are the calls plainqueue let go on since napitapd last took
	// them; letGoDropped those that did not fit (MaxLetGo). Under a lock
	// of their own: they are noted from within WhileAlone.
	letGoMu      sync.Mutex
	letGo        []LetGo
	letGoDropped int
}

type held struct {
	meta  json.RawMessage
	files []*os.File
}

// NewHolder makes an empty holder that logs to log.
func NewHolder(log *slog.Logger) *Holder {
	return &Holder{MaxFiles: DefaultMaxFiles, log: log, entries: map[string]*held{}, conns: map[*net.UnixConn]struct{}{}, alone: time.Now()}
}

// Serve answers the clients that connect on l, each in its own goroutine,
// until l is closed.
func (h *Holder) Serve(l *net.UnixListener) error {
	return unixsock.Serve(l, func(err error, wait time.Duration) {
		h.log.Error("fdstore: accept failed, retrying", "err", err, "wait", wait)
	}, func(c *net.UnixConn) {
		h.mu.Lock()
		closed := h.closed
		if !closed {
			h.conns[c] = struct{}{}
		}
		h.mu.Unlock()
		if closed {
			c.Close()
			return
		}
		go h.serveConn(c)
	})
}

// WhileAlone calls fn on every entry's files if no client has been served
// for at least d, and reports whether it did. No client is served until fn
// returns, so fn may act on the files as their only user. fn must not
// keep the files, nor block.
func (h *Holder) WhileAlone(d time.Duration, fn func(name string, files []*os.File)) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || h.serving > 0 || time.Since(h.alone) < d {
		return false
	}
	for _, name := range slices.Sorted(maps.Keys(h.entries)) {
		fn(name, h.entries[name].files)
	}
	return true
}

// NoteLetGo remembers that the TUNSETIFF of thread tid, waiting on the
// listener of entry, went on in the kernel without NAPI, for the next
// napitapd to count: the holder's own log line is all an operator would
// otherwise see. Only the last MaxLetGo are kept; older ones are counted.
// It may be called from WhileAlone's fn.
func (h *Holder) NoteLetGo(entry string, tid uint32) {
	h.letGoMu.Lock()
	defer h.letGoMu.Unlock()
	if len(h.letGo) == MaxLetGo {
		h.letGo = slices.Delete(h.letGo, 0, 1)
		h.letGoDropped++
	}
	h.letGo = append(h.letGo, LetGo{Entry: entry, Tid: tid, At: time.Now()})
}

// Close closes every connection and every fd held. The holder keeps
// nothing after.
func (h *Holder) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for c := range h.conns {
		c.Close()
	}
	for _, e := range h.entries {
		closeFiles(e.files)
	}
	h.entries, h.files = map[string]*held{}, 0
}

func (h *Holder) serveConn(c *net.UnixConn) {
	defer func() {
		h.mu.Lock()
		delete(h.conns, c)
		h.mu.Unlock()
		c.Close()
	}()
	log := h.log
	defer unixsock.LogPanic(log, "fdstore: panic serving a connection")
	p, err := peer.Connected(c)
	if err != nil {
		log.Warn("fdstore: hung up on a peer without credentials", "err", err)
		return
	}
	defer p.Close()
	log = log.With("peer_pid", p.Pid)
	if p.UID != 0 {
		log.Warn("fdstore: hung up on a peer that is not root", "peer_uid", p.UID)
		return
	}
	// The socket is in an emptyDir of this pod's, but a uid-0 process that
	// reached it some other way (a dirfd taken through /proc while this
	// process was still dumpable) is still no napitapd.
	if err := p.Napitapd(); err != nil {
		log.Warn("fdstore: hung up on a peer that is not a napitapd", "err", err)
		return
	}
	log.Info("fdstore: serving a client")
	h.mu.Lock()
	h.serving++
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		entries, files := len(h.entries), h.files
		if h.serving--; h.serving == 0 {
			h.alone = time.Now()
		}
		h.mu.Unlock()
		log.Info("fdstore: the client is gone; holding on", "entries", entries, "files", files)
	}()
	buf := make([]byte, MaxMessage+1)
	for {
		// No read deadline: napitapd keeps its connection for its life.
		m, files, err := recv(c, buf)
		if errors.Is(err, errMalformed) {
			log.Warn("fdstore: hung up on a malformed request", "err", err)
			_ = h.answer(c, &message{Op: opError, Error: err.Error()}, nil)
			return
		}
		if err != nil {
			return // the client hung up, or Close
		}
		if err := h.handle(c, m, files); err != nil {
			log.Warn("fdstore: hung up", "op", m.Op, "err", err)
			return
		}
	}
}

// handle answers one request; an error ends the connection.
func (h *Holder) handle(c *net.UnixConn, m *message, files []*os.File) error {
	defer func() { closeFiles(files) }()
	refuse := func(format string, args ...any) error {
		return h.answer(c, &message{Op: opError, Error: fmt.Sprintf(format, args...)}, nil)
	}
	switch {
	case m.Version != Version:
		return refuse("version %d: this holder speaks version %d", m.Version, Version)
	case m.Op == opPut:
		if err := h.put(m.Name, m.Meta, files); err != nil {
			h.log.Warn("fdstore: refused a put", "name", m.Name, "err", err)
			return refuse("put %q: %v", m.Name, err)
		}
		h.log.Debug("fdstore: put", "name", m.Name, "files", len(files))
		files = nil // held now
		return h.answer(c, &message{Op: opOK}, nil)
	case len(files) > 0:
		return refuse("%s: carries %d fds; only put does", m.Op, len(files))
	case m.Op == opDrop:
		h.drop(m.Names)
		return h.answer(c, &message{Op: opOK}, nil)
	case m.Op == opList:
		return h.list(c, m.Files, m.TakeLetGo)
	default:
		_ = refuse("unknown op %q", m.Op)
		return fmt.Errorf("%w: unknown op %q", errMalformed, m.Op)
	}
}

func (h *Holder) put(name string, meta json.RawMessage, files []*os.File) error {
	if err := checkEntry(name, meta, len(files)); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return errors.New("the holder is closing")
	}
	n := h.files + len(files)
	old := h.entries[name]
	if old != nil {
		n -= len(old.files)
	}
	if limit := h.maxFiles(); n > limit {
		return fmt.Errorf("%d fds in all would exceed the holder's limit of %d", n, limit)
	}
	h.entries[name], h.files = &held{meta: meta, files: files}, n
	if old != nil {
		closeFiles(old.files)
	}
	return nil
}

func (h *Holder) drop(names []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, name := range names {
		if e := h.entries[name]; e != nil {
			closeFiles(e.files)
			h.files -= len(e.files)
			delete(h.entries, name)
		}
	}
}

// list sends an entry message per entry, then done. With files, each goes
// with copies of its fds made under the lock: a put or drop that closes
// the held ones meanwhile cannot make it send an fd number reused since.
func (h *Holder) list(c *net.UnixConn, withFiles, takeLetGo bool) error {
	h.mu.Lock()
	names := slices.Sorted(maps.Keys(h.entries))
	h.mu.Unlock()
	count := 0
	for _, name := range names {
		h.mu.Lock()
		e := h.entries[name]
		var files []*os.File
		var err error
		if e != nil && withFiles {
			files, err = dupFiles(e.files)
		}
		h.mu.Unlock()
		if e == nil {
			continue // dropped meanwhile
		}
		if err != nil {
			h.log.Error("fdstore: list", "name", name, "err", err)
			return h.answer(c, &message{Op: opError, Error: fmt.Sprintf("list: %q: %v", name, err)}, nil)
		}
		err = h.answer(c, &message{Op: opEntry, Name: name, Meta: e.meta}, files)
		closeFiles(files)
		if err != nil {
			return err
		}
		count++
	}
	done := &message{Op: opDone, Count: count}
	if takeLetGo {
		// Taken once sent into the socket: a napitapd that dies before
		// reading them loses a count, which is all they are.
		h.letGoMu.Lock()
		done.LetGo, done.LetGoDropped = h.letGo, h.letGoDropped
		h.letGo, h.letGoDropped = nil, 0
		h.letGoMu.Unlock()
	}
	return h.answer(c, done, nil)
}

func (h *Holder) answer(c *net.UnixConn, m *message, files []*os.File) error {
	// A client that stops reading holds up only its own connection.
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	return send(c, m, files)
}

func (h *Holder) maxFiles() int {
	if h.MaxFiles <= 0 {
		return DefaultMaxFiles
	}
	return h.MaxFiles
}
