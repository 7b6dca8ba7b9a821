// Package peer is napitapd's one judge of who a process is and what it may
// do: the peer of the hand-off socket, of the takeover, of the fd holder and
// of the seccomp socket, and the thread a seccomp notification names.
//
// What it knows comes from the kernel, never from the peer's word. The side
// that accepted a connection asks the kernel for the connecting process
// (SO_PEERCRED and, since Linux 6.5, SO_PEERPIDFD). The side that connected
// cannot ask that way: the kernel's record of a listening socket is its
// first creator's, and napitapd's sockets move from one napitapd to the
// next. It takes the pid the other side claims, and checks with the kernel
// that this process holds the other end of the connection (sock_diag's
// UNIX_DIAG_PEER and /proc/PID/fd).
//
// A capability counts only where it holds. A uid-0 process that made a user
// namespace of its own shows every capability in /proc/PID/status
// (DESIGN.md fact 25), and none of them holds over napitapd's objects,
// which the initial user namespace owns. Every capability check here
// follows the kernel's cap_capable from the user namespace that owns the
// object up to the process's own.
//
// A connection speaks with its connecting process's identity as it was
// when it connected, never as that process is when it asks: it may have
// passed the connection on and exec'd a program that gained privilege
// (setuid, file capabilities), and its pid is the same. Its uid, gid and
// supplementary groups are the kernel's record at connect time
// (SO_PEERCRED, SO_PEERGROUPS); its capabilities, which the kernel does not
// record, count only if it was root then. An exec cannot give a root
// process more than the code it chose to run could have had anyway (its
// bounding set, or with no_new_privs its permitted set), so reading a
// root's capabilities at request time lends it nothing. The one exception,
// a root under SECBIT_NOROOT exec'ing a file-capability program, is in
// docs/threat-model.md.
package peer

import (
	"errors"
	"fmt"
	"net"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Required are the capabilities that make napitapd what it is (the
// DaemonSet's, but SETUID and SETGID, without which napitapd still runs),
// in napitapd's user namespace: a process that has them there is as good
// as root on the node already.
const Required = 1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SYS_ADMIN | 1<<unix.CAP_SYS_PTRACE

// ErrNotNapitapd is wrapped by every refusal of a peer as napitapd's equal.
var ErrNotNapitapd = errors.New("the peer is not root with napitapd's capabilities")

// ErrGone: the process exited, and its pid may already be another
// process's.
var ErrGone = errors.New("the peer has exited")

// Process is a peer, pinned by a pidfd where the kernel gives one.
type Process struct {
	Pid      int
	UID, GID uint32 // the kernel's record at connect time (SO_PEERCRED), or Accepting's read
	// Groups are the supplementary groups at connect time (SO_PEERGROUPS);
	// nil from Accepting.
	Groups []uint32
	pidfd  int // -1: before Linux 6.5, none; see pidfdErr
	// pidfdErr: the kernel has SO_PEERPIDFD but it failed: the pid
	// cannot be confirmed, and every question about the process fails
	// closed (after pinned's retries, for want of an fd). Its uid stands.
	pidfdErr error
	conn     *net.UnixConn // Connected's, for pinned
}

// Cred is what the kernel recorded about the process that connected to c
// at connect time (SO_PEERCRED): enough to count connections by uid, and,
// unlike Connected, it costs no fd.
func Cred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}

// Tenant is what a bound on connections needs of the process that
// connected to c: its record at connect time (SO_PEERCRED), and whether it
// is napitapd's equal, which no bound refuses (Napitapd). Only a root peer
// costs a pidfd, opened and closed here: a flood of others is refused
// with one getsockopt each.
func Tenant(c *net.UnixConn) (cred *unix.Ucred, napitapds bool, err error) {
	if cred, err = Cred(c); err != nil || cred.Uid != 0 {
		return cred, false, err
	}
	p, err := Connected(c)
	if err != nil {
		return cred, false, nil // unjudged: a tenant
	}
	defer p.Close()
	return cred, p.Napitapd() == nil, nil
}

// Connected is the process that connected to c, which this side accepted,
// as the kernel recorded it then. Close it when done.
func Connected(c *net.UnixConn) (*Process, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr, groupsErr, pidfdErr error
	p := &Process{pidfd: -1, conn: c}
	if err := rc.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		p.Groups, groupsErr = peerGroups(int(fd))
		p.pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, err
	}
	if pidfdErr != nil {
		p.pidfd = -1
	}
	if err := errors.Join(wrapErr("SO_PEERCRED", credErr), wrapErr("SO_PEERGROUPS", groupsErr)); err != nil {
		p.Close()
		return nil, err
	}
	p.Pid, p.UID, p.GID = int(cred.Pid), cred.Uid, cred.Gid
	switch {
	case p.Pid == 0:
		// A peer in another pid namespace, which napitapd cannot see.
		p.pidfdErr = errors.New("it is outside this pid namespace")
	case errors.Is(pidfdErr, unix.ENOPROTOOPT):
		// Before Linux 6.5: the pid, which the peer may have left for
		// another process by now; every check then judges that one, and
		// the pidfd confirms it stayed the same while it was judged.
		if p.pidfd, err = unix.PidfdOpen(p.Pid, 0); err != nil {
			p.pidfd, p.pidfdErr = -1, goneOr(fmt.Errorf("pidfd_open: %w", err))
		}
	case pidfdErr != nil:
		p.pidfdErr = fmt.Errorf("SO_PEERPIDFD: %w", pidfdErr)
	}
	return p, nil
}

