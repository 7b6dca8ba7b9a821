package handoff

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/napitap/napitap/pkg/buildinfo"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/connset"
	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/safefile"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/pkg/tunperm"
	"github.com/napitap/napitap/pkg/unixsock"
)

// idleTimeout is how long a connection may wait between requests.
const idleTimeout = time.Minute

// sendTimeout bounds an answer to a peer that does not read it; its fds
// are then taken back.
const sendTimeout = 5 * time.Second

// Server holds queue fds for attachments and hands them to runtimes.
type Server struct {
	stateDir string
	log      *slog.Logger

	mu   sync.Mutex
	held map[Key]*entry

	// Limits bound the connections Serve serves at once; set them before
	// Serve.
	Limits Limits
	// NodeNetns is the node's netns, where a NodeTap attachment's tap is:
	// napitapd's own (DefaultNodeNetns) unless a test sets another.
	NodeNetns string
	// Store, if set before Serve, keeps a copy of every queue the server
	// holds outside napitapd's process.
	Store QueueStore
	// Observe, if set before Serve, is told each request's op and result
	// ("ok" or the error code), and each connection refused before any
	// request (op "connect"): napitapd's metrics.
	Observe func(op, result string)
	// QueueStates, if set before Serve, gives what napitapd knows of each
	// open queue of an attachment's tap, for list's answer to a caller
	// that sees every attachment (napitapctl node).
	QueueStates func(att Attachment) []QueueState
	// Filtered, if set before Serve, names the seccomp listeners napitapd
	// serves, for a status from napitapd's equals.
	Filtered func() []string
	conns    connTable
}

// QueueStore keeps copies of the queues a Server holds outside napitapd's
// process (pkg/fdstore, through pkg/daemon), so that a napitapd killed by
// SIGKILL or the OOM killer loses none of them. It is told, under the
// server's lock and so in order, whenever the set held for an attachment
// changes: a copy left behind after a fetch would keep a queue attached
// that no runtime reads (DESIGN.md fact 7).
type QueueStore interface {
	KeepQueues(key Key, files []*os.File) // files are lent: copy them before returning
	ForgetQueues(key Key)
}

func (s *Server) keep(key Key, files []*os.File) {
	if s.Store != nil && len(files) > 0 {
		s.Store.KeepQueues(key, files)
	}
}

func (s *Server) forget(key Key) {
	if s.Store != nil {
		s.Store.ForgetQueues(key)
	}
}

// DefaultNodeNetns is napitapd's own netns, the node's: the DaemonSet
// runs it with hostNetwork, and no thread of it moves its main thread.
const DefaultNodeNetns = "/proc/self/ns/net"

type entry struct {
	att   Attachment
	files []*os.File // empty after a fetch or a restart: reopened on demand
	// sending is closed when napitapd has closed its copies of the fds of
	// the last fetch, or taken them back; nil when no answer is on its way.
	sending chan struct{}
}

// NewServer loads the attachments recorded under stateDir, holding no
// fds: a takeover or the fd holder gives the previous napitapd's back
// (AdoptHeld), else fetch reopens them in the pod netns.
func NewServer(stateDir string, logger *slog.Logger) (*Server, error) {
	if err := safefile.TrustedDir(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir: %w", err)
	}
	s := &Server{stateDir: stateDir, log: logger, held: map[Key]*entry{}, NodeNetns: DefaultNodeNetns, conns: connTable{
		refusals: unixsock.Every{Interval: logInterval},
		failures: unixsock.Every{Interval: logInterval},
	}}
	// A napitapd killed between write and rename leaves these behind.
	if tmps, _ := filepath.Glob(filepath.Join(stateDir, "*.json.tmp")); len(tmps) > 0 {
		for _, tmp := range tmps {
			_ = os.Remove(tmp)
		}
	}
	paths, err := filepath.Glob(filepath.Join(stateDir, "*.json"))
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		var att Attachment
		b, err := os.ReadFile(p)
		if err == nil {
			err = json.Unmarshal(b, &att)
		}
		if err == nil {
			err = att.Validate()
		}
		if err != nil || s.statePath(att.Key) != p {
			s.log.Warn("dropping unreadable state file", "path", p, "err", err)
			_ = os.Remove(p)
			continue
		}
		att.Held = 0
		s.held[att.Key] = &entry{att: att}
	}
	s.Sweep()
	return s, nil
}

