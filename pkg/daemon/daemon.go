// Package daemon is napitapd: it serves the hand-off socket (pkg/handoff)
// and the seccomp agent's (pkg/seccompagent) from one state dir, sweeps
// attachments that are gone, and takes everything over from a running
// napitapd on the same paths or hands everything over to a new one
// (pkg/takeover).
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/napitap/napitap/pkg/buildinfo"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/metrics"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/takeover"
	"github.com/napitap/napitap/pkg/unixsock"
)

// Config is what napitapd serves, and where.
type Config struct {
	Socket        string // the hand-off socket
	SeccompSocket string // the seccomp agent's; empty: no agent
	StateDir      string
	SocketMode    os.FileMode // of both sockets
	SocketGID     int         // owner group of both sockets; -1: root's
	Sweep         time.Duration
	Limits        handoff.Limits
	// FDStore is the socket of the fd holder (pkg/fdstore) that keeps
	// copies of napitapd's files through a crash; empty: none.
	FDStore string
	// WaitAfterTakeover: once a new napitapd has taken everything over,
	// hold nothing and wait for stop instead of returning (in a pod, the
	// kubelet restarts a container that exits, and its napitapd would take
	// everything back).
	WaitAfterTakeover bool
	// SuccessorWait: on stop, serve on for up to this long for a new
	// napitapd to take everything over, and stop only if none does (a
	// deleted DaemonSet pod, whose replacement the controller starts while
	// it terminates). Zero: stop at once.
	SuccessorWait time.Duration
	// Metrics records what napitapd does (pkg/metrics); nil: nothing.
	Metrics *metrics.Metrics
	// QueueScan: how often to read the queues of napitap's taps from the
	// kernel, to find those opened without reaching the agent (queueBook);
	// zero: never.
	QueueScan time.Duration
}

// Run serves o until stop (SIGTERM) or, after a takeover, until the new
// napitapd has everything. One napitapd per state dir: the first takes its
// lock; a later one takes everything over from it, or waits for it to exit.
func Run(logger *slog.Logger, o Config, stop <-chan os.Signal) error {
	defer o.Metrics.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	returned := make(chan struct{})
	defer close(returned)
	stop = relay(stop, cancel, returned)
	lock, offer, err := takeover.Acquire(ctx, o.StateDir, o.Socket, logger)
	if err != nil {
		return err
	}
	files := []takeover.File{{Item: takeover.Item{Kind: takeover.KindLock}, File: lock}}
	recovered := false
	if offer != nil {
		files = offer.Files
	} else if o.FDStore != "" {
		held, err := recoverFiles(o.FDStore, logger)
		if err != nil {
			takeover.CloseAll(files)
			return err
		}
		files = append(files, held...)
		recovered = len(held) > 0
	}
	d := newDaemon(o, logger)
	if err := d.prepare(files); err != nil {
		if offer != nil {
			offer.Decline(err)
			return fmt.Errorf("taking over: %w", err)
		}
		takeover.CloseAll(files)
		return err
	}
	if d.store != nil {
		// Before answering anyone, and before the old napitapd of a
		// takeover lets go: killed right after, this one leaves it all
		// in the holder.
		if err := d.store.m.Sync(); err != nil {
			logger.Error("fd holder: not synced; a crash before it is back loses the listeners and held queues", "err", err)
		}
	}
	if offer != nil {
		if err := offer.Accept(); err != nil {
			d.discard()
			takeover.CloseAll(files)
			return err
		}
	}
	takeover.CloseAll(files)
	d.serve()
	took, from := "", ""
	if offer != nil {
		took, from = time.Since(offer.Asked).String(), offer.From
		o.Metrics.TookOver(time.Since(offer.Asked))
	} else if recovered {
		o.Metrics.Recovered()
	}
	o.Metrics.Watch(metrics.Sources{Attachments: d.srv.Attachments, HeldQueues: d.srv.HeldFDs, Listeners: func() int {
		if d.agent == nil {
			return 0
		}
		return d.agent.Listeners()
	}})
	logger.Info("serving", "version", buildinfo.Version(), "socket", o.Socket, "state", o.StateDir, "seccomp-socket", o.SeccompSocket,
		"maxConns", o.Limits.MaxConns, "maxConnsPerUID", o.Limits.MaxConnsPerUID, "tookOver", offer != nil, "took", took, "previous_version", from)

	select {
	case <-stop:
		if o.SuccessorWait <= 0 {
			return d.stop()
		}
		return d.awaitSuccessor(stop)
	case <-d.handed:
		o.Metrics.Stop() // the next napitapd reports from now on
		if o.WaitAfterTakeover {
			// A DaemonSet's old pod during a maxSurge rollout: exiting would
			// restart this container, and the restarted napitapd would take
			// everything back from the new pod's. The controller deletes
			// this pod once the new one is ready; SIGTERM then finds
			// nothing to stop.
			logger.Info("handed everything over to the next napitapd; holding nothing, waiting for SIGTERM")
			<-stop
		}
		return nil
	case err := <-d.failed:
		return err
	}
}