func wrapErr(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13): the supplementary groups
// of the connecting process at connect time.
func peerGroups(fd int) ([]uint32, error) {
	groups := make([]uint32, 64)
	for {
		size := uint32(len(groups) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&groups[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case errno == unix.ERANGE && int(size/4) > len(groups):
			groups = make([]uint32, size/4) // the size it needs
		case errno != 0:
			return nil, errno
		default:
			return groups[:size/4], nil
		}
	}
}

// Accepting is the process pid, which says it accepted c (this side
// connected): it must hold the other end of c. Close it when done.
func Accepting(c *net.UnixConn, pid int) (*Process, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("%w: it names no pid", ErrNotNapitapd)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: pid %d: %w", ErrNotNapitapd, pid, goneOr(err))
	}
	p := &Process{Pid: pid, pidfd: pidfd}
	if err := p.holdsOtherEnd(c); err != nil {
		p.Close()
		return nil, err
	}
	// No SO_PEERCRED for the side that accepted: its uid now.
	c2, err := p.read(-1)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("%w: credentials of pid %d: %w", ErrNotNapitapd, pid, err)
	}
	p.UID, p.GID = c2.EUID, c2.EGID
	return p, nil
}

// Close lets go of the pidfd.
func (p *Process) Close() {
	if p.pidfd >= 0 {
		unix.Close(p.pidfd)
		p.pidfd = -1
	}
}

// String names the process in logs and errors.
func (p *Process) String() string { return fmt.Sprintf("pid %d uid %d", p.Pid, p.UID) }

// Creds are p's credentials, with NetAdmin over the netns netnsFD (-1:
// none asked), confirmed to be the peer's own: ErrGone once it exited.
// For a peer that connected (Connected) its uid, gid and groups are those
// of connect time, and it has capabilities only if it was root then
// (package doc); Accepting's peer is read as it is now.
func (p *Process) Creds(netnsFD int) (Creds, error) {
	if p.conn != nil && p.UID != 0 {
		// Nothing to read: what it became since it connected counts
		// for nothing.
		err := p.pinned()
		if err == nil {
			err = p.alive()
		}
		if err != nil {
			return Creds{}, fmt.Errorf("credentials of pid %d: %w", p.Pid, err)
		}
		return Creds{EUID: p.UID, EGID: p.GID, Groups: p.Groups, GroupsRead: true}, nil
	}
	c, err := p.read(netnsFD)
	if err != nil {
		return c, fmt.Errorf("credentials of pid %d: %w", p.Pid, err)
	}
	if p.conn != nil {
		c.EUID, c.EGID, c.Groups = p.UID, p.GID, p.Groups
	}
	return c, nil
}

// read reads p's credentials, then makes sure with the pidfd that the pid
// was p's all along: a pid is given to another process only once its
// pidfd polls readable.
func (p *Process) read(netnsFD int) (Creds, error) {
	if err := p.pinned(); err != nil {
		return Creds{}, err
	}
	var netns *Netns
	if netnsFD >= 0 {
		var err error
		if netns, err = NetnsOf(netnsFD); err != nil {
			return Creds{}, err
		}
	}
	c, err := readCreds(p.Pid, netns)
	if err != nil {
		return c, goneOr(err)
	}
	return c, p.alive()
}

