package takeover

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/napitap/napitap/pkg/buildinfo"

	"github.com/napitap/napitap/pkg/connset"
	"github.com/napitap/napitap/pkg/peer"
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
// (as Detach does, the socket being one of the files handed over). Once
// abort is done, a takeover in progress fails at once (before go: the
// Handler resumes) and any later one at its first word: napitapd is
// stopping, whatever the new one does.
func Serve(abort context.Context, l *net.UnixListener, h Handler, log *slog.Logger) error {
	var conns connset.Set // one at a time
	return unixsock.Serve(l, func(err error, wait time.Duration) {
		log.Error("takeover socket: accept failed, retrying", "err", err, "wait", wait)
	}, func(c *net.UnixConn) {
		tc := conns.Add(abort, c)
		defer tc.Done()
		serveConn(l, c, tc, h, log)
	})
}

func serveConn(l *net.UnixListener, c *net.UnixConn, deadline *connset.Conn, h Handler, log *slog.Logger) {
	defer c.Close()
	defer unixsock.LogPanic(log, "takeover: panic serving a request")
	p, err := peer.Connected(c)
	if err != nil {
		log.Warn("takeover: refused a peer without credentials", "err", err)
		return
	}
	defer p.Close()
	log = log.With("peer_pid", p.Pid, "peer_uid", p.UID)
	if p.UID != 0 {
		log.Warn("takeover: refused a peer that is not root")
		return
	}
	// Before a word: a uid-0 process without napitapd's capabilities in
	// napitapd's user namespace (a pod's root) gets nothing, and costs
	// this napitapd no pause.
	if err := p.Napitapd(); err != nil {
		log.Warn("takeover: refused a peer that is not a napitapd", "err", err)
		return
	}
	if err := fault(l); err != nil {
		log.Warn("takeover: refused by a fault hook (a test build)", "err", err)
		return
	}
	deadline.Within(helloTimeout)
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
	deadline.Within(readyTimeout)
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
