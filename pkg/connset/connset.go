// Package connset is a server's open peer connections, whose deadlines
// one abort signal cuts short: napitapd's three servers (hand-off, seccomp
// socket, takeover) take the same signal, so that a stopping napitapd
// waits on no peer past its bound, whatever the peer does.
package connset

import (
	"context"
	"net"
	"sync"
	"time"
)

// past is a deadline gone by: an I/O call under it fails at once,
// without trying the socket.
var past = time.Unix(1, 0)

// Set is a server's open connections. Its zero value is empty.
type Set struct {
	mu      sync.Mutex
	open    map[*Conn]struct{}
	wg      sync.WaitGroup
	drained bool
}

// Conn is a connection of a Set: the deadlines of its socket go through
// it, so that none outlives an abort.
type Conn struct {
	c     *net.UnixConn
	set   *Set
	abort context.Context
	stop  func() bool
}

// Add tracks c until Done. Once abort is done, every deadline of c is
// past, and stays so.
func (s *Set) Add(abort context.Context, c *net.UnixConn) *Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open == nil {
		s.open = map[*Conn]struct{}{}
	}
	tc := &Conn{c: c, set: s, abort: abort}
	s.open[tc] = struct{}{}
	s.wg.Add(1)
	// Under s.mu, as within: a deadline set meanwhile is never left in
	// the future.
	tc.stop = context.AfterFunc(abort, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		_ = c.SetDeadline(past)
	})
	return tc
}

// Done stops tracking c; it leaves c open.
func (c *Conn) Done() {
	c.stop()
	c.set.mu.Lock()
	delete(c.set.open, c)
	c.set.mu.Unlock()
	c.set.wg.Done()
}

// ReadWithin sets c's read deadline d from now: past once c's abort is
// done or its set drained.
func (c *Conn) ReadWithin(d time.Duration) { c.within(c.c.SetReadDeadline, d, true) }

// WriteWithin sets c's write deadline d from now: past once c's abort is
// done (a drained set still answers the request it read).
func (c *Conn) WriteWithin(d time.Duration) { c.within(c.c.SetWriteDeadline, d, false) }

// Within sets both of c's deadlines.
func (c *Conn) Within(d time.Duration) {
	c.ReadWithin(d)
	c.WriteWithin(d)
}

func (c *Conn) within(set func(time.Time) error, d time.Duration, read bool) {
	c.set.mu.Lock()
	defer c.set.mu.Unlock()
	t := time.Now().Add(d)
	if c.abort.Err() != nil || read && c.set.drained {
		t = past
	}
	_ = set(t)
}

// Drain ends every read, those waiting and any later, and returns once
// every connection is Done: each ends once it has answered the request
// it was serving. A caller whose request was not read sees a hang-up.
func (s *Set) Drain() {
	s.mu.Lock()
	s.drained = true
	for c := range s.open {
		_ = c.c.SetReadDeadline(past)
	}
	s.mu.Unlock()
	s.Wait()
}

// Wait returns once every connection is Done.
func (s *Set) Wait() { s.wg.Wait() }
