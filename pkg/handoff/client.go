package handoff

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"time"
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

func (c *Client) do(req *Request, files []*os.File) (*Response, []*os.File, error) {
	socket := c.Socket
	if socket == "" {
		socket = DefaultSocket
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 5 * time.Second
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socket, Net: "unixpacket"})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", ErrUnreachable, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))

	req.Version = Version
	if err := sendMsg(conn, req, files); err != nil {
		return nil, nil, fmt.Errorf("napitapd at %s: send %s: %w", socket, req.Op, err)
	}
	b, got, err := recvMsg(conn)
	if err != nil {
		return nil, nil, fmt.Errorf("napitapd at %s: %s: %w", socket, req.Op, err)
	}
	var resp Response
	if err := json.Unmarshal(b, &resp); err != nil || resp.Version != Version {
		closeAll(got)
		return nil, nil, &Error{Code: codeProtocol, Message: fmt.Sprintf("bad response to %s (version %d): %v", req.Op, resp.Version, err)}
	}
	if resp.Error != nil {
		closeAll(got)
		return nil, nil, resp.Error
	}
	return &resp, got, nil
}