// Listen makes the socket: stale ones removed, mode and group applied
// before anyone can connect.
func Listen(path string, mode os.FileMode, gid int) (*net.UnixListener, error) {
	return unixsock.Listen("unixpacket", path, mode, gid)
}

// Serve answers connections until l is closed, and returns only then (or
// at once, with an error, if s.Limits are invalid): napitapd exiting would
// drop every queue it holds. Connections beyond s.Limits are closed at once.
// Once abort is done, every connection, those Drain waits for too, ends at
// once: napitapd is stopping.
func (s *Server) Serve(abort context.Context, l *net.UnixListener) error {
	lim := s.Limits.withDefaults()
	if err := lim.Validate(); err != nil {
		return err
	}
	s.conns.quota.Max, s.conns.quota.MaxPerUID = lim.MaxConns, lim.MaxConnsPerUID
	if err := setBacklog(l, listenBacklog); err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		s.log.Warn("keeping the default listen backlog", "socket", l.Addr().String(), "err", err)
	}
	return unixsock.Serve(l, func(err error, wait time.Duration) {
		if ok, n := s.conns.failures.Allow(); ok {
			s.log.Error("accept failed, retrying", "err", err, "wait", wait, "failedSinceLastLine", n)
		}
	}, func(conn *net.UnixConn) {
		// In the accept loop, so that a flood's connections are refused
		// one at a time and never pile up.
		uid, napitapds, ok := s.admit(conn, lim)
		if !ok {
			return
		}
		c := s.conns.open.Add(abort, conn)
		go func() {
			defer c.Done()
			defer s.conns.quota.Done(uid, napitapds)
			s.serveConn(conn, c)
		}()
	})
}

func (s *Server) serveConn(conn *net.UnixConn, deadline *connset.Conn) {
	defer conn.Close()
	defer unixsock.LogPanic(s.log, "panic serving a connection")
	cred, err := peer.Connected(conn)
	if err != nil {
		s.log.Error("no peer credentials, closing", "err", err)
		return
	}
	defer cred.Close()
	for {
		// A peer that keeps a connection open and says nothing holds a
		// goroutine and an fd; let it go after a while. Once drained or
		// aborted the deadline is past, and the read fails without trying.
		deadline.ReadWithin(idleTimeout)
		b, files, err := recvMsg(conn)
		if errors.Is(err, io.EOF) {
			return
		}
		var resp *Response
		var out, closing []*os.File
		if err == nil && peerClosed(conn) {
			// A plugin that gave up (its ADD timed out while napitapd was
			// down) left its request in the socket's backlog, and may have
			// undone what it named since: nothing is done for it.
			closeAll(files)
			s.log.Info("a request whose caller has hung up: not acted on", "pid", cred.Pid)
			if s.Observe != nil {
				s.Observe("hung-up", CodeGone)
			}
			return
		}
		if err != nil {
			if !errors.Is(err, errTruncated) {
				return
			}
			resp = &Response{Error: errorf(CodeBadRequest, "%v", err)}
		} else {
			resp, out, closing = s.handle(b, files, cred)
		}
		resp.Version = Version
		switch {
		case resp.Error != nil && resp.Error.Code == CodeGone:
			s.log.Info("a request whose caller has exited: not acted on", "pid", cred.Pid, "err", resp.Error.Message)
		case resp.Error != nil:
			s.log.Warn("refused", "pid", cred.Pid, "uid", cred.UID, "gid", cred.GID, "code", resp.Error.Code, "err", resp.Error.Message)
		}
		deadline.WriteWithin(sendTimeout)
		err = sendMsg(conn, resp, out)
		// After the answer, so that a DEL goes on meanwhile; before this
		// connection closes, so that whoever waits for it to close finds
		// the queues closed too.
		closeAll(closing)
		if err != nil {
			if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
				// The caller gave up before the answer (a plugin's timeout).
				s.log.Info("the caller hung up before the answer", "pid", cred.Pid, "err", err)
			} else {
				s.log.Error("send response", "pid", cred.Pid, "err", err)
			}
			s.restore(resp, out)
			if errors.Is(err, errTooBig) {
				// Answer, rather than leave the caller with a bare EOF.
				_ = sendMsg(conn, &Response{Version: Version, Error: errorf(CodeInternal, "%v", err)}, nil)
				continue
			}
			return
		}
		// The runtime now holds the only copies (DESIGN.md fact 7).
		closeAll(out)
		s.sent(resp)
	}
}

