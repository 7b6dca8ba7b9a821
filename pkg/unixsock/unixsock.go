// Package unixsock is what napitapd's two sockets share: made where only
// root can put them, asked who is on the other end, and served through
// floods and fd exhaustion without flooding the log.
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/napitap/napitap/pkg/safefile"
)

// Listen makes a unix socket ("unix" or "unixpacket") at path, in a
// TrustedDir: a stale socket is removed, and mode and group are applied
// before anyone can connect (the umask keeps it root's alone until then).
func Listen(network, path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	if err := safefile.TrustedDir(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	old := syscall.Umask(0o177)
	l, err := net.ListenUnix(network, &net.UnixAddr{Name: path, Net: network})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := Apply(path, mode, gid); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Apply gives the socket at path mode and group (gid -1: root's). A
// napitapd that takes a listening socket over applies its own: the file
// stays, and a rollout that changes --socket-mode or --socket-group must
// change it.
func Apply(path string, mode os.FileMode, gid int) error {
	if gid < 0 {
		gid = 0
	}
	if err := os.Chown(path, 0, gid); err != nil {
		return fmt.Errorf("chown %s to gid %d: %w", path, gid, err)
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	return nil
}

// Every lets one event through per Interval and counts the others: for log
// lines that a flood would repeat.
type Every struct {
	Interval time.Duration

	mu   sync.Mutex
	next time.Time
	held int
}

// Allow reports whether to log now, and how many events it held back
// since the last time it did.
func (e *Every) Allow() (bool, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if now.Before(e.next) {
		e.held++
		return false, 0
	}
	n := e.held
	e.next, e.held = now.Add(e.Interval), 0
	return true, n
}

// Serve accepts on l until it is closed, and returns nil then. Each
// connection goes to serve, in the accepting goroutine: serve starts its
// own if it wants one. A failed accept (out of fds or memory: EMFILE,
// ENFILE, ENOBUFS, ENOMEM, which pass as connections close) is reported to
// failed with the wait before the next one (AcceptBackoff).
func Serve(l *net.UnixListener, failed func(err error, wait time.Duration), serve func(*net.UnixConn)) error {
	var delay time.Duration
	for {
		c, err := l.AcceptUnix()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			delay = AcceptBackoff(delay)
			failed(err, delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		serve(c)
	}
}

// AcceptBackoff is the wait after a failed accept (EMFILE and friends
// pass as connections close): doubling from 5 ms up to 1 s, as net/http
// does.
func AcceptBackoff(last time.Duration) time.Duration {
	return min(max(2*last, 5*time.Millisecond), time.Second)
}

// Bare is err without the addresses a *net.OpError adds (a socket's
// path), for a caller whose error names the socket already.
func Bare(err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return fmt.Errorf("%s: %w", op.Op, op.Err)
	}
	return err
}
