// Package peerauth tells whether the process at the other end of a unix
// socket is a napitapd: root with at least napitapd's capabilities
// (Required), read from the kernel's record of that very process, not
// from anything the peer says. A uid-0 process without them, such as the
// root of a pod that mounts a napitap directory, is refused: uid 0 alone
// names every container's root.
//
// Each side is checked its own way. The side that accepted a connection
// asks the kernel for the connecting process (SO_PEERCRED and, since
// Linux 6.5, SO_PEERPIDFD). The side that connected cannot ask that way:
// the kernel's record of a listening socket is its first creator's, and
// napitapd's sockets move from one napitapd to the next. So it takes the
// pid the other side claims and checks with the kernel that this process
// holds the other end of the connection (sock_diag's UNIX_DIAG_PEER and
// /proc/PID/fd).
package peerauth

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/tunperm"
)

// Required are the capabilities that make napitapd what it is (the
// DaemonSet's, but SETUID and SETGID, without which napitapd still runs):
// a process that has them is as good as root on the node already.
const Required = 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_SYS_PTRACE

// ErrNotNapitapd is wrapped by every refusal of a peer.
var ErrNotNapitapd = errors.New("the peer is not root with napitapd's capabilities")

// Connector checks the process that connected to c, which this side
// accepted.
func Connector(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	pidfd, credErr, pidfdErr := -1, error(nil), error(nil)
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return err
	}
	if credErr != nil {
		return fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	if errors.Is(pidfdErr, unix.ENOPROTOOPT) {
		// Before Linux 6.5: the pid, which the peer may have left for
		// another process by now; the same check then judges that one.
		pidfd, pidfdErr = unix.PidfdOpen(int(cred.Pid), 0)
	}
	if cred.Pid == 0 {
		return fmt.Errorf("%w: it is outside this pid namespace", ErrNotNapitapd)
	}
	if pidfdErr != nil {
		return fmt.Errorf("pidfd of peer pid %d: %w", cred.Pid, pidfdErr)
	}
	defer unix.Close(pidfd)
	return Process(int(cred.Pid), pidfd)
}

// Acceptor checks the process pid, which the side that accepted c says it
// is: it must hold the other end of c.
func Acceptor(c *net.UnixConn, pid int) error {
	if pid <= 0 {
		return fmt.Errorf("%w: it names no pid", ErrNotNapitapd)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return fmt.Errorf("%w: pid %d: %w", ErrNotNapitapd, pid, err)
	}
	defer unix.Close(pidfd)
	var st unix.Stat_t
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) { err = unix.Fstat(int(fd), &st) }); err != nil {
		return err
	}
	if err != nil {
		return fmt.Errorf("fstat of the connection: %w", err)
	}
	other, err := peerInode(uint32(st.Ino))
	if err != nil {
		return err
	}
	if err := holds(pid, other); err != nil {
		return err
	}
	return Process(pid, pidfd)
}

// Process judges pid's credentials, then makes sure with pidfd (-1: one
// is opened) that pid was still the same process while they were read.
func Process(pid, pidfd int) error {
	if pidfd < 0 {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return fmt.Errorf("%w: pid %d: %w", ErrNotNapitapd, pid, err)
		}
		defer unix.Close(fd)
		pidfd = fd
	}
	c, err := tunperm.Read(pid)
	if err != nil {
		return fmt.Errorf("%w: credentials of pid %d: %w", ErrNotNapitapd, pid, err)
	}
	if c.EUID != 0 {
		return fmt.Errorf("%w: pid %d runs as uid %d, not root", ErrNotNapitapd, pid, c.EUID)
	}
	if missing := Required &^ c.CapEff; missing != 0 {
		return fmt.Errorf("%w: pid %d lacks capabilities 0x%x of napitapd's 0x%x (it has 0x%x)", ErrNotNapitapd, pid, missing, uint64(Required), c.CapEff)
	}
	// A pidfd polls readable once its process has exited.
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	if n, err := unix.Poll(fds, 0); err != nil || n > 0 {
		return fmt.Errorf("%w: pid %d exited while being checked (%v)", ErrNotNapitapd, pid, err)
	}
	return nil
}

// peerInode is the inode of the socket connected to the socket ino, as
// sock_diag reports it (UNIX_DIAG_PEER; asked of ino alone: a dump of the
// node's every unix socket would cost more, and netlink's dump parser
// stops at the first socket it cannot read).
func peerInode(ino uint32) (uint32, error) {
	req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, 0)
	req.AddData(&unixDiagReq{ino: ino})
	msgs, err := req.Execute(unix.NETLINK_SOCK_DIAG, nl.SOCK_DIAG_BY_FAMILY)
	if err != nil {
		return 0, fmt.Errorf("sock_diag of socket %d: %w", ino, err)
	}
	for _, m := range msgs {
		if len(m) < sizeofUnixDiagMsg {
			continue
		}
		attrs, err := nl.ParseRouteAttr(m[sizeofUnixDiagMsg:])
		if err != nil {
			return 0, fmt.Errorf("sock_diag of socket %d: %w", ino, err)
		}
		for _, a := range attrs {
			if a.Attr.Type == unixDiagPeer && len(a.Value) >= 4 {
				return nl.NativeEndian().Uint32(a.Value), nil
			}
		}
	}
	return 0, fmt.Errorf("%w: sock_diag knows no peer of socket %d", ErrNotNapitapd, ino)
}

// struct unix_diag_req and unix_diag_msg (include/uapi/linux/unix_diag.h).
const (
	udiagShowPeer     = 0x04
	unixDiagPeer      = 2
	sizeofUnixDiagMsg = 16
)

type unixDiagReq struct{ ino uint32 }

func (r *unixDiagReq) Len() int { return 24 }

func (r *unixDiagReq) Serialize() []byte {
	b := make([]byte, 24)
	b[0] = unix.AF_UNIX
	ne := nl.NativeEndian()
	ne.PutUint32(b[4:], ^uint32(0)) // every state
	ne.PutUint32(b[8:], r.ino)
	ne.PutUint32(b[12:], udiagShowPeer)
	ne.PutUint32(b[16:], ^uint32(0)) // no cookie to match
	ne.PutUint32(b[20:], ^uint32(0))
	return b
}

// holds: pid has the socket ino open.
func holds(pid int, ino uint32) error {
	dir := "/proc/" + strconv.Itoa(pid) + "/fd"
	names, err := readDirNames(dir)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrNotNapitapd, err)
	}
	want := "socket:[" + strconv.FormatUint(uint64(ino), 10) + "]"
	for _, name := range names {
		if target, err := os.Readlink(dir + "/" + name); err == nil && target == want {
			return nil
		}
	}
	return fmt.Errorf("%w: pid %d does not hold the other end of the connection (%s)", ErrNotNapitapd, pid, want)
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return names, nil
}
