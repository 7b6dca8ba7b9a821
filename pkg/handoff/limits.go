package handoff

import (
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/connset"
	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/unixsock"
)

// Every connection napitapd serves costs it a goroutine, the socket and a
// pidfd of the peer. Unbounded, a member of the socket group could open
// connections until napitapd runs out of memory or fds, and a napitapd
// that dies stalls every VM until it is back (its fd holder keeps the
// queues, not the service). So it serves a bounded number.
const (
	// DefaultMaxConns bounds the connections of every tenant together
	// (Limits). A node runs about 110 pods (kubelet's default max-pods),
	// and a VMM's fetch or a list holds a connection for milliseconds. 256
	// costs at most 512 fds and a few MiB.
	DefaultMaxConns = 256
	// DefaultMaxConnsPerUID: the VMMs of one runtime may share a uid
	// (KubeVirt's qemu is 107) but fetch once per VM start; 32 at once is a
	// start rate no node reaches. One tenant holding its 32 (a pod's root
	// flooding) leaves the others 224, two at once for each other pod of a
	// 110-pod node, and the plugin, no tenant, is never refused.
	DefaultMaxConnsPerUID = 32
)

// Limits bound the connections a Server serves at once. Zero fields take
// the defaults.
type Limits struct {
	// MaxConns counts the connections of every tenant together: every
	// peer but napitapd's equal (the plugin's ADD, DEL and GC, napitapctl
	// as root), which no bound refuses (unixsock.UIDQuota).
	MaxConns int
	// MaxConnsPerUID is the most one tenant uid may hold, root's (a pod's)
	// included.
	MaxConnsPerUID int
}

func (l Limits) withDefaults() Limits {
	if l.MaxConns == 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxConnsPerUID == 0 {
		l.MaxConnsPerUID = DefaultMaxConnsPerUID
	}
	return l
}

// Validate checks the limits, defaults applied.
func (l Limits) Validate() error {
	l = l.withDefaults()
	if l.MaxConns < 0 || l.MaxConnsPerUID < 0 {
		return fmt.Errorf("connection limits %d and %d per uid: want positive numbers", l.MaxConns, l.MaxConnsPerUID)
	}
	if l.MaxConnsPerUID >= l.MaxConns {
		return fmt.Errorf("connection limit per uid %d: want less than the limit of all tenants' connections, %d", l.MaxConnsPerUID, l.MaxConns)
	}
	return nil
}

// connTable counts the connections being served.
type connTable struct {
	quota unixsock.UIDQuota

	refusals unixsock.Every // log lines about refused connections
	failures unixsock.Every // log lines about failed accepts

	open connset.Set // the connections being served, for Drain
}

// listenBacklog bounds the queue of connections napitapd has not accepted
// yet: a caller that connects behind a flood waits for all of them to be
// refused. The kernel's default (somaxconn, 4096 here) made a fetch wait
// 100-200 ms; 128 take a few ms. Callers wait for room in a blocking
// connect (Client does), which the kernel serves in order.
const listenBacklog = 128

func setBacklog(l *net.UnixListener, n int) error {
	rc, err := l.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) { lerr = unix.Listen(int(fd), n) }); err != nil {
		return err
	}
	return os.NewSyscallError("listen", lerr)
}

// admit decides whether Serve serves conn, and counts it in: every peer
// but napitapd's equal is a tenant, counted by its uid (a pod's root too).
// It closes a connection it refuses at once.
func (s *Server) admit(conn *net.UnixConn, lim Limits) (uid uint32, napitapds, ok bool) {
	cred, napitapds, err := peer.Tenant(conn)
	if err != nil {
		conn.Close()
		if ok, n := s.conns.refusals.Allow(); ok {
			s.log.Error("refused connection without peer credentials", "err", err, "refusedSinceLastLine", n)
		}
		return 0, false, false
	}
	if ok, why := s.conns.quota.Admit(cred.Uid, napitapds); !ok {
		conn.Close()
		if s.Observe != nil {
			s.Observe("connect", "quota")
		}
		if ok, n := s.conns.refusals.Allow(); ok {
			s.log.Warn("refused connection", "reason", why, "pid", cred.Pid, "uid", cred.Uid,
				"maxConns", lim.MaxConns, "maxConnsPerUID", lim.MaxConnsPerUID, "refusedSinceLastLine", n)
		}
		return 0, false, false
	}
	return cred.Uid, napitapds, true
}

// logInterval spaces out log lines that a flood would repeat.
const logInterval = 10 * time.Second
