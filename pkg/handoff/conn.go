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

	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/pkg/tunperm"
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

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// peer is who is on the other end of a connection, as the kernel recorded
// it at connect time: the caller cannot forge it.
type peer struct {
	*unix.Ucred
	pidfd int // -1 where the kernel has no SO_PEERPIDFD (before 6.5)
	// pidfdErr: SO_PEERPIDFD failed on a kernel that has it (EMFILE...).
	// The pid cannot be confirmed then, so identify fails closed.
	pidfdErr error
}

func peerCred(c *net.UnixConn) (*peer, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	p := &peer{pidfd: -1}
	var credErr, pidfdErr error
	if err := rc.Control(func(fd uintptr) {
		p.Ucred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		p.pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, err
	}
	if pidfdErr != nil {
		p.pidfd = -1
		// Only a kernel without it may go on without it; any other failure
		// (EMFILE included) leaves the pid unconfirmed. Root naming an
		// attachment needs no pid, so only identify refuses.
		if !errors.Is(pidfdErr, unix.ENOPROTOOPT) {
			p.pidfdErr = fmt.Errorf("SO_PEERPIDFD: %w", pidfdErr)
		}
	}
	if credErr != nil {
		p.close()
		return nil, credErr
	}
	return p, nil
}

// errPeerGone: the peer exited, and its pid may already be another
// process's.
var errPeerGone = errors.New("the peer has exited")

// identity is the peer's netns and its credentials as the kernel's tap
// permission check sees them.
type identity struct {
	netnsID uint64
	creds   tunperm.Creds
}

// identify reads the peer's netns and credentials through its pid, then
// makes sure, with the pidfd, that the pid still is the peer's: a peer that
// exited could otherwise lend its pid to a process in another pod's netns.
// The pidfd is polled, not signalled: a signal needs kill permission over
// the peer, which napitapd's capabilities (NET_ADMIN, SETGID, SETUID,
// SYS_ADMIN, SYS_PTRACE) do not give over a non-root VMM.
func (p *peer) identify() (*identity, error) {
	if p.pidfdErr != nil {
		return nil, fmt.Errorf("pid %d cannot be confirmed: %w", p.Pid, p.pidfdErr)
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", p.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return nil, errPeerGone
	}
	if err != nil {
		return nil, fmt.Errorf("netns of pid %d: %w", p.Pid, err)
	}
	defer unix.Close(fd)
	var id identity
	if id.netnsID, err = tapsetup.NetnsIDOf(fd); err != nil {
		return nil, fmt.Errorf("netns of pid %d: %w", p.Pid, err)
	}
	if id.creds, err = tunperm.Of(int(p.Pid), fd); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, errPeerGone
		}
		return nil, fmt.Errorf("credentials of pid %d: %w", p.Pid, err)
	}
	if p.pidfd >= 0 {
		// A pidfd polls readable once its process has exited.
		fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if err != nil {
			return nil, fmt.Errorf("poll pidfd of pid %d: %w", p.Pid, err)
		}
		if n > 0 {
			return nil, errPeerGone
		}
	}
	return &id, nil
}

func (p *peer) close() {
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}
