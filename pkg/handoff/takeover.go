package handoff

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/tapsetup"
)

// What a takeover needs of a Server: the old napitapd stops serving
// (Drain) and hands its queue fds over (TakeHeld); the new one loads the
// same state dir (NewServer) and holds them again (AdoptHeld).

// Drain ends every connection once the request it is serving is answered,
// and returns when all have ended. Call it once Serve has returned. A
// caller whose request was not read yet sees a hang-up, which Client
// retries (on the next napitapd, after a takeover).
func (s *Server) Drain() { s.conns.open.Drain() }

// TakeHeld hands over every queue fd the server holds, per attachment,
// for a takeover: the server holds none afterwards, and Close leaves them
// open. Call it after Drain.
func (s *Server) TakeHeld() map[Key][]*os.File {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[Key][]*os.File{}
	for key, e := range s.held {
		if len(e.files) > 0 {
			out[key] = e.files
			e.files, e.att.Held = nil, 0
		}
	}
	return out
}

// ErrNoState: AdoptHeld was given the queues of an attachment that has no
// state file. A state file is written before its queues reach the fd
// holder and removed after they leave it, so they are those of an
// attachment released while the holder was out of reach, which a crash
// then left there: closed, and dropped from the holder at its next sync.
var ErrNoState = errors.New("not in the state dir: released before a crash")

// AdoptHeld makes the server hold files as the queues of the attachment
// key, which it loaded from the state dir: what TakeHeld of the previous
// napitapd gave. It trusts them only if each is a /dev/net/tun fd attached
// to the attachment's tap in the tap's netns; otherwise it closes them all
// (fetch then reopens the queues). The server owns files either way.
func (s *Server) AdoptHeld(key Key, files []*os.File) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.held[key]
	var err error
	switch {
	case !ok:
		err = fmt.Errorf("attachment %s: %w", key, ErrNoState)
	case e.att.Intercept:
		err = fmt.Errorf("attachment %s: napitapd holds no fds for an intercepted tap", key)
	case len(e.files) > 0:
		err = fmt.Errorf("attachment %s: already holds %d fds", key, len(e.files))
	case len(files) != e.att.Queues:
		err = fmt.Errorf("attachment %s: %d fds for %d queues", key, len(files), e.att.Queues)
	}
	for i := 0; err == nil && i < len(files); i++ {
		err = isQueueOf(files[i], &e.att)
	}
	if err != nil {
		closeAll(files)
		return err
	}
	e.files, e.att.Held = files, len(files)
	s.keep(key, files)
	return nil
}

// isQueueOf: f is /dev/net/tun attached to att's tap in the tap's netns.
// The device is checked first: TUNGETIFF's number means something else to
// another driver.
func isQueueOf(f *os.File, att *Attachment) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return fmt.Errorf("attachment %s: %w", att.Key, err)
	}
	var qerr error
	err = rc.Control(func(fd uintptr) {
		var st unix.Stat_t
		if err := unix.Fstat(int(fd), &st); err != nil {
			qerr = err
			return
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != 10 || unix.Minor(st.Rdev) != 200 {
			qerr = fmt.Errorf("not /dev/net/tun")
			return
		}
		ifr, err := unix.NewIfreq("")
		if err != nil {
			qerr = err
			return
		}
		if err := unix.IoctlIfreq(int(fd), unix.TUNGETIFF, ifr); err != nil {
			qerr = fmt.Errorf("TUNGETIFF: %w", err)
			return
		}
		if ifr.Name() != att.TapName {
			qerr = fmt.Errorf("a queue of %q", ifr.Name())
			return
		}
		nsfd, err := unix.IoctlRetInt(int(fd), unix.TUNGETDEVNETNS)
		if err != nil {
			qerr = fmt.Errorf("TUNGETDEVNETNS: %w", err)
			return
		}
		defer unix.Close(nsfd)
		if id, err := tapsetup.NetnsIDOf(nsfd); err != nil || id != att.tapNetnsID() {
			qerr = fmt.Errorf("tap %q in another netns (%d, want %d): %v", ifr.Name(), id, att.tapNetnsID(), err)
		}
	})
	if err == nil {
		err = qerr
	}
	if err != nil {
		return fmt.Errorf("attachment %s: fd is not a queue of tap %q: %w", att.Key, att.TapName, err)
	}
	return nil
}
