package seccompagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/connset"
	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/unixsock"
)

const (
	// DefaultSocket is where runc, crun (the OCI seccomp listenerPath) and
	// napitapctl launch send listeners.
	DefaultSocket = "/run/napitap/seccomp.sock"
	// MaxMessage bounds one message; runc's is about 730 bytes, more with
	// many annotations.
	MaxMessage = 64 << 10
	// DefaultMaxConns bounds connections being read at once: each lasts
	// milliseconds (runc's connect, send and hang-up).
	DefaultMaxConns = 64
	// DefaultMaxConnsPerUID bounds those of one tenant uid, a pod's root
	// included (unixsock.UIDQuota): a member of the socket's group
	// holding idle connections cannot stop runc, crun or Kata's shim
	// (napitapd's equals, never refused) nor the other tenants from
	// handing listeners over.
	DefaultMaxConnsPerUID = 16
	// maxFDs is how many fds a read takes in; more is an error anyway.
	maxFDs = 4
	// rootTimeout bounds a root sender that connects and says nothing.
	// crun connects in `crun create` and a helper it clones from the
	// container's init sends later, after the container's set-up: give it
	// time on a busy node.
	rootTimeout = 5 * time.Second
	// otherTimeout bounds any other sender: napitapctl launch sends as
	// soon as it has connected.
	otherTimeout = time.Second
	// AckOK is the line a sender reads back when the agent serves its
	// listener; anything else starts with "error: ".
	AckOK = "ok"
	// MaxOrigin bounds a listener's origin, in bytes. The origin is built
	// of what any member of the socket's group sends, and travels in
	// takeover messages and the fd holder's metadata; cleaned (clean),
	// it is at most 2*MaxOrigin+2 bytes of JSON.
	MaxOrigin = 512
	// maxLabel, maxName and maxID bound the strings a sender supplies,
	// each where it is received: a Kubernetes namespace or container name
	// (a DNS label), a pod name (a DNS subdomain), an ID (runc's are 64
	// hex digits, a pod's UID 36 characters).
	maxLabel = 63
	maxName  = 253
	maxID    = 128
)

// Server is the socket front-end: one message per connection, JSON
// specs.ContainerProcessState with the listener fd as SCM_RIGHTS, as
// runc >= 1.1 and crun >= 0.19 send to a seccomp listenerPath.
type Server struct {
	agent *Agent
	log   *slog.Logger
	conns unixsock.UIDQuota // connections being served, per peer uid
	// drops spaces out the log lines about connections refused for the
	// bound, so that a flood cannot flood the log too.
	drops unixsock.Every
}

// Limits bound the connections a Server serves at once; zero fields take
// the defaults. Connections beyond them are closed at once.
type Limits struct {
	MaxConns       int // DefaultMaxConns when 0
	MaxConnsPerUID int // DefaultMaxConnsPerUID when 0, at most half of MaxConns
}

// NewServer hands the listeners it receives to agent.
func NewServer(agent *Agent, logger *slog.Logger, lim Limits) *Server {
	if lim.MaxConns <= 0 {
		lim.MaxConns = DefaultMaxConns
	}
	if lim.MaxConnsPerUID <= 0 {
		lim.MaxConnsPerUID = DefaultMaxConnsPerUID
	}
	lim.MaxConnsPerUID = max(1, min(lim.MaxConnsPerUID, lim.MaxConns/2))
	return &Server{agent: agent, log: logger,
		conns: unixsock.UIDQuota{Max: lim.MaxConns, MaxPerUID: lim.MaxConnsPerUID},
		drops: unixsock.Every{Interval: time.Second}}
}

// Listen makes the SOCK_STREAM socket runc dials: stale one removed, mode
// and group applied before anyone can connect.
func Listen(path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	return unixsock.Listen("unix", path, mode, gid)
}

