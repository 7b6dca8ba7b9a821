package peer

import (
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// holdsOtherEnd: p has open the socket at the other end of c.
func (p *Process) holdsOtherEnd(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var st unix.Stat_t
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("fstat of the connection: %w", serr)
	}
	other, err := peerInode(uint32(st.Ino))
	if err != nil {
		return err
	}
	return holds(p.Pid, other)
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