// Napitapd: p is napitapd's equal, root with Required in napitapd's user
// namespace, and was so while it was judged. Every refusal wraps
// ErrNotNapitapd, and ErrGone where the peer exited. It opens no fd (a
// napitapd out of fds still tells the plugin from a pod): its uid is the
// kernel's record of p (SO_PEERCRED), its capabilities capget(2)'s, its
// user namespace a stat of /proc/PID/ns/user.
func (p *Process) Napitapd() error {
	if err := p.pinned(); err != nil {
		return fmt.Errorf("%w: %w", ErrNotNapitapd, err)
	}
	if p.UID != 0 {
		return fmt.Errorf("%w: pid %d runs as uid %d, not root", ErrNotNapitapd, p.Pid, p.UID)
	}
	c, err := capsOf(p.Pid)
	if err == nil {
		err = p.alive()
	}
	if err != nil {
		return fmt.Errorf("%w: credentials of pid %d: %w", ErrNotNapitapd, p.Pid, goneOr(err))
	}
	if c.napitapdCaps&Required != Required {
		if c.CapEff&Required == Required {
			return fmt.Errorf("%w: pid %d has napitapd's capabilities only in a user namespace of its own (%s), not in napitapd's", ErrNotNapitapd, p.Pid, c.userNS)
		}
		return fmt.Errorf("%w: pid %d lacks capabilities 0x%x of napitapd's 0x%x (it has 0x%x)", ErrNotNapitapd, p.Pid, Required&^c.CapEff, uint64(Required), c.CapEff)
	}
	return nil
}

// OpenNetns opens p's network namespace; the caller closes it. Through the
// pidfd where the kernel can (PIDFD_GET_NET_NAMESPACE, Linux 6.11): the
// netns of that very process; else through /proc/PID/ns/net, which a
// later read or alive confirms.
func (p *Process) OpenNetns() (int, error) {
	if err := p.pinned(); err != nil {
		return -1, err
	}
	if p.pidfd >= 0 {
		fd, err := unix.IoctlRetInt(p.pidfd, pidfdGetNetNamespace)
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
			return -1, fmt.Errorf("netns of pid %d: %w", p.Pid, goneOr(err))
		}
	}
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/ns/net", p.Pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("netns of pid %d: %w", p.Pid, goneOr(err))
	}
	return fd, nil
}

// pinned makes sure p's pid can be confirmed. The socket keeps the
// process that connected, so SO_PEERPIDFD names it whenever it is asked:
// one that failed for want of an fd (a napitapd at its fd limit) is asked
// again, for up to a second, while other connections close.
func (p *Process) pinned() error {
	if p.pidfdErr == nil {
		return nil
	}
	if p.conn != nil && p.Pid != 0 {
		rc, err := p.conn.SyscallConn()
		for wait := 5 * time.Millisecond; err == nil && wait < time.Second && outOfFDs(p.pidfdErr); wait *= 2 {
			time.Sleep(wait)
			var fd int
			var gerr error
			if err = rc.Control(func(s uintptr) { fd, gerr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD) }); err == nil {
				if gerr == nil {
					p.pidfd, p.pidfdErr = fd, nil
					return nil
				}
				p.pidfdErr = fmt.Errorf("SO_PEERPIDFD: %w", gerr)
			}
		}
	}
	return fmt.Errorf("pid %d cannot be confirmed: %w", p.Pid, p.pidfdErr)
}

func outOfFDs(err error) bool { return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) }

// alive: the pidfd's process has not exited, so the pid read before this
// was still its own. A pidfd polls readable once its process has exited;
// it is polled, not signalled: a signal needs kill permission over the
// peer, which napitapd's capabilities do not give over a non-root VMM.
func (p *Process) alive() error {
	if p.pidfd < 0 {
		return nil
	}
	fds := []unix.PollFd{{Fd: int32(p.pidfd), Events: unix.POLLIN}}
	n, err := unix.Poll(fds, 0)
	if err != nil {
		return fmt.Errorf("poll pidfd of pid %d: %w", p.Pid, err)
	}
	if n > 0 {
		return ErrGone
	}
	return nil
}

// goneOr marks err as ErrGone where it says the process is no more.
func goneOr(err error) error {
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("%w: %w", ErrGone, err)
	}
	return err
}

// PIDFD_GET_NET_NAMESPACE, include/uapi/linux/pidfd.h (Linux 6.11):
// _IO(PIDFS_IOCTL_MAGIC, 4).
const pidfdGetNetNamespace = 0xff<<8 | 4