// handle owns files: it keeps them (register) or closes them. It returns
// the answer, the fds that go with it, and the queues a release let go,
// which the caller closes once it has answered.
func (s *Server) handle(b []byte, files []*os.File, cred *peer.Process) (resp *Response, out, closing []*os.File) {
	op := "malformed"
	defer func() {
		if s.Observe != nil {
			result := "ok"
			if resp.Error != nil {
				result = resp.Error.Code
			}
			s.Observe(op, result)
		}
	}()
	req, perr := decodeRequest(b)
	if perr != nil {
		closeAll(files)
		return &Response{Error: perr}, nil, nil
	}
	op = req.Op
	if req.Op != OpRegister && len(files) > 0 {
		closeAll(files)
		return &Response{Error: errorf(CodeBadRequest, "%s carries %d unexpected fds", req.Op, len(files))}, nil, nil
	}
	if req.Op != OpFetch && req.Op != OpList && req.Op != OpStatus {
		// A pod's root (uid 0, no capabilities, or all of them in a user
		// namespace of its own) that reached the socket must not release
		// or replace other pods' attachments.
		err := napitapdsEqual(cred)
		if errors.Is(err, peer.ErrGone) {
			// A plugin that gave up (its ADD timed out while napitapd was
			// down) left its request in the socket's backlog: no answer
			// reaches it, and nothing is done for it.
			closeAll(files)
			return &Response{Error: errorf(CodeGone, "%s: the caller, pid %d, has exited: %v", req.Op, cred.Pid, err)}, nil, nil
		}
		if err != nil {
			closeAll(files)
			return &Response{Error: errorf(CodeDenied, "%s is for the napitap plugin (root with CAP_NET_ADMIN, CAP_SYS_ADMIN and CAP_SYS_PTRACE in napitapd's user namespace) only: %v", req.Op, err)}, nil, nil
		}
	}
	switch req.Op {
	case OpRegister:
		return &Response{Error: s.register(req.Attachment, files)}, nil, nil
	case OpFetch:
		resp, out := s.fetch(req.Key, cred)
		return resp, out, nil
	case OpRelease:
		n, closing := s.release(func(a *Attachment) bool { return a.Key == *req.Key })
		return &Response{Released: n}, nil, closing
	case OpGC:
		n, closing := s.release(func(a *Attachment) bool {
			return (req.Network == "" || a.Network == req.Network) && !slices.Contains(req.Valid, a.Key)
		})
		return &Response{Released: n}, nil, closing
	case OpStatus:
		st, err := OwnStatus()
		if err != nil {
			return &Response{Error: errorf(CodeInternal, "%v", err)}, nil, nil
		}
		if s.Filtered != nil && napitapdsEqual(cred) == nil {
			st.Filter = &FilterStatus{Listeners: s.Filtered()}
		}
		return &Response{Status: st}, nil, nil
	default: // OpList
		all := s.list(cred)
		if req.Offset < 0 || req.Offset > len(all) {
			return &Response{Error: errorf(CodeBadRequest, "list offset %d out of range 0-%d", req.Offset, len(all))}, nil, nil
		}
		end := listPageEnd(all, req.Offset)
		return &Response{Attachments: all[req.Offset:end], More: end < len(all)}, nil, nil
	}
}

// listPageEnd ends the page that starts at offset: ListPage attachments,
// fewer where their queue states would make the answer too big for
// MaxHeader, never none.
func listPageEnd(all []Attachment, offset int) int {
	size := 0
	for i := offset; i < len(all) && i < offset+ListPage; i++ {
		if len(all[i].QueueStates) > 0 {
			b, _ := json.Marshal(all[i])
			size += len(b)
		} else {
			size += 1 << 10 // an attachment alone is well under it
		}
		if size > MaxHeader*3/4 && i > offset {
			return i
		}
	}
	return min(offset+ListPage, len(all))
}

