package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/pkg/unixsock"
)

// sendMsg writes v and files as one datagram.
func sendMsg(c *net.UnixConn, v any, files []*os.File) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if len(b) > MaxHeader {
		return fmt.Errorf("%w: message of %d bytes exceeds %d", errTooBig, len(b), MaxHeader)
	}
	if len(files) > MaxFDs {
		return fmt.Errorf("%w: %d fds exceed %d", errTooBig, len(files), MaxFDs)
	}
	oob, err := unixsock.Rights(files)
	if err != nil {
		return err
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// errTooBig marks a message this end refused to send.
var errTooBig = errors.New("too big")

// errTruncated marks a datagram that did not fit: its fds are closed, and
// the connection is still usable.
var errTruncated = errors.New("truncated")

// recvMsg reads one datagram. io.EOF means the peer closed. Received fds
// arrive close-on-exec; on any error they are closed, never kept. Its
// buffers are only as large as the datagram and exist only once it has
// arrived: an idle connection holds none.
func recvMsg(c *net.UnixConn) ([]byte, []*os.File, error) {
	size, err := waitMsg(c)
	if err != nil {
		return nil, nil, err
	}
	// One byte more than MaxHeader: a larger datagram shows as MSG_TRUNC.
	buf := make([]byte, min(size, MaxHeader)+1)
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	files, perr := unixsock.ParseRights(oob[:max(oobn, 0)], "handoff")
	switch {
	case err != nil:
		closeAll(files)
		return nil, nil, err
	case perr != nil:
		closeAll(files)
		return nil, nil, fmt.Errorf("ancillary data: %w", perr)
	case flags&unix.MSG_CTRUNC != 0:
		closeAll(files)
		return nil, nil, fmt.Errorf("%w: more than %d fds", errTruncated, MaxFDs)
	case flags&unix.MSG_TRUNC != 0 || n > MaxHeader:
		closeAll(files)
		return nil, nil, fmt.Errorf("%w: message larger than %d bytes", errTruncated, MaxHeader)
	case n == 0 && oobn == 0:
		return nil, nil, io.EOF // SEQPACKET: a 0-byte read is the peer's close
	case n == 0:
		closeAll(files)
		return nil, nil, fmt.Errorf("%w: fds without a message", errTruncated)
	}
	return buf[:n], files, nil
}

// waitMsg waits, honouring c's read deadline, until a datagram can be read,
// and returns its length (0 also when the peer has closed). It takes nothing
// from the socket.
func waitMsg(c *net.UnixConn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n uintptr
	var errno syscall.Errno
	err = rc.Read(func(fd uintptr) bool {
		// MSG_TRUNC makes a peek report the datagram's full length; with no
		// control buffer, fds it carries stay queued.
		for {
			n, _, errno = unix.Syscall6(unix.SYS_RECVFROM, fd, 0, 0, unix.MSG_PEEK|unix.MSG_TRUNC|unix.MSG_DONTWAIT, 0, 0)
			if errno != unix.EINTR {
				break
			}
		}
		return errno != unix.EAGAIN
	})
	if err != nil {
		return 0, err // a *net.OpError already
	}
	if errno != 0 {
		return 0, &net.OpError{Op: "read", Net: "unixpacket", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("recvfrom", errno)}
	}
	return int(n), nil
}

// peerClosed: the peer has closed its end; what it sent can still be read.
func peerClosed(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	hup := false
	_ = rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		if n, err := unix.Poll(fds, 0); err == nil && n > 0 {
			hup = fds[0].Revents&(unix.POLLHUP|unix.POLLRDHUP) != 0
		}
	})
	return hup
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// identity is the peer's netns and its credentials as the kernel's tap
// permission check sees them.
type identity struct {
	netnsID uint64
	creds   peer.Creds
}

// identify reads the peer's netns and credentials, confirmed to be the
// peer's own (pkg/peer): a peer that exited could otherwise lend its pid to
// a process in another pod's netns.
func identify(p *peer.Process) (*identity, error) {
	fd, err := p.OpenNetns()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var id identity
	if id.netnsID, err = tapsetup.NetnsIDOf(fd); err != nil {
		return nil, fmt.Errorf("netns of pid %d: %w", p.Pid, err)
	}
	if id.creds, err = p.Creds(fd); err != nil {
		return nil, err
	}
	return &id, nil
}
