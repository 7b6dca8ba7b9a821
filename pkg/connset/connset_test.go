package connset

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair is a connected pair of stream sockets: ours, and the peer's.
func pair(t *testing.T) (ours, theirs *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// read waits for a byte on c, and tells how long it waited and why it
// stopped.
func read(c *net.UnixConn) (time.Duration, error) {
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	return time.Since(start), err
}

func TestAConnectionsDeadlinesEndAtItsAbort(t *testing.T) {
	tests := []struct {
		name string
		// before, after: what happens before and after the read begins.
		before, after func(c *Conn, cancel context.CancelFunc, s *Set)
	}{
		{"a read waiting under a distant deadline ends at the abort",
			func(c *Conn, _ context.CancelFunc, _ *Set) { c.ReadWithin(time.Hour) },
			func(_ *Conn, cancel context.CancelFunc, _ *Set) { cancel() }},
		{"a deadline set after the abort is already past",
			func(c *Conn, cancel context.CancelFunc, _ *Set) { cancel(); c.Within(time.Hour) },
			func(*Conn, context.CancelFunc, *Set) {}},
		{"a read waiting under a distant deadline ends when its set drains",
			func(c *Conn, _ context.CancelFunc, _ *Set) { c.ReadWithin(time.Hour) },
			func(_ *Conn, _ context.CancelFunc, s *Set) { go s.Drain() }},
		{"a read deadline set after the set drained is already past",
			func(c *Conn, _ context.CancelFunc, s *Set) {
				go s.Drain()
				for !s.isDrained() {
					time.Sleep(time.Millisecond)
				}
				c.ReadWithin(time.Hour)
			},
			func(*Conn, context.CancelFunc, *Set) {}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			abort, cancel := context.WithCancel(context.Background())
			defer cancel()
			var s Set
			ours, _ := pair(t)
			c := s.Add(abort, ours)
			defer c.Done()
			tc.before(c, cancel, &s)
			time.AfterFunc(50*time.Millisecond, func() { tc.after(c, cancel, &s) })
			took, err := read(ours)
			if !errors.Is(err, os.ErrDeadlineExceeded) || took > 5*time.Second {
				t.Errorf("the read: %v after %v; want a deadline exceeded at once", err, took)
			}
		})
	}
}

func (s *Set) isDrained() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.drained
}

func TestADrainedSetStillAnswersTheRequestItRead(t *testing.T) {
	var s Set
	ours, theirs := pair(t)
	c := s.Add(context.Background(), ours)
	drained := make(chan struct{})
	go func() { s.Drain(); close(drained) }()
	for !s.isDrained() {
		time.Sleep(time.Millisecond)
	}
	c.WriteWithin(time.Second)
	if _, err := ours.Write([]byte("answer")); err != nil {
		t.Errorf("the answer after Drain: %v; want it sent", err)
	}
	select {
	case <-drained:
		t.Fatal("Drain returned before the connection was done")
	case <-time.After(50 * time.Millisecond):
	}
	c.Done()
	<-drained
	if b := make([]byte, 6); func() error { _, err := theirs.Read(b); return err }() != nil || string(b) != "answer" {
		t.Errorf("the peer read %q; want the answer", b)
	}
}

func TestAnAbortAfterDoneLeavesTheConnectionAlone(t *testing.T) {
	abort, cancel := context.WithCancel(context.Background())
	var s Set
	ours, theirs := pair(t)
	s.Add(abort, ours).Done()
	cancel()
	if _, err := theirs.Write([]byte{1}); err != nil {
		t.Fatal(err)
	}
	_ = ours.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := read(ours); err != nil {
		t.Errorf("a read after Done and the abort: %v; want the byte", err)
	}
}
