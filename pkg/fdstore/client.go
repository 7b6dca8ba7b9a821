package fdstore

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/peer"
)

// Client is a connection to a holder. Its methods may be called
// concurrently; they take turns, one request in flight at a time.
type Client struct {
	path string
	conn *net.UnixConn

	mu  sync.Mutex
	buf []byte
	// err is set once the connection is out of step (a timeout, a hang-up,
	// an answer that makes no sense): every later request fails with it.
	err error
}

// refusal is the holder's error answer: the connection is still in step.
type refusal string

func (r refusal) Error() string { return "the holder refused: " + string(r) }

// Dial connects to the holder at path, which must run as root.
func Dial(path string) (*Client, error) {
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("fdstore %s: %w", path, err)
	}
	// Only root can bind in a root-owned dir, but the pod's emptyDir is
	// anyone's in the pod.
	if cred, err := peer.Cred(conn); err != nil || cred.Uid != 0 {
		conn.Close()
		return nil, fmt.Errorf("fdstore %s: the holder is not root (%+v, %v)", path, cred, err)
	}
	return &Client{path: path, conn: conn, buf: make([]byte, MaxMessage+1)}, nil
}

// Put makes the holder keep copies of e.Files as the entry e.Name,
// replacing any it had; the caller keeps (and closes) its files.
func (c *Client) Put(e Entry) error {
	err := checkEntry(e.Name, e.Meta, len(e.Files))
	if err == nil {
		err = c.do(&message{Op: opPut, Name: e.Name, Meta: e.Meta}, e.Files, nil, nil)
	}
	if err != nil {
		return fmt.Errorf("fdstore %s: put %q: %w", c.path, e.Name, err)
	}
	return nil
}

// Drop makes the holder close and forget the entries names; missing ones
// are fine.
func (c *Client) Drop(names ...string) error {
	for len(names) > 0 {
		// Names of up to MaxName bytes, escaped, in well under MaxMessage.
		n, size := 0, 0
		for n < len(names) && size < MaxMessage/2 {
			size += len(names[n])*6 + 3
			n++
		}
		if err := c.do(&message{Op: opDrop, Names: names[:n]}, nil, nil, nil); err != nil {
			return fmt.Errorf("fdstore %s: drop %d entries: %w", c.path, n, err)
		}
		names = names[n:]
	}
	return nil
}

// List returns every entry the holder has, with copies of its files if
// withFiles (close-on-exec, the caller's to close).
func (c *Client) List(withFiles bool) ([]Entry, error) {
	out, _, err := c.list(&message{Op: opList, Files: withFiles})
	return out, err
}

// ListTakingLetGo is List without files that also takes the calls the
// holder let go on since the last time (Holder.NoteLetGo), and how many
// more it dropped.
func (c *Client) ListTakingLetGo() ([]Entry, LetGoReport, error) {
	return c.list(&message{Op: opList, TakeLetGo: true})
}

// LetGoReport is what a holder let go on while no napitapd was there.
type LetGoReport struct {
	Calls   []LetGo
	Dropped int // calls beyond MaxLetGo, not named
}

func (c *Client) list(req *message) ([]Entry, LetGoReport, error) {
	var out []Entry
	var report LetGoReport
	err := c.do(req, nil, func(e Entry) { out = append(out, e) }, func(m *message) {
		report = LetGoReport{Calls: m.LetGo, Dropped: m.LetGoDropped}
	})
	if err != nil {
		for _, e := range out {
			closeFiles(e.Files)
		}
		return nil, LetGoReport{}, fmt.Errorf("fdstore %s: list: %w", c.path, err)
	}
	return out, report, nil
}

// Close hangs up. A request in flight fails.
func (c *Client) Close() error {
	c.shutdown()
	return c.conn.Close()
}

// do sends req with files and reads the answers: ok, error, or (to list)
// entries and done, each entry passed to onEntry.
func (c *Client) do(req *message, files []*os.File, onEntry func(Entry), onDone func(*message)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	err := c.exchange(req, files, onEntry, onDone)
	if err != nil && !errors.As(err, new(refusal)) && !errors.Is(err, errUnsent) {
		c.err = fmt.Errorf("connection lost: %w", err)
		c.shutdown()
	}
	return err
}

func (c *Client) exchange(req *message, files []*os.File, onEntry func(Entry), onDone func(*message)) error {
	_ = c.conn.SetDeadline(time.Now().Add(timeout))
	if err := send(c.conn, req, files); err != nil {
		return hungUp(err)
	}
	count := 0
	for {
		m, got, err := recv(c.conn, c.buf)
		if err != nil {
			return hungUp(err)
		}
		if m.Version != Version {
			closeFiles(got)
			return fmt.Errorf("an answer of version %d, not %d", m.Version, Version)
		}
		switch {
		case m.Op == opError:
			closeFiles(got)
			return refusal(m.Error)
		case m.Op == opOK && req.Op != opList && len(got) == 0:
			return nil
		case m.Op == opEntry && req.Op == opList && (len(got) > 0) == req.Files:
			onEntry(Entry{Name: m.Name, Meta: m.Meta, Files: got})
			count++
			// A long list is no wedged holder.
			_ = c.conn.SetDeadline(time.Now().Add(timeout))
		case m.Op == opDone && req.Op == opList && len(got) == 0:
			if m.Count != count {
				return fmt.Errorf("done after %d entries, the holder counts %d", count, m.Count)
			}
			if onDone != nil {
				onDone(m)
			}
			return nil
		default:
			closeFiles(got)
			return fmt.Errorf("answer %q with %d fds to %s", m.Op, len(got), req.Op)
		}
	}
}

// hungUp says so of an error that is the holder's hang-up (which, with
// data unread, is a reset).
func hungUp(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ECONNRESET) {
		return fmt.Errorf("the holder hung up: %w", err)
	}
	return err
}

// shutdown ends the connection both ways without closing the fd: it wakes
// waitHangup, which Close would otherwise wait for.
func (c *Client) shutdown() {
	if rc, err := c.conn.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _ = unix.Shutdown(int(fd), unix.SHUT_RDWR) })
	}
}

// waitHangup returns once the holder hangs up or the connection is shut
// down. It reads nothing, so requests may run meanwhile: poll(2) on the
// fd, for hang-ups only.
func (c *Client) waitHangup() {
	rc, err := c.conn.SyscallConn()
	if err != nil {
		return
	}
	for done := false; !done; {
		if rc.Control(func(fd uintptr) {
			p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
			_, err := unix.Poll(p, -1)
			done = err != unix.EINTR
		}) != nil {
			return
		}
	}
}

// Recover returns every entry, with its files, that the holder at path
// has: napitapd calls it once as it starts, before it makes anything, to
// get back what a predecessor that died left. It retries for up to wait,
// as the holder may still be starting; ErrNoHolder: no socket was there
// all that time.
//
// The files are the caller's. Napitapd puts what it adopts into its Mirror
// (which makes its own copies) and then starts the Mirror, whose first
// sync drops from the holder whatever it was not given: until then the
// holder keeps everything, so napitapd dying again meanwhile loses
// nothing.
func Recover(path string, wait time.Duration) ([]Entry, error) {
	deadline := time.Now().Add(wait)
	for {
		c, err := Dial(path)
		if err == nil {
			defer c.Close()
			return c.List(true)
		}
		if time.Now().After(deadline) {
			if errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("%w: %w", ErrNoHolder, err)
			}
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ErrNoHolder: there is no holder's socket.
var ErrNoHolder = errors.New("no fd holder")
