package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/unixsock"
)

// Client talks to napitapd. One connection per call keeps it stateless, as
// fits a CNI binary that lives for one verb.
type Client struct {
	Socket  string        // DefaultSocket when empty
	Timeout time.Duration // 5 s when zero
}

// Register gives napitapd the open queues of att; napitapd keeps its own
// copies, the caller may close its files afterwards.
func (c *Client) Register(att *Attachment, queues []*os.File) error {
	_, files, err := c.do(&Request{Op: OpRegister, Attachment: att}, queues)
	closeAll(files)
	return err
}

// Fetch takes the queue fds of the attachment key, or, with key nil, of the
// one attachment in the caller's own network namespace. napitapd keeps no
// copy: the caller's fds are then the only ones attached (DESIGN.md fact 7).
func (c *Client) Fetch(key *Key) (*Attachment, []*os.File, error) {
	resp, files, err := c.do(&Request{Op: OpFetch, Key: key}, nil)
	if err != nil {
		return nil, nil, err
	}
	if resp.Attachment == nil || len(files) != resp.Attachment.Queues {
		closeAll(files)
		return nil, nil, &Error{Code: codeProtocol, Message: fmt.Sprintf("fetch answered %d fds for %+v", len(files), resp.Attachment)}
	}
	return resp.Attachment, files, nil
}

// Release makes napitapd close and forget the attachment key. Releasing an
// unknown key is not an error.
func (c *Client) Release(key Key) error {
	_, files, err := c.do(&Request{Op: OpRelease, Key: &key}, nil)
	closeAll(files)
	return err
}

// GC releases every attachment of network that is not in valid, and
// returns how many went.
func (c *Client) GC(network string, valid []Key) (int, error) {
	resp, files, err := c.do(&Request{Op: OpGC, Network: network, Valid: valid}, nil)
	closeAll(files)
	if err != nil {
		return 0, err
	}
	return resp.Released, nil
}

// Status says which napitapd answers.
func (c *Client) Status() (*Status, error) {
	resp, files, err := c.do(&Request{Op: OpStatus}, nil)
	closeAll(files)
	if err != nil {
		return nil, err
	}
	if resp.Status == nil {
		return nil, &Error{Code: codeProtocol, Message: "status answered without a status"}
	}
	return resp.Status, nil
}

// List returns the attachments the caller may see, page by page.
func (c *Client) List() ([]Attachment, error) {
	var all []Attachment
	for {
		resp, files, err := c.do(&Request{Op: OpList, Offset: len(all)}, nil)
		closeAll(files)
		if err != nil {
			return nil, err
		}
		all = append(all, resp.Attachments...)
		if !resp.More || len(resp.Attachments) == 0 {
			return all, nil
		}
	}
}

// do sends req and waits for the answer. napitapd hangs up without one
// on a connection beyond its limits, before it reads the request, so a
// burst of pods gets some; ask again, with a growing pause, until the
// deadline. Every request is safe to repeat after a hang-up: napitapd
// keeps a fetch's fds when their answer is not sent, and a register that
// did happen answers "exists", which ADD handles.
func (c *Client) do(req *Request, files []*os.File) (*Response, []*os.File, error) {
	socket := c.Socket
	if socket == "" {
		socket = DefaultSocket
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for pause := 10 * time.Millisecond; ; pause = min(2*pause, 500*time.Millisecond) {
		resp, got, err := c.once(socket, deadline, req, files)
		if hungUp(err) == "" || time.Now().Add(pause).After(deadline) {
			return resp, got, err
		}
		time.Sleep(pause)
	}
}

func (c *Client) once(socket string, deadline time.Time, req *Request, files []*os.File) (*Response, []*os.File, error) {
	// Every error names the socket, once: callers add only what they
	// know more.
	conn, err := dial(socket, deadline)
	if err != nil {
		return nil, nil, fmt.Errorf("%w at %s: %w", ErrUnreachable, socket, unixsock.Bare(err))
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)

	req.Version = Version
	if err := sendMsg(conn, req, files); err != nil {
		return nil, nil, fmt.Errorf("napitapd at %s: send %s: %w%s", socket, req.Op, unixsock.Bare(err), hungUp(err))
	}
	b, got, err := recvMsg(conn)
	if err != nil {
		return nil, nil, fmt.Errorf("napitapd at %s: %s: %w%s", socket, req.Op, unixsock.Bare(err), hungUp(err))
	}
	var resp Response
	if err := json.Unmarshal(b, &resp); err != nil || resp.Version != Version {
		closeAll(got)
		err = &Error{Code: codeProtocol, Message: fmt.Sprintf("bad response to %s (version %d): %v", req.Op, resp.Version, err)}
		return nil, nil, fmt.Errorf("napitapd at %s: %w", socket, err)
	}
	if resp.Error != nil {
		closeAll(got)
		return nil, nil, fmt.Errorf("napitapd at %s: %w", socket, resp.Error)
	}
	return &resp, got, nil
}

// hungUp explains an error that means napitapd closed the connection.
func hungUp(err error) string {
	if errors.Is(err, io.EOF) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
		return " (napitapd hung up without an answer: it does so beyond its connection limits, or it stopped)"
	}
	return ""
}

// dial connects to socket with a blocking connect, bounded by deadline.
// While napitapd's backlog is full (a flood of connections, or napitapd out
// of fds) the kernel lets blocked connects in as napitapd accepts, in
// order; Go's non-blocking connect would fail with EAGAIN instead, and its
// retries lose the race to the flood.
func dial(socket string, deadline time.Time) (*net.UnixConn, error) {
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "unixpacket", Addr: &net.UnixAddr{Name: socket, Net: "unixpacket"}, Err: err}
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, opErr(os.NewSyscallError("socket", err))
	}
	for {
		tv := unix.NsecToTimeval(max(time.Until(deadline), time.Millisecond).Nanoseconds())
		if err = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			err = os.NewSyscallError("setsockopt", err)
			break
		}
		// A signal interrupts a wait for room in the backlog; connect
		// starts over.
		if err = unix.Connect(fd, &unix.SockaddrUnix{Name: socket}); err != unix.EINTR || time.Now().After(deadline) {
			err = os.NewSyscallError("connect", err)
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, opErr(err)
	}
	f := os.NewFile(uintptr(fd), socket)
	c, err := net.FileConn(f) // a non-blocking copy for the poller
	f.Close()
	if err != nil {
		return nil, opErr(err)
	}
	return c.(*net.UnixConn), nil
}