// Serve accepts senders until l is closed, and returns once every
// connection has ended: at once when abort is done (napitapd is stopping,
// and a sender that holds its connection open must not hold it up).
func (s *Server) Serve(abort context.Context, l *net.UnixListener) error {
	var conns connset.Set
	defer conns.Wait()
	return unixsock.Serve(l, func(err error, wait time.Duration) {
		s.log.Error("seccomp socket accept", "err", err, "retry_in", wait)
	}, func(conn *net.UnixConn) {
		cred, napitapds, err := peer.Tenant(conn)
		if err != nil {
			// Without a uid neither the connection nor its listener can
			// be counted against one.
			conn.Close()
			s.log.Warn("seccomp socket: refused a sender without peer credentials", "err", err)
			return
		}
		if ok, why := s.conns.Admit(cred.Uid, napitapds); !ok {
			conn.Close()
			if ok, held := s.drops.Allow(); ok {
				s.log.Warn("seccomp socket: too many connections at once, closed", "reason", why,
					"pid", cred.Pid, "uid", cred.Uid, "count", held+1)
			}
			return
		}
		c := conns.Add(abort, conn)
		go func() {
			defer c.Done()
			defer s.conns.Done(cred.Uid, napitapds)
			s.serveConn(conn, c, cred, napitapds)
		}()
	})
}

func (s *Server) serveConn(conn *net.UnixConn, deadline *connset.Conn, cred *unix.Ucred, napitapds bool) {
	defer conn.Close()
	defer unixsock.LogPanic(s.log, "seccomp socket: panic serving a sender", "pid", cred.Pid, "uid", cred.Uid)
	timeout := otherTimeout
	if cred.Uid == 0 {
		timeout = rootTimeout
	}
	deadline.ReadWithin(timeout)
	peer := sender(cred)
	b, fds, err := readMessage(conn)
	if err == nil {
		var st *specs.ContainerProcessState
		var fd int
		if st, fd, err = parseMessage(b, fds); err == nil {
			fds = nil // Add owns it now
			from := origin(st, peer)
			l := Listener{UID: cred.Uid, PodRoot: cred.Uid == 0 && !napitapds, Origin: from, OwnTaps: st.Metadata == launchMetadata}
			if err = s.agent.add(fd, l); err == nil {
				s.logListener(st, from, peer)
			}
		}
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	ack := AckOK
	if err != nil {
		s.log.Warn("seccomp socket: refused", "from", peer, "err", err)
		ack = "error: " + err.Error()
	}
	// runc hangs up without reading; napitapctl launch waits for this.
	deadline.WriteWithin(time.Second)
	_, _ = conn.Write([]byte(ack + "\n"))
}

// sender names the peer in logs by pid, uid and command name, which tells
// runc's listener from crun's or napitapctl's. The peer is the process that
// connected: runc create, crun create (a helper crun clones from the
// container's init sends on that socket), napitapctl launch. Its name is
// read before the message, while it still creates the container or waits
// for the ack, and left out if it is already gone.
func sender(cred *unix.Ucred) string {
	s := fmt.Sprintf("peer pid %d uid %d", cred.Pid, cred.Uid)
	if comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cred.Pid)); err == nil {
		s += " comm " + clean(strings.TrimSuffix(string(comm), "\n"), maxLabel)
	}
	return s
}

// readMessage reads until the bytes form one JSON value, the peer hangs
// up, or MaxMessage is exceeded. It returns every fd that came along; the
// caller closes them.
func readMessage(conn *net.UnixConn) ([]byte, []int, error) {
	buf := make([]byte, 0, 4096)
	oob := make([]byte, unix.CmsgSpace(maxFDs*4))
	var fds []int
	chunk := make([]byte, MaxMessage+1)
	for {
		n, oobn, flags, _, err := conn.ReadMsgUnix(chunk[:MaxMessage+1-len(buf)], oob)
		// On an error (a deadline, a reset) the counts may be -1.
		n, oobn = max(n, 0), max(oobn, 0)
		got, perr := parseRights(oob[:oobn])
		fds = append(fds, got...)
		buf = append(buf, chunk[:n]...)
		switch {
		case perr != nil:
			return nil, fds, fmt.Errorf("ancillary data: %w", perr)
		case flags&unix.MSG_CTRUNC != 0:
			return nil, fds, fmt.Errorf("more than %d fds", maxFDs)
		case len(buf) > MaxMessage:
			return nil, fds, fmt.Errorf("message larger than %d bytes", MaxMessage)
		case n > 0 && json.Valid(buf):
			return buf, fds, nil
		case err != nil && len(buf) == 0:
			return nil, fds, fmt.Errorf("no message: %w", err)
		case err != nil:
			return nil, fds, fmt.Errorf("incomplete message of %d bytes: %w", len(buf), err)
		}
	}
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var firstErr error
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		fds = append(fds, got...)
	}
	return fds, firstErr
}

