package fdstore

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// Mirror keeps the holder's entries equal to the ones napitapd gives it,
// across restarts of the holder (its container can be OOM-killed and
// restarted while napitapd runs): it keeps its own copies of every entry's
// files, and puts them all again into a holder it reconnects to.
//
// Napitapd makes one, Puts what it adopted from Recover, Syncs it before
// it serves anyone, then Starts it. Put and Drop never fail: a holder that
// is not there is logged, and gets everything on the next sync, which is
// the next connection; one that refuses an entry (its MaxFiles) is logged,
// and asked again on the next connection.
type Mirror struct {
	// OnLetGo, if set before Start, is given what the holder let go on
	// while no napitapd was connected, at each connection's sync.
	OnLetGo func(LetGoReport)

	path string
	log  *slog.Logger

	// mu is held across each exchange with the holder, so that they reach
	// it in the order they were made.
	mu      sync.Mutex
	entries map[string]Entry // copies, this Mirror's own
	c       *Client          // nil while not connected and synced
	closed  bool

	start, stop sync.Once
	stopped     chan struct{}
	done        chan struct{}
}

// retry paces dialling a holder that is not there.
const retry = time.Second

// NewMirror makes a Mirror of the holder at path; it does nothing until
// Start.
func NewMirror(path string, log *slog.Logger) *Mirror {
	return &Mirror{path: path, log: log, entries: map[string]Entry{}, stopped: make(chan struct{}), done: make(chan struct{})}
}

// Put makes the entry e.Name hold copies of e.Files (which stay the
// caller's) and e.Meta. While connected, it has reached the holder when Put
// returns, so that napitapd dying right after loses nothing.
func (m *Mirror) Put(e Entry) {
	if err := checkEntry(e.Name, e.Meta, len(e.Files)); err != nil {
		m.log.Error("fdstore: refused to mirror an entry", "name", e.Name, "err", err)
		return
	}
	files, err := dupFiles(e.Files)
	if err != nil {
		m.log.Error("fdstore: could not copy an entry's files: the holder will not have them", "name", e.Name, "err", err)
		return
	}
	e = Entry{Name: e.Name, Meta: slices.Clone(e.Meta), Files: files}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		closeFiles(files)
		return
	}
	if old, ok := m.entries[e.Name]; ok {
		closeFiles(old.Files)
	}
	m.entries[e.Name] = e
	if m.c != nil {
		m.check(m.c.Put(e))
	}
}

// Drop closes the copies of the entry name, and drops it from the holder
// (even one this Mirror does not have: one Recover returned that napitapd
// did not adopt).
func (m *Mirror) Drop(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.entries[name]; ok {
		closeFiles(e.Files)
		delete(m.entries, name)
	}
	if m.c != nil {
		m.check(m.c.Drop(name))
	}
}

// Clear drops every entry, this Mirror's and the holder's: after a
// takeover the next napitapd keeps everything in its own pod's holder, and
// copies left in this one would keep queues attached that nobody reads.
func (m *Mirror) Clear() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, e := range m.entries {
		closeFiles(e.Files)
		delete(m.entries, name)
	}
	if m.c == nil {
		// Close follows: no later sync would empty the holder.
		c, err := Dial(m.path)
		if err != nil {
			m.log.Warn("fdstore: could not empty the holder: its copies stay until its pod goes", "err", err)
			return
		}
		m.c = c
		defer func() {
			if m.c != nil {
				m.c.Close()
				m.c = nil
			}
		}()
	}
	held, err := m.c.List(false)
	if err == nil {
		names := make([]string, 0, len(held))
		for _, e := range held {
			names = append(names, e.Name)
		}
		err = m.c.Drop(names...)
	}
	m.check(err)
}

// check logs err; one that is not the holder's refusal leaves the
// connection out of step, and Start's loop reconnects.
func (m *Mirror) check(err error) {
	switch {
	case err == nil:
	case errors.As(err, new(refusal)):
		m.log.Error("fdstore: the holder refused: a napitapd that restarts will not get this entry back", "err", err)
	default:
		m.log.Warn("fdstore: lost the holder; reconnecting", "err", err)
		m.c.Close()
		m.c = nil
	}
}

// Sync connects to the holder and syncs it now, unless connected
// already: napitapd calls it before it serves anyone, so that what it
// answers is in the holder (a fetch's queue gone from it, a register's
// there) should it be killed right after.
func (m *Mirror) Sync() error {
	m.mu.Lock()
	connected := m.c != nil
	m.mu.Unlock()
	if connected {
		return nil
	}
	c, err := Dial(m.path)
	if err != nil {
		return err
	}
	if !m.sync(c) {
		c.Close()
		return fmt.Errorf("fdstore %s: sync failed", m.path)
	}
	return nil
}

// Start connects to the holder, and again whenever it is lost, in the
// background: at once, then every second until it answers. On each
// connection it syncs: drops the holder's entries this Mirror does not
// have and puts all those it has (a holder that restarted has none).
func (m *Mirror) Start() {
	m.start.Do(func() { go m.run() })
}

// Close stops Start's loop, closes the copies and hangs up. It leaves the
// holder's entries alone: napitapd's exit or death must not empty it.
func (m *Mirror) Close() {
	started := true
	m.start.Do(func() { started = false })
	m.stop.Do(func() { close(m.stopped) })
	m.mu.Lock()
	m.closed = true
	if m.c != nil {
		m.c.Close()
		m.c = nil
	}
	for _, e := range m.entries {
		closeFiles(e.Files)
	}
	m.entries = nil
	m.mu.Unlock()
	if started {
		<-m.done
	}
}

func (m *Mirror) run() {
	defer close(m.done)
	var said string // the last dial error logged
	// At once, and at once again after a hang-up (a holder restarting is
	// empty until synced); a second between failed attempts.
	for wait := time.Duration(0); ; {
		select {
		case <-m.stopped:
			return
		case <-time.After(wait):
		}
		m.mu.Lock()
		c := m.c // Sync's
		m.mu.Unlock()
		if c == nil {
			var err error
			if c, err = Dial(m.path); err != nil {
				if err.Error() != said {
					said = err.Error()
					m.log.Warn("fdstore: no holder; retrying every second", "err", err)
				}
				wait = retry
				continue
			}
			said = ""
			if !m.sync(c) {
				c.Close()
				wait = retry
				continue
			}
		}
		wait = 0
		c.waitHangup()
		m.mu.Lock()
		if m.c == c {
			m.c = nil
			m.log.Warn("fdstore: the holder hung up; reconnecting")
		}
		m.mu.Unlock()
		c.Close()
	}
}

// sync makes the holder's entries this Mirror's, and c the connection.
func (m *Mirror) sync(c *Client) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	held, letGo, err := c.ListTakingLetGo()
	if err != nil {
		m.log.Warn("fdstore: sync", "err", err)
		return false
	}
	if m.OnLetGo != nil && (len(letGo.Calls) > 0 || letGo.Dropped > 0) {
		// Off the lock: napitapd counts and logs them.
		defer m.OnLetGo(letGo)
	}
	var stale []string
	for _, e := range held {
		if _, ok := m.entries[e.Name]; !ok {
			stale = append(stale, e.Name)
		}
	}
	if err := c.Drop(stale...); err != nil {
		m.log.Warn("fdstore: sync", "err", err)
		return false
	}
	m.c = c
	for _, name := range slices.Sorted(maps.Keys(m.entries)) {
		if m.check(c.Put(m.entries[name])); m.c == nil {
			return false
		}
	}
	m.log.Info("fdstore: synced with the holder", "entries", len(m.entries), "dropped", len(stale))
	return true
}
