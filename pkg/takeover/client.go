package takeover

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/napitap/napitap/pkg/buildinfo"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/safefile"
)

// Offer is everything the running napitapd handed over, not yet taken:
// it has stopped serving, and waits for Accept or Decline.
type Offer struct {
	Files []File
	// From is the old napitapd's version; empty from one older than it.
	From string
	// Asked is when the request went out: the takeover's time starts there.
	Asked time.Time
	conn  *net.UnixConn
}

// ErrUnreachable: nothing answers on the takeover socket.
var ErrUnreachable = errors.New("no napitapd answers on the takeover socket")

// Request asks the napitapd serving stateDir for everything it holds. A
// *PeerError with Op "refuse" says it speaks no version this one does.
func Request(stateDir string) (*Offer, error) {
	path := Socket(stateDir)
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	o := &Offer{conn: c, Asked: time.Now()}
	if err := o.request(); err != nil {
		c.Close()
		return nil, fmt.Errorf("takeover through %s: %w", path, err)
	}
	return o, nil
}

func (o *Offer) request() error {
	// Only root may bind in the state dir, but say so if anyone else did.
	if cred, err := peer.Cred(o.conn); err != nil || cred.Uid != 0 {
		return fmt.Errorf("the peer is not root (%+v, %v)", cred, err)
	}
	_ = o.conn.SetDeadline(time.Now().Add(helloTimeout))
	if err := send(o.conn, &message{Op: opHello, Versions: []int{Version}, Build: buildinfo.Version()}, nil); err != nil {
		return err
	}
	accept, _, err := recv(o.conn, opAccept)
	if err != nil {
		return err
	}
	// Only now, with the files on their way, is the other side's word
	// worth checking: a process that is not a napitapd learns nothing
	// from a hello, and gets nothing from this side.
	p, err := peer.Accepting(o.conn, accept.Pid)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := p.Napitapd(); err != nil {
		return err
	}
	o.From = accept.Build
	_ = o.conn.SetDeadline(time.Now().Add(readyTimeout))
	files, err := recvFiles(o.conn)
	if err != nil {
		return err
	}
	o.Files = files
	return nil
}

// Accept tells the old napitapd that this one is ready and waits for it
// to let go. After nil the caller owns o.Files and serves them; after an
// error the old napitapd serves them again (or is gone): the caller must
// not serve, and closes them.
func (o *Offer) Accept() error {
	defer o.conn.Close()
	// No deadline on go: the old napitapd either sends it or, on its own
	// deadline, resumes and hangs up. Giving up here could leave it
	// committed and nobody serving.
	_ = o.conn.SetDeadline(time.Time{})
	if err := send(o.conn, &message{Op: opReady}, nil); err != nil {
		return fmt.Errorf("takeover: ready: %w", err)
	}
	if _, _, err := recv(o.conn, opGo); err != nil {
		return fmt.Errorf("takeover: waiting for go: %w", err)
	}
	return nil
}

// Decline hands everything back: the old napitapd serves on. It closes
// o.Files (this process's copies).
func (o *Offer) Decline(reason error) {
	_ = send(o.conn, &message{Op: opAbort, Error: reason.Error()}, nil)
	o.conn.Close()
	CloseAll(o.Files)
}

// ErrLocked: another napitapd holds the state dir's lock.
var ErrLocked = errors.New("another napitapd holds the state dir")

// TryLock takes the state dir's lock, held for the daemon's life through
// the returned file (and through a takeover: the file is handed over,
// and with it the lock, which is its open file's).
func TryLock(stateDir string) (*os.File, error) {
	if err := safefile.TrustedDir(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	path := filepath.Join(stateDir, LockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// retryInterval paces Acquire.
const retryInterval = 250 * time.Millisecond

// Acquire makes this napitapd the one for stateDir: it takes the lock if
// no napitapd holds it (lock set), or else takes over from the one that
// does (offer set). One that cannot take over (no version in common, or no
// takeover socket) says so and waits for the lock, that is for the other
// to exit: never two on one state dir. A napitapd from before the lock
// holds none, and makes no lock file: on a state dir without one, while a
// connection to socket (the hand-off socket it serves) succeeds, Acquire
// waits for it too, and makes no lock file meanwhile. Once the file exists,
// a free lock means that nobody serves, even if a connection succeeds: the
// fd holder (pkg/fdstore) keeps the sockets of a napitapd that died, and
// their backlogs take connections for the next one.
func Acquire(ctx context.Context, stateDir, socket string, log *slog.Logger) (lock *os.File, offer *Offer, err error) {
	var said string
	refused := false
	wait := func(why error) error {
		if why.Error() != said {
			said = why.Error()
			log.Warn("another napitapd serves this state dir and cannot be taken over: waiting for it to exit, then serving from the state files", "state", stateDir, "err", why)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retryInterval):
			return nil
		}
	}
	for {
		_, statErr := os.Lstat(filepath.Join(stateDir, LockName))
		var lock *os.File
		var err error
		if errors.Is(statErr, os.ErrNotExist) && answers(socket) {
			err = fmt.Errorf("a napitapd without the state dir's lock (one older than takeover) serves %s", socket)
		} else if lock, err = TryLock(stateDir); err == nil {
			return lock, nil, nil
		} else if !errors.Is(err, ErrLocked) {
			return nil, nil, err
		} else if !refused {
			offer, rerr := Request(stateDir)
			if rerr == nil {
				return nil, offer, nil
			}
			var pe *PeerError
			// Asking again would get the same answer, and a line in the
			// other's log each time.
			refused = errors.As(rerr, &pe) && pe.Op == opRefuse
			err = rerr
		}
		if err := wait(err); err != nil {
			return nil, nil, err
		}
	}
}

// answers: something accepts connections on the SOCK_SEQPACKET socket at
// path. A socket file nobody listens on refuses them.
func answers(path string) bool {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return false
	}
	c.Close()
	return true
}