func (s *Server) register(att *Attachment, files []*os.File) *Error {
	switch {
	case att.Intercept && len(files) > 0:
		closeAll(files)
		return errorf(CodeBadRequest, "attachment %s: %d fds for an intercepted tap, of which napitapd holds none", att.Key, len(files))
	case !att.Intercept && len(files) != att.Queues:
		closeAll(files)
		return errorf(CodeBadRequest, "attachment %s: %d fds for %d queues", att.Key, len(files), att.Queues)
	}
	id, err := tapsetup.NetnsID(att.Netns)
	if err != nil {
		closeAll(files)
		return errorf(CodeUnavailable, "attachment %s: %v", att.Key, err)
	}
	if att.NodeTap {
		// The agent finds the tap by the netns of the runtime's tun fd,
		// and the sweep looks for it in napitapd's own.
		nodeID, err := tapsetup.NetnsID(s.NodeNetns)
		if err != nil {
			return errorf(CodeInternal, "attachment %s: napitapd's netns: %v", att.Key, err)
		}
		if att.TapNetnsID != nodeID {
			return errorf(CodeBadRequest, "attachment %s: tap %q is in netns %d and napitapd in %d: run napitapd in the node's netns (hostNetwork)", att.Key, att.TapName, att.TapNetnsID, nodeID)
		}
	}
	// Asked again under the lock below; asked first so that a key that
	// exists is told so before the kernel checks, which cost rtnl and a
	// netns switch.
	if s.registered(att.Key) {
		closeAll(files)
		return errorf(CodeExists, "attachment %s is already registered", att.Key)
	}
	// Never the register's word for what napitapd will hold: its tap is in
	// the netns at the path it names, marked as the key's, and every fd is
	// a queue of that tap.
	att.NetnsID, att.Held = id, len(files)
	if perr := s.checkTap(att); perr != nil {
		closeAll(files)
		return perr
	}
	for _, f := range files {
		if err := isQueueOf(f, att); err != nil {
			closeAll(files)
			return errorf(CodeBadRequest, "%v", err)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[att.Key]; ok {
		closeAll(files)
		return errorf(CodeExists, "attachment %s is already registered", att.Key)
	}
	if err := s.writeState(att); err != nil {
		closeAll(files)
		return errorf(CodeInternal, "attachment %s: %v", att.Key, err)
	}
	s.held[att.Key] = &entry{att: *att, files: files}
	s.keep(att.Key, files)
	s.log.Info("registered", "attachment", att.Key.String(), "tap", att.TapName, "queues", att.Queues, "netns", att.Netns)
	return nil
}

func (s *Server) registered(key Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held[key]
	return ok
}

func (s *Server) fetch(key *Key, cred *peer.Process) (*Response, []*os.File) {
	root := napitapdsEqual(cred) == nil
	s.mu.Lock()
	defer s.mu.Unlock()
	var who *identity
	identify := func() (perr *Error) {
		var err error
		if who, err = identify(cred); err != nil {
			return identifyError(cred, err)
		}
		return nil
	}
	if !root || key == nil {
		if perr := identify(); perr != nil {
			return &Response{Error: perr}, nil
		}
	}
	e, perr := s.find(key, who, root)
	if perr != nil {
		return &Response{Error: perr}, nil
	}
	if perr := authorize(&e.att, who, root); perr != nil {
		return &Response{Error: perr}, nil
	}
	if e.att.NAPIFrags {
		// The queues carry IFF_NAPI_FRAGS, which napitap (and a reopen)
		// set with their own CAP_NET_ADMIN: the caller must have it where
		// the kernel asks it of its own TUNSETIFF, root or not.
		if who == nil {
			if perr := identify(); perr != nil {
				return &Response{Error: perr}, nil
			}
		}
		if !who.creds.InitNetAdmin {
			return &Response{Error: errorf(CodeDenied, "attachment %s: napiFrags: its queues carry IFF_NAPI_FRAGS, which the kernel gives only to CAP_NET_ADMIN in the initial user namespace; uid %d lacks it", e.att.Key, who.creds.EUID)}, nil
		}
	}
	if e.att.Intercept {
		// Queues napitapd opened would take traffic the runtime's own
		// by-name queues never see (DESIGN.md fact 7).
		return &Response{Error: errorf(CodeBadRequest, "attachment %s: the runtime opens tap %q by name (handoff mode intercept); there are no fds to fetch", e.att.Key, e.att.TapName)}, nil
	}
	if len(e.files) == 0 && e.sending != nil {
		// A VMM that restarts at once can ask before napitapd has closed
		// its copies of the last answer's fds; reopen would find the
		// queues attached.
		sending := e.sending
		s.mu.Unlock()
		select {
		case <-sending:
		case <-time.After(sendTimeout):
		}
		s.mu.Lock()
		if s.held[e.att.Key] != e {
			return &Response{Error: errorf(CodeNotFound, "no attachment %s", e.att.Key)}, nil
		}
	}
	files := e.files
	if len(files) > 0 {
		s.forget(e.att.Key)
	} else {
		var perr *Error
		if files, perr = reopen(&e.att); perr != nil {
			return &Response{Error: perr}, nil
		}
	}
	e.files = nil
	if e.sending == nil {
		e.sending = make(chan struct{})
	}
	att := e.att
	att.Held = 0
	e.att.Held = 0
	s.log.Info("handed off", "attachment", att.Key.String(), "queues", len(files), "pid", cred.Pid, "uid", cred.UID)
	return &Response{Attachment: &att}, files
}

// restore takes back fds a failed send did not deliver.
func (s *Server) restore(resp *Response, files []*os.File) {
	if resp.Attachment == nil || len(files) == 0 {
		closeAll(files)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[resp.Attachment.Key]
	if ok && len(e.files) == 0 {
		e.files, e.att.Held = files, len(files)
		s.keep(e.att.Key, files)
	} else {
		closeAll(files)
	}
	if ok {
		e.doneSending()
	}
}

// sent marks the answer to a fetch delivered and napitapd's copies closed.
func (s *Server) sent(resp *Response) {
	if resp.Attachment == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.held[resp.Attachment.Key]; ok {
		e.doneSending()
	}
}

func (e *entry) doneSending() {
	if e.sending != nil {
		close(e.sending)
		e.sending = nil
	}
}

// find looks an attachment up by key, or by the caller's netns (who).
// napitapd's equal (root) may name any attachment; anyone else finds only those in its own
// netns, and one it may not see is answered as one that does not exist, so
// that a key cannot be probed from another pod.
func (s *Server) find(key *Key, who *identity, root bool) (*entry, *Error) {
	if key != nil {
		if e, ok := s.held[*key]; ok && (root || e.att.NetnsID == who.netnsID) {
			return e, nil
		}
		return nil, errorf(CodeNotFound, "no attachment %s", key)
	}
	var found []*entry
	for _, e := range s.held {
		if e.att.NetnsID == who.netnsID {
			found = append(found, e)
		}
	}
	switch len(found) {
	case 0:
		return nil, errorf(CodeNotFound, "no attachment in the caller's netns")
	case 1:
		return found[0], nil
	}
	return nil, errorf(CodeBadRequest, "%d attachments in the caller's netns: name one", len(found))
}

// napitapdsEqual: the caller is root with napitapd's capabilities in
// napitapd's user namespace (pkg/peer): the plugin, which runs as the
// runtime does, or napitapctl beside napitapd. Only it registers, releases
// and GCs, and names any attachment.
func napitapdsEqual(cred *peer.Process) error {
	if cred.UID != 0 {
		return fmt.Errorf("caller uid %d", cred.UID)
	}
	return cred.Napitapd()
}

// identifyError: a peer that went away is refused; napitapd failing to
// read a live peer is napitapd's failure, and says so.
func identifyError(cred *peer.Process, err error) *Error {
	if errors.Is(err, peer.ErrGone) {
		return errorf(CodeDenied, "pid %d: %v", cred.Pid, err)
	}
	return errorf(CodeInternal, "pid %d: %v", cred.Pid, err)
}

// authorize: napitapd's equal (root) may fetch anything; anyone else only an attachment in
// its own netns, and only if the kernel would let it attach the tap's
// queues itself (tun_not_capable: owner AND group where both are set).
func authorize(att *Attachment, who *identity, root bool) *Error {
	if root {
		return nil
	}
	if who.netnsID != att.NetnsID {
		return errorf(CodeNotFound, "no attachment %s", att.Key)
	}
	if tunperm.MayAttach(who.creds, att.Owner, att.Group) {
		return nil
	}
	return errorf(CodeDenied, "attachment %s: uid %d gid %d may not attach tap %q (owner %s, group %s)",
		att.Key, who.creds.EUID, who.creds.EGID, att.TapName, idText(att.Owner), idText(att.Group))
}

func idText(id *uint32) string {
	if id == nil {
		return "unset"
	}
	return fmt.Sprint(*id)
}

// reopen attaches the attachment's queues afresh in its pod netns, with its
// flags, so a restarted VMM gets NAPI queues again. It refuses while any
// queue is still attached: a second set would take traffic nobody reads.
func reopen(att *Attachment) ([]*os.File, *Error) {
	netns := openSameNetns(att)
	if netns == nil {
		return nil, errorf(CodeUnavailable, "attachment %s: netns %s is gone", att.Key, att.Netns)
	}
	defer netns.Close()
	var files []*os.File
	var perr *Error
	err := netns.Do(func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(att.TapName)
		if err != nil {
			perr = errorf(CodeUnavailable, "attachment %s: tap %q: %v", att.Key, att.TapName, err)
			return nil
		}
		if tap, ok := link.(*netlink.Tuntap); !ok || !markedFor(link, att) {
			perr = errorf(CodeUnavailable, "attachment %s: %q is no longer this attachment's tap", att.Key, att.TapName)
			return nil
		} else if tap.Queues > 0 || tap.DisabledQueues > 0 {
			// A detached queue (TUNSETQUEUE, DESIGN.md fact 3) can come back.
			perr = errorf(CodeBusy, "attachment %s: tap %q still has %d queues attached and %d detached", att.Key, att.TapName, tap.Queues, tap.DisabledQueues)
			return nil
		}
		files, err = tapsetup.OpenQueues(att.TapName, att.Queues, tapsetup.QueueFlags{
			MultiQueue: att.MultiQueue, VnetHdr: att.VnetHdr, NAPI: att.NAPI, NAPIFrags: att.NAPIFrags,
		})
		if errors.Is(err, unix.EBUSY) {
			perr = errorf(CodeBusy, "attachment %s: tap %q: %v", att.Key, att.TapName, err)
			return nil
		}
		return err
	})
	if perr != nil {
		return nil, perr
	}
	if err != nil {
		return nil, errorf(CodeInternal, "attachment %s: reopen queues in netns %s: %v", att.Key, att.Netns, err)
	}
	return files, nil
}

// release forgets the attachments that match and returns how many, with
// their queues for the caller to close. Closing a queue takes rtnl
// (DESIGN.md fact 11), which a burst of DELs keeps busy for seconds: never
// under s.mu, which every request takes.
func (s *Server) release(match func(*Attachment) bool) (n int, closing []*os.File) {
	return s.releaseEntries(func(e *entry) bool { return match(&e.att) })
}

// releaseEntries releases, under the lock, every entry match picks.
func (s *Server) releaseEntries(match func(*entry) bool) (n int, closing []*os.File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, e := range s.held {
		if !match(e) {
			continue
		}
		closing = append(closing, e.files...)
		if len(e.files) > 0 {
			s.forget(key)
		}
		e.doneSending()
		if err := os.Remove(s.statePath(key)); err != nil && !errors.Is(err, os.ErrNotExist) {
			s.log.Error("remove state", "attachment", key.String(), "err", err)
		}
		delete(s.held, key)
		s.log.Info("released", "attachment", key.String())
		n++
	}
	return n, closing
}

func (s *Server) list(cred *peer.Process) []Attachment {
	var netnsID uint64
	root := napitapdsEqual(cred) == nil
	if !root {
		who, err := identify(cred)
		if err != nil {
			s.log.Warn("list: cannot identify the caller", "pid", cred.Pid, "err", err)
			return nil
		}
		netnsID = who.netnsID
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Attachment
	for _, e := range s.held {
		if root || e.att.NetnsID == netnsID {
			att := e.att
			att.Held = len(e.files)
			out = append(out, att)
		}
	}
	slices.SortFunc(out, func(a, b Attachment) int { return strings.Compare(a.Key.String(), b.Key.String()) })
	if root && s.QueueStates != nil {
		// Out of the lock: another pod's VMM pids are for napitapd's
		// equals only.
		for i := range out {
			out[i].QueueStates = s.QueueStates(out[i])
		}
	}
	return out
}

// Sweep releases attachments whose netns or tap is gone: DEL ran while
// napitapd was down, or the runtime crashed and never called DEL. A netns
// path that now holds another netns, or a tap that is not marked as the
// attachment's, counts as gone.
//
// The checks run out of the server's lock: each opens a netns, enters it
// and asks the kernel over rtnetlink, which waits for rtnl, held by every
// ADD's tap creation. Under the lock, a node's 110 of them held up every
// intercepted TUNSETIFF's lookup, fetch, register and list for the whole
// sweep (BenchmarkLookupDuringSweep). An attachment released or
// registered anew meanwhile is another entry, and is not touched.
func (s *Server) Sweep() int {
	s.mu.Lock()
	entries := make([]*entry, 0, len(s.held))
	atts := make([]Attachment, 0, len(s.held))
	for _, e := range s.held {
		entries, atts = append(entries, e), append(atts, e.att)
	}
	s.mu.Unlock()

	gone := map[*entry]bool{}
	nodeTaps := map[*entry]Attachment{}
	for i, e := range entries {
		if g, nodeTap := s.swept(&atts[i]); g {
			gone[e] = true
			if nodeTap {
				nodeTaps[e] = atts[i]
			}
		}
	}
	if len(gone) == 0 {
		return 0
	}
	var released []*entry
	n, closing := s.releaseEntries(func(e *entry) bool {
		if gone[e] {
			released = append(released, e)
		}
		return gone[e]
	})
	closeAll(closing)
	// Out of release's lock: a delete waits for rtnl.
	for _, e := range released {
		if a, ok := nodeTaps[e]; ok {
			if err := s.deleteNodeTap(&a); err != nil {
				s.log.Error("sweep: delete the tap of a pod that is gone", "attachment", a.Key.String(), "tap", a.TapName, "err", err)
			}
		}
	}
	return n
}

// swept says whether a's netns or tap is gone, and whether a's node tap
// is left for the sweep to delete (the pod's netns going does not take it
// along).
func (s *Server) swept(a *Attachment) (gone, deleteNodeTap bool) {
	netns := openSameNetns(a)
	if netns != nil {
		defer netns.Close()
	}
	if a.NodeTap {
		if netns == nil {
			return true, true
		}
		return s.nodeTapGone(a), false
	}
	if netns == nil {
		return true, false
	}
	_ = netns.Do(func(ns.NetNS) error {
		gone = tapGone(a)
		return nil
	})
	return gone, false
}

// checkTap: the attachment's tap is in its netns (the pod's, while the
// path still holds the netns registered; the node's for a NodeTap) and
// carries the attachment's mark. A tap or netns that is gone is
// unavailable; one that is not the attachment's, a bad request.
func (s *Server) checkTap(att *Attachment) *Error {
	path := att.Netns
	if att.NodeTap {
		path = s.NodeNetns
	}
	var perr *Error
	where := func(ns.NetNS) error {
		link, err := netlinksafe.LinkByName(att.TapName)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			perr = errorf(CodeUnavailable, "attachment %s: no tap %q in netns %s", att.Key, att.TapName, path)
		case err != nil:
			perr = errorf(CodeInternal, "attachment %s: tap %q in netns %s: %v", att.Key, att.TapName, path, err)
		case !markedFor(link, att):
			perr = errorf(CodeBadRequest, "attachment %s: tap %q in netns %s is not marked as the attachment's (ifalias %q)", att.Key, att.TapName, path, link.Attrs().Alias)
		}
		return nil
	}
	var err error
	if att.NodeTap {
		err = ns.WithNetNSPath(path, where)
	} else if netns := openSameNetns(att); netns == nil {
		return errorf(CodeUnavailable, "attachment %s: netns %s is gone or changed while it was registered", att.Key, att.Netns)
	} else {
		defer netns.Close()
		err = netns.Do(where)
	}
	if err != nil {
		return errorf(CodeInternal, "attachment %s: netns %s: %v", att.Key, path, err)
	}
	return perr
}

// tapGone: the attachment's tap is not in the current netns, or not marked
// as the attachment's.
func tapGone(a *Attachment) bool {
	link, err := netlinksafe.LinkByName(a.TapName)
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || (err == nil && !markedFor(link, a))
}

// nodeTapGone is tapGone for a tap in the node's netns.
func (s *Server) nodeTapGone(a *Attachment) bool {
	gone := false
	err := ns.WithNetNSPath(s.NodeNetns, func(ns.NetNS) error {
		gone = tapGone(a)
		return nil
	})
	return gone && err == nil
}

// deleteNodeTap deletes the attachment's tap in the node's netns, if it
// still carries the attachment's mark: never another link of the node.
func (s *Server) deleteNodeTap(a *Attachment) error {
	err := ns.WithNetNSPath(s.NodeNetns, func(ns.NetNS) error {
		return tapsetup.DeleteTap(a.TapName, tapsetup.OwnerAlias(a.ContainerID, a.IfName))
	})
	if errors.Is(err, tapsetup.ErrNotTap) {
		return nil
	}
	return err
}

// openSameNetns opens the attachment's netns if its path still holds the
// netns it was registered in, else nil. Checked on the open file, so the
// path cannot change between check and use; fails closed where the kernel
// has no unique netns id.
func openSameNetns(a *Attachment) ns.NetNS {
	netns, err := ns.GetNS(a.Netns)
	if err != nil {
		return nil
	}
	if id, err := tapsetup.NetnsIDOf(int(netns.Fd())); err != nil || a.NetnsID == 0 || id != a.NetnsID {
		netns.Close()
		return nil
	}
	return netns
}

// markedFor: the link carries the attachment's ifalias mark.
func markedFor(link netlink.Link, a *Attachment) bool {
	return link.Attrs().Alias == tapsetup.OwnerAlias(a.ContainerID, a.IfName)
}

// Intercepted finds the intercept-mode attachment whose tap is tapName in
// the netns with id netnsID: a tap whose by-name opens napitapd's seccomp
// agent turns into NAPI ones.
func (s *Server) Intercepted(netnsID uint64, tapName string) (Attachment, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.held {
		if e.att.Intercept && e.att.tapNetnsID() == netnsID && e.att.TapName == tapName {
			return e.att, true
		}
	}
	return Attachment{}, false
}

// Close releases every held fd; the state stays for the next napitapd.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.held {
		closeAll(e.files)
		e.files = nil
		e.doneSending()
	}
}

// AttachmentList is every attachment napitapd records, unordered: what
// napitapd's queue scan looks at.
func (s *Server) AttachmentList() []Attachment {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Attachment, 0, len(s.held))
	for _, e := range s.held {
		out = append(out, e.att)
	}
	return out
}

// Attachments counts the attachments napitapd records.
func (s *Server) Attachments() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// HeldFDs counts the queue fds napitapd holds.
func (s *Server) HeldFDs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, e := range s.held {
		n += len(e.files)
	}
	return n
}

// statePath: ':' is in neither a valid container ID nor an interface name,
// so the file name is unique per key.
func (s *Server) statePath(k Key) string {
	return filepath.Join(s.stateDir, k.ContainerID+":"+k.IfName+".json")
}

func (s *Server) writeState(att *Attachment) error {
	b, err := json.Marshal(att)
	if err != nil {
		return err
	}
	return safefile.WriteAtomic(s.statePath(att.Key), b, 0o600)
}

// OwnStatus is this process's Status.
func OwnStatus() (*Status, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/mnt", &st); err != nil {
		return nil, fmt.Errorf("mount namespace: %w", err)
	}
	return &Status{Pid: os.Getpid(), MountNS: st.Ino, Version: buildinfo.Version()}, nil
}
