package takeover

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/napitap/napitap/pkg/buildinfo"

	"github.com/napitap/napitap/pkg/peerauth"
	"github.com/napitap/napitap/pkg/unixsock"
)

const (
	// helloTimeout bounds a peer that connects and says nothing.
	helloTimeout = 5 * time.Second
	// readyTimeout bounds the new napitapd between accept and ready: the
	// old one's Detach (which waits for connections being served: a
	// runc that connected has up to 5 s to send), the files, and the new
	// one's loading of the state dir.
	readyTimeout = 30 * time.Second
)

// Handler is the running napitapd's side of a takeover.
type Handler interface {
	// Detach stops serving, without closing anything, and returns every
	// file to hand over. The napitapd serves nothing until Resume.
	Detach() []File
	// Resume serves files again: the takeover failed before the new
	// napitapd took them.
	Resume(files []File)
	// Handed: the new napitapd serves the files from now on. The caller
	// closes its copies and exits.
	Handed(files []File)
}

// Listen makes the takeover socket in stateDir, root's alone.
func Listen(stateDir string) (*net.UnixListener, error) {
	return unixsock.Listen("unixpacket", Socket(stateDir), 0o600, -1)
}

// Serve answers takeover requests on l, one at a time, until l is closed
// (as Detach does, the socket being one of the files handed over).
func Serve(l *net.UnixListener, h Handler, log *slog.Logger) error {
	return unixsock.Serve(l, func(err error, wait time.Duration) {
		log.Error("takeover socket: accept failed, retrying", "err", err, "wait", wait)
	}, func(c *net.UnixConn) { serveConn(l, c, h, log) })
}

func serveConn(l *net.UnixListener, c *net.UnixConn, h Handler, log *slog.Logger) {
	defer c.Close()
	defer unixsock.LogPanic(log, "takeover: panic serving a request")
	cred, err := unixsock.PeerCred(c)
	if err != nil {
		log.Warn("takeover: refused a peer without credentials", "err", err)
		return
	}
	log = log.With("peer_pid", cred.Pid, "peer_uid", cred.Uid)
	if cred.Uid != 0 {
		log.Warn("takeover: refused a peer that is not root")
		return
	}
	// Before a word: a uid-0 process without napitapd's capabilities (a
	// pod's root) gets nothing, and costs this napitapd no pause.
	if err := peerauth.Connector(c); err != nil {
		log.Warn("takeover: refused a peer that is not a napitapd", "err", err)
		return
	}
	if err := fault(l); err != nil {
		log.Warn("takeover: refused by a fault hook (a test build)", "err", err)
		return
	}
	_ = c.SetDeadline(time.Now().Add(helloTimeout))
	hello, _, err := recv(c, opHello)
	if err != nil {
		log.Warn("takeover: no hello", "err", err)
		_ = send(c, &message{Op: opRefuse, Error: err.Error()}, nil)
		return
	}
	if !slices.Contains(hello.Versions, Version) {
		log.Warn("takeover: refused: no version in common", "theirs", hello.Versions, "ours", Version)
		_ = send(c, &message{Op: opRefuse, Error: fmt.Sprintf("this napitapd speaks takeover version %d, not %v", Version, hello.Versions)}, nil)
		return
	}
	if err := send(c, &message{Op: opAccept, Pid: os.Getpid(), Build: buildinfo.Version()}, nil); err != nil {
		log.Warn("takeover: accept", "err", err)
		return
	}
	start := time.Now()
	log.Info("takeover: a new napitapd takes over; stopping", "version", buildinfo.Version(), "new_version", hello.Build)
	files := h.Detach()
	handed := false
	defer func() {
		if !handed {
			log.Warn("takeover failed: serving again", "files", len(files))
			h.Resume(files)
		}
	}()
	_ = c.SetDeadline(time.Now().Add(readyTimeout))
	if err := sendFiles(c, files); err != nil {
		log.Error("takeover: send", "err", err)
		return
	}
	if _, _, err := recv(c, opReady); err != nil {
		log.Error("takeover: the new napitapd is not ready", "err", err)
		return
	}
	// Once go is sent the new napitapd serves: this one must not again,
	// whatever happens to the connection after.
	if err := send(c, &message{Op: opGo}, nil); err != nil {
		log.Error("takeover: go", "err", err)
		return
	}
	handed = true
	log.Info("takeover: handed over", "files", len(files), "took", time.Since(start))
	h.Handed(files)
}

// Socket is the takeover socket's path in stateDir.
func Socket(stateDir string) string { return filepath.Join(stateDir, SocketName) }