// parseMessage checks a sender's message against the fds that came with
// it and returns the listener fd: exactly one fd, named seccompFd.
func parseMessage(b []byte, fds []int) (*specs.ContainerProcessState, int, error) {
	var st specs.ContainerProcessState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, -1, fmt.Errorf("message is not a ContainerProcessState: %w", err)
	}
	switch {
	case st.Version == "":
		return nil, -1, errors.New("message has no ociVersion")
	case len(st.Fds) != len(fds):
		return nil, -1, fmt.Errorf("message names %d fds, %d came with it", len(st.Fds), len(fds))
	case len(fds) != 1 || st.Fds[0] != specs.SeccompFdName:
		return nil, -1, fmt.Errorf("want one fd named %q, got %.64q", specs.SeccompFdName, st.Fds)
	case st.Pid <= 0:
		return nil, -1, fmt.Errorf("message has pid %d", st.Pid)
	}
	return &st, fds[0], nil
}

// logListener says whose listener is served: the container runc names
// and, through CRI, its pod sandbox (what an operator greps for).
func (s *Server) logListener(st *specs.ContainerProcessState, from, peer string) {
	a := st.State.Annotations
	s.log.Info("serving seccomp listener", "from", from, "sender", peer,
		"container", clean(st.State.ID, maxID), "status", clean(string(st.State.Status), maxLabel),
		"metadata", clean(st.Metadata, maxName),
		"sandbox_id", clean(a["io.kubernetes.cri.sandbox-id"], maxID),
		"sandbox_uid", clean(a["io.kubernetes.cri.sandbox-uid"], maxID),
		"listeners", s.agent.Listeners())
}

// origin names a listener in logs: the pod when runc sent it through CRI.
// It is at most MaxOrigin bytes, each part bounded first so that none
// crowds out the others.
func origin(st *specs.ContainerProcessState, peer string) string {
	a := st.State.Annotations
	var s string
	switch name := a["io.kubernetes.cri.sandbox-name"]; {
	case name != "":
		s = fmt.Sprintf("pod %s/%s container %q pid %d", clean(a["io.kubernetes.cri.sandbox-namespace"], maxLabel),
			clean(name, maxName), clean(a["io.kubernetes.cri.container-name"], maxLabel), st.Pid)
	case st.State.ID != "":
		s = fmt.Sprintf("container %s pid %d", clean(st.State.ID, maxID), st.Pid)
	default:
		s = fmt.Sprintf("pid %d (%s)", st.Pid, peer)
	}
	return clean(s, MaxOrigin)
}

// clean bounds a string a sender supplied to n bytes, cut on a rune
// boundary, with '?' for what JSON writes as a 6-byte \uXXXX (control
// characters, <, >, &, U+2028, U+2029, invalid UTF-8). Replacing them,
// rather than counting them, keeps the bound simple: JSON writes the
// rest in at most 2 bytes a byte (\" and \\), and a log line gets no
// control characters.
func clean(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case unicode.IsControl(r), r == '<', r == '>', r == '&', r == '\u2028', r == '\u2029', r == utf8.RuneError:
			return '?'
		}
		return r
	}, s)
	if len(s) > n {
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	return s
}

// CheckCapabilities logs what the agent cannot do without CAP_SETUID and
// CAP_SETGID.
func CheckCapabilities(logger *slog.Logger) {
	const setIDs = 1<<unix.CAP_SETUID | 1<<unix.CAP_SETGID
	if c, err := peer.Own(); err == nil && c.CapEff&setIDs != setIDs {
		logger.Error("seccomp agent: napitapd lacks CAP_SETUID or CAP_SETGID, without which it cannot attach a queue as the calling runtime: every TUNSETIFF is left to the kernel, without NAPI")
	}
}

// Start serves the socket at path with an agent for reg until the
// returned stop is called; stop closes every listener, after which their
// processes get ENOSYS for TUNSETIFF (there is no taking a filter back).
func Start(path string, mode os.FileMode, gid int, reg Registry, logger *slog.Logger) (stop func(), err error) {
	agent, err := New(reg, logger, Options{})
	if err != nil {
		return nil, err
	}
	CheckCapabilities(logger)
	l, err := Listen(path, mode, gid)
	if err != nil {
		agent.Close()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := NewServer(agent, logger, Limits{}).Serve(context.Background(), l); err != nil {
			logger.Error("seccomp socket", "path", path, "err", err)
		}
	}()
	return func() {
		l.Close()
		<-done
		agent.Close()
		os.Remove(path)
	}, nil
}