// awaitSuccessor is stop's first signal with Config.SuccessorWait set:
// everything goes to a napitapd that takes over meanwhile, and napitapd
// stops as without it once the wait ends or a second signal comes.
func (d *daemon) awaitSuccessor(stop <-chan os.Signal) error {
	wait := d.o.SuccessorWait
	d.log.Info("asked to stop: serving on until a new napitapd takes everything over (a deleted pod's replacement), or stopping after the wait", "wait", wait)
	start := time.Now()
	select {
	case <-d.handed:
		d.log.Info("handed everything over to the next napitapd after the stop signal; exiting", "after", time.Since(start).String())
		return nil
	case err := <-d.failed:
		return err
	case <-time.After(wait):
		d.log.Info("no napitapd took over; stopping", "waited", wait.String())
	case <-stop:
		d.log.Info("asked to stop again: stopping now", "waited", time.Since(start).String())
	}
	return d.stop()
}

// relay passes on every signal from stop, after calling onSignal, until
// done is closed. A SIGTERM while Acquire waits for the lock must end the
// wait, yet still stop the napitapd that then serves: taken from stop by
// a watcher of Acquire alone, it was lost, and napitapd served on.
func relay(stop <-chan os.Signal, onSignal func(), done <-chan struct{}) <-chan os.Signal {
	out := make(chan os.Signal, 1)
	go func() {
		for {
			select {
			case s := <-stop:
				onSignal()
				select {
				case out <- s:
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	}()
	return out
}

// holderWait is how long a napitapd starting without a takeover waits for
// the fd holder: the kubelet starts the holder's container first, but it
// may not listen yet.
const holderWait = 5 * time.Second

// recoverFiles gets back from the fd holder what a napitapd that died
// left there: the holder keeps its copies until the new napitapd's first
// sync drops what it did not take. With no holder there is nothing to
// get back; a holder that does not answer may hold everything, and a
// napitapd that served afresh would drop it at its first sync: better to
// exit, and let the kubelet restart it.
func recoverFiles(path string, log *slog.Logger) ([]takeover.File, error) {
	entries, err := fdstore.Recover(path, holderWait)
	if errors.Is(err, fdstore.ErrNoHolder) {
		log.Warn("fd holder: none; serving afresh", "socket", path, "err", err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fd holder %s: %w", path, err)
	}
	files, skipped := filesOf(entries)
	if len(skipped) > 0 {
		log.Warn("fd holder: entries napitapd does not know are left out", "entries", skipped)
	}
	log.Info("fd holder: recovered what the previous napitapd held", "entries", len(entries), "files", len(files))
	return files, nil
}

// Socket names in a takeover.
const (
	sockHandoff  = "handoff"
	sockSeccomp  = "seccomp"
	sockTakeover = "takeover"
)

// daemon is napitapd's open files and what serves them. It is built from
// files (prepare): those a takeover handed over, or only the state dir's
// lock on a fresh start; serve starts serving, and a takeover's Detach
// gives them all back as files.
type daemon struct {
	o    Config
	mode os.FileMode
	gid  int
	log  *slog.Logger

	// mu is held from a takeover's Detach to its Handed or Resume, so that
	// a SIGTERM waits for the outcome.
	mu         sync.Mutex
	lock       *os.File
	srv        *handoff.Server
	agent      *seccompagent.Agent // nil without --seccomp-socket
	listeners  []seccompagent.Listener
	hl, sl, tl *net.UnixListener
	hDone      chan error
	sDone      chan struct{}
	sweepStop  chan struct{}
	sweepDone  chan struct{}

	handed chan struct{} // closed once a takeover handed everything over
	failed chan error    // a failed takeover could not serve again

	store      *holderStore // nil without Config.FDStore
	storeStart sync.Once
	book       *queueBook

	// abort, which every server takes, is done StopGrace after stop
	// begins (cutOff): the one bound on what peers hold open.
	abort  context.Context
	cutOff context.CancelFunc
}

// StopGrace bounds how long a stop waits for what peers hold open: a
// takeover in progress (a napitapd's takes a few hundred ms) and a
// seccomp socket sender that has not sent yet (runc sends at once).
// Then every connection of every server is cut off, and a takeover in
// progress fails: the old napitapd resumes, and stops.
const StopGrace = 2 * time.Second

func newDaemon(o Config, logger *slog.Logger) *daemon {
	d := &daemon{o: o, mode: o.SocketMode, gid: o.SocketGID, log: logger, handed: make(chan struct{}), failed: make(chan error, 1)}
	d.abort, d.cutOff = context.WithCancel(context.Background())
	d.book = newQueueBook(logger, o.Metrics)
	if o.FDStore != "" {
		d.store = &holderStore{m: fdstore.NewMirror(o.FDStore, logger.With("fdstore", o.FDStore)), book: d.book}
		d.store.m.OnLetGo = d.book.letGo
	}
	return d
}

// prepare builds everything from files without serving yet. It keeps
// copies of what it uses: the caller closes files, whatever the outcome.
// A listening socket handed over is used as is (it moves, it is never
// rebound); one missing is made.
func (d *daemon) prepare(files []takeover.File) (err error) {
	defer func() {
		if err != nil {
			d.discard()
		}
	}()
	sockets := map[string]*os.File{}
	queues := map[handoff.Key][]*os.File{}
	slots := map[string]*os.File{}
	var keys []handoff.Key
	d.listeners = nil
	for _, f := range files {
		switch f.Kind {
		case takeover.KindLock:
			if d.lock, err = dup(f.File); err != nil {
				return fmt.Errorf("the state dir's lock: %w", err)
			}
		case takeover.KindSocket:
			sockets[f.Name] = f.File
		case takeover.KindListener:
			c, err := dup(f.File)
			if err != nil {
				d.log.Error("takeover: a seccomp listener is lost", "listener", f.Origin, "err", err)
				continue
			}
			d.listeners = append(d.listeners, seccompagent.Listener{File: c, UID: f.UID, PodRoot: f.PodRoot, Origin: f.Origin, ID: f.ID, OwnTaps: f.OwnTaps})
		case takeover.KindSlot:
			if f.ID != "" {
				slots[f.ID] = f.File
			}
		case takeover.KindQueue:
			if f.Key == nil {
				continue
			}
			if _, ok := queues[*f.Key]; !ok {
				keys = append(keys, *f.Key)
			}
			queues[*f.Key] = append(queues[*f.Key], f.File)
		}
	}
	if d.lock == nil {
		return errors.New("no lock of the state dir")
	}
	for i, l := range d.listeners {
		if slot := slots[l.ID]; slot != nil && l.ID != "" {
			// Without its slot the listener is still served; only a
			// notification its last holder received unanswered is lost.
			d.listeners[i].Slot, _ = dup(slot)
		}
	}
	if d.srv, err = handoff.NewServer(d.o.StateDir, d.log); err != nil {
		return err
	}
	d.srv.Limits = d.o.Limits
	if d.o.Metrics != nil {
		d.srv.Observe = d.o.Metrics.Request
	}
	d.srv.QueueStates = d.book.states
	d.srv.Filtered = func() []string {
		if d.agent == nil {
			return []string{}
		}
		return d.agent.Origins()
	}
	var agentStore seccompagent.Store
	if d.store != nil {
		d.srv.Store, agentStore = d.store, d.store
	}
	for _, key := range keys {
		var own []*os.File
		for _, q := range queues[key] {
			if c, err := dup(q); err == nil {
				own = append(own, c)
			}
		}
		switch err := d.srv.AdoptHeld(key, own); {
		case errors.Is(err, handoff.ErrNoState):
			d.log.Info("takeover: held queues of a released attachment closed", "err", err)
		case err != nil:
			d.log.Warn("takeover: held queues not taken; a fetch reopens them", "err", err)
		}
	}
	if d.hl, err = listener(sockets[sockHandoff], d.o.Socket, func() (*net.UnixListener, error) {
		return handoff.Listen(d.o.Socket, d.mode, d.gid)
	}); err != nil {
		return err
	}
	// A socket taken over keeps its file: this napitapd's --socket-mode
	// and --socket-group are applied to it (a rollout that changes them).
	if err := unixsock.Apply(d.o.Socket, d.mode, d.gid); err != nil {
		return err
	}
	if d.o.SeccompSocket != "" {
		if d.sl, err = listener(sockets[sockSeccomp], d.o.SeccompSocket, func() (*net.UnixListener, error) {
			return seccompagent.Listen(d.o.SeccompSocket, d.mode, d.gid)
		}); err != nil {
			return err
		}
		if err := unixsock.Apply(d.o.SeccompSocket, d.mode, d.gid); err != nil {
			return err
		}
		opts := seccompagent.Options{Store: agentStore, OnQueue: d.book.agentEvent}
		if d.o.Metrics != nil {
			opts.Observe = d.o.Metrics.TUNSETIFF
		}
		if d.agent, err = seccompagent.New(agentRegistry(d.srv), d.log, opts); err != nil {
			return err
		}
	}
	if d.tl, err = listener(sockets[sockTakeover], takeover.Socket(d.o.StateDir), func() (*net.UnixListener, error) {
		return takeover.Listen(d.o.StateDir)
	}); err != nil {
		return err
	}
	if d.store != nil {
		// The held queues are in already (AdoptHeld); the agent adopts
		// the listeners only once serving, and keeps them again then.
		for _, l := range d.listeners {
			if l.ID != "" {
				d.store.Keep(l)
			}
		}
		for _, s := range d.sockets() {
			if err := d.store.keepSocket(s.name, s.l); err != nil {
				d.log.Error("fd holder: a crash would refuse connections until napitapd is back", "err", err)
			}
		}
	}
	return nil
}

// namedSocket is a listening socket by its name in a takeover.
type namedSocket struct {
	name string
	l    *net.UnixListener
}

// sockets are those napitapd listens on: the seccomp one only with an
// agent.
func (d *daemon) sockets() []namedSocket {
	var out []namedSocket
	for _, s := range []namedSocket{{sockHandoff, d.hl}, {sockSeccomp, d.sl}, {sockTakeover, d.tl}} {
		if s.l != nil {
			out = append(out, s)
		}
	}
	return out
}

// listener wraps a copy of inherited if it is the socket at path, else
// makes one with listen. A socket whose path is gone (the fd holder's,
// after someone removed the file) would take connections nobody can make.
func listener(inherited *os.File, path string, listen func() (*net.UnixListener, error)) (*net.UnixListener, error) {
	if _, err := os.Lstat(path); inherited == nil || err != nil {
		return listen()
	}
	l, err := net.FileListener(inherited) // a copy
	if err != nil {
		return nil, fmt.Errorf("socket %s handed over: %w", path, err)
	}
	if ul, ok := l.(*net.UnixListener); ok && ul.Addr().String() == path {
		return ul, nil
	}
	l.Close()
	return listen() // the old one served another path
}

// discard closes what prepare made, and leaves the socket paths alone:
// they may be the old napitapd's.
func (d *daemon) discard() {
	for _, s := range d.sockets() {
		s.l.SetUnlinkOnClose(false)
		s.l.Close()
	}
	for _, l := range d.listeners {
		l.File.Close()
		if l.Slot != nil {
			l.Slot.Close()
		}
	}
	if d.srv != nil {
		d.srv.Close()
	}
	if d.lock != nil {
		d.lock.Close()
	}
	d.hl, d.sl, d.tl, d.listeners, d.srv, d.lock, d.agent = nil, nil, nil, nil, nil, nil, nil
}

// serve starts serving what prepare built.
func (d *daemon) serve() {
	if d.agent != nil {
		seccompagent.CheckCapabilities(d.log)
		for _, l := range d.listeners {
			if err := d.agent.Adopt(l); err != nil {
				d.log.Error("takeover: a seccomp listener is lost: its processes get ENOSYS for TUNSETIFF", "listener", l.Origin, "err", err)
				if d.store != nil && l.ID != "" {
					d.store.Forget(l.ID) // or they would wait for ever
				}
			}
		}
		d.sDone = make(chan struct{})
		go func(ss *seccompagent.Server, l *net.UnixListener, done chan struct{}) {
			defer close(done)
			if err := ss.Serve(d.abort, l); err != nil {
				d.log.Error("seccomp socket", "path", d.o.SeccompSocket, "err", err)
			}
		}(seccompagent.NewServer(d.agent, d.log, seccompagent.Limits{}), d.sl, d.sDone)
	}
	if d.agent == nil {
		// No agent to serve them (--seccomp-socket turned off): the
		// processes under them get ENOSYS, not a wait for ever.
		for _, l := range d.listeners {
			l.File.Close()
			if l.Slot != nil {
				l.Slot.Close()
			}
			if d.store != nil && l.ID != "" {
				d.store.Forget(l.ID)
			}
		}
	}
	d.listeners = nil
	if d.store != nil {
		d.storeStart.Do(d.store.m.Start)
	}
	d.hDone = make(chan error, 1)
	go func(srv *handoff.Server, l *net.UnixListener, done chan error) { done <- srv.Serve(d.abort, l) }(d.srv, d.hl, d.hDone)
	go func(l *net.UnixListener) {
		if err := takeover.Serve(d.abort, l, d, d.log); err != nil {
			d.log.Error("takeover socket", "err", err)
		}
	}(d.tl)
	d.sweepStop, d.sweepDone = make(chan struct{}), make(chan struct{})
	go func(srv *handoff.Server, stop, done chan struct{}) {
		defer close(done)
		t := time.NewTicker(d.o.Sweep)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if n := srv.Sweep(); n > 0 {
					d.log.Info("swept attachments whose pod is gone", "count", n)
				}
			}
		}
	}(d.srv, d.sweepStop, d.sweepDone)
	if d.o.QueueScan > 0 {
		go func(srv *handoff.Server, stop chan struct{}) {
			// At once: what is open at the start is what this napitapd
			// cannot vouch for (queueBook).
			for t := time.NewTimer(0); ; t.Reset(d.o.QueueScan) {
				select {
				case <-stop:
					t.Stop()
					return
				case <-t.C:
					d.book.scan(srv.AttachmentList())
				}
			}
		}(d.srv, d.sweepStop)
	}
}

// Detach stops serving, closing nothing, and returns every open file
// for the next napitapd (takeover.Handler). Connections in the sockets'
// backlogs stay there for it: the sockets move, they are not closed.
func (d *daemon) Detach() []takeover.File {
	d.mu.Lock()
	close(d.sweepStop)
	<-d.sweepDone
	var files []takeover.File
	add := func(item takeover.Item, f *os.File) { files = append(files, takeover.File{Item: item, File: f}) }
	add(takeover.Item{Kind: takeover.KindLock}, d.lock)
	for _, s := range d.sockets() {
		f, err := s.l.File()
		if err != nil {
			d.log.Error("takeover: the next napitapd binds this socket anew", "socket", s.l.Addr().String(), "err", err)
		} else {
			add(takeover.Item{Kind: takeover.KindSocket, Name: s.name}, f)
		}
		// Stops the accept loop and leaves the path to the next one.
		s.l.SetUnlinkOnClose(false)
		s.l.Close()
	}
	if err := <-d.hDone; err != nil {
		d.log.Error("serve", "err", err)
	}
	if d.sDone != nil {
		<-d.sDone // and the connections it accepted: their listeners are in the agent
	}
	d.srv.Drain()
	if d.agent != nil {
		for _, l := range d.agent.Detach() {
			add(takeover.Item{Kind: takeover.KindListener, UID: l.UID, PodRoot: l.PodRoot, Origin: l.Origin, ID: l.ID, OwnTaps: l.OwnTaps}, l.File)
			if l.Slot != nil {
				add(takeover.Item{Kind: takeover.KindSlot, ID: l.ID}, l.Slot)
			}
		}
	}
	held := d.srv.TakeHeld()
	keys := make([]handoff.Key, 0, len(held))
	for k := range held {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b handoff.Key) int { return cmp.Compare(a.String(), b.String()) })
	for _, k := range keys {
		for _, q := range held[k] {
			add(takeover.Item{Kind: takeover.KindQueue, Key: &k}, q)
		}
	}
	d.hl, d.sl, d.tl, d.lock = nil, nil, nil, nil
	return files
}

// Resume serves files again after a failed takeover.
func (d *daemon) Resume(files []takeover.File) {
	defer d.mu.Unlock()
	d.srv.Close() // holds nothing now: TakeHeld
	err := d.prepare(files)
	takeover.CloseAll(files)
	if err != nil {
		d.failed <- fmt.Errorf("serving again after a failed takeover: %w", err)
		return
	}
	d.serve()
}

// Handed: the next napitapd serves everything; this one closes its copies
// and exits 0.
func (d *daemon) Handed(files []takeover.File) {
	defer d.mu.Unlock()
	takeover.CloseAll(files)
	d.srv, d.agent = nil, nil
	if d.store != nil {
		// The next napitapd keeps everything in its own pod's holder; this
		// pod's would keep queues attached that nobody reads.
		d.store.m.Clear()
		d.store.m.Close()
	}
	close(d.handed)
}

// stop is SIGTERM's: stop serving, close every fd and remove the sockets.
// The processes under the agent's listeners get ENOSYS for TUNSETIFF from
// then on; the state stays for the next napitapd. With an fd holder, the
// holder's copies and the socket paths stay too: the kubelet restarts a
// container whose liveness probe fails with SIGTERM, and the next
// napitapd takes everything from the holder. If the whole pod goes, the
// holder goes with it and the kernel closes the files.
func (d *daemon) stop() error {
	defer time.AfterFunc(StopGrace, func() {
		d.log.Warn("stopping: cutting off the peers that did not finish in time", "grace", StopGrace)
		d.cutOff()
	}).Stop()
	// A takeover in progress holds d.mu from Detach to Handed or Resume.
	d.mu.Lock()
	defer d.mu.Unlock()
	select {
	case <-d.handed:
		return nil
	default:
	}
	if d.hl == nil {
		return nil
	}
	close(d.sweepStop)
	keepPaths := d.store != nil
	for _, s := range d.sockets() {
		s.l.SetUnlinkOnClose(!keepPaths)
	}
	d.hl.Close()
	err := <-d.hDone
	d.srv.Close()
	if d.sl != nil {
		d.sl.Close()
		<-d.sDone
		d.agent.Close()
	}
	d.tl.Close()
	if keepPaths {
		d.store.m.Close()
	} else {
		os.Remove(d.o.SeccompSocket)
		os.Remove(takeover.Socket(d.o.StateDir))
		os.Remove(d.o.Socket)
	}
	d.lock.Close()
	return err
}

// dup is a close-on-exec copy of f's fd.
func dup(f *os.File) (*os.File, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, os.NewSyscallError("fcntl", derr)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
