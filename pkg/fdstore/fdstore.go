// Package fdstore keeps fds that must outlive napitapd, as systemd's
// FDSTORE does for a service: a small holder process, the napitap-fdstore
// sidecar in napitapd's pod, keeps a copy of each fd napitapd gives it, and
// a napitapd that restarts after a crash (SIGKILL, OOM) gets them all back.
//
// Holding a copy is all it takes, because the kernel keeps an object alive
// while any process has it open: a seccomp user-notification listener held
// open keeps its filter's notifications waiting (instead of failing with
// ENOSYS) until a new napitapd answers them; a listening socket held open
// keeps accepting connections into its backlog; a tun queue held open
// stays attached to its tap, so the tap and its queues outlive napitapd.
//
// The holder knows nothing of what the fds are: an entry is a name, up to
// MaxFDs files and opaque metadata that only napitapd reads.
//
// Transport: a SOCK_SEQPACKET unix socket of mode 0600 (DefaultSocket, in
// an emptyDir the two containers share); the holder answers only peers of
// uid 0. Every message is one datagram holding one JSON object (at most
// MaxMessage bytes, with "version":1) and its fds, if any, as SCM_RIGHTS
// (at most MaxFDs). The client sends requests, and the holder answers each
// in order:
//
//	put   {name, meta} + fds   ok, or error {error}: the entry name now
//	                           holds these fds (the old ones are closed)
//	drop  {names}              ok: those entries are closed and gone
//	list  {files, takeLetGo}   entry {name, meta} (+ its fds if files)
//	                           per entry, then done {count}; with
//	                           takeLetGo, done also carries {letGo,
//	                           letGoDropped}, the calls the holder let go
//	                           on since the last such list, now forgotten
//
// letGo is the one thing the holder tells of its own: the TUNSETIFFs it
// let go on in the kernel while no napitapd was there (pkg/plainqueue),
// each an entry name and the caller's thread, so that the next napitapd
// counts and names them (napitapd_plain_queues_total). A holder that
// predates it ignores takeLetGo, as JSON decoding does an unknown field.
//
// A request of another version, or one the holder refuses (a bad name, too
// much meta, no fds, more fds in all than Holder.MaxFiles), gets error and
// changes nothing. A message the holder cannot read gets error and the
// connection is closed; nothing else is affected.
package fdstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/unixsock"
)

const (
	// Version is the protocol's; it changes rarely, if ever.
	Version = 1
	// DefaultSocket is in an emptyDir shared by napitapd's container and
	// the holder's, so it lives as long as the pod.
	DefaultSocket = "/run/napitap-fdstore/fdstore.sock"
	// DefaultMaxFiles bounds the fds a holder keeps, in all entries.
	DefaultMaxFiles = 65536
	// MaxMessage bounds one message's JSON.
	MaxMessage = 64 << 10
	// MaxFDs is the kernel's SCM_MAX_FD: the most fds one entry holds.
	MaxFDs = handoff.MaxFDs
	// MaxName and MaxMeta bound an entry's name and metadata, in bytes, so
	// that any entry fits in one message.
	MaxName = 256
	MaxMeta = 16 << 10

	// timeout bounds each exchange, so that neither side waits forever on
	// a peer that is wedged.
	timeout = 5 * time.Second
)

// Entry is a named set of files and what napitapd knows of them.
type Entry struct {
	Name  string
	Meta  json.RawMessage // opaque to the holder; may be empty
	Files []*os.File
}

const (
	opPut   = "put"
	opDrop  = "drop"
	opList  = "list"
	opOK    = "ok"
	opError = "error"
	opEntry = "entry"
	opDone  = "done"
)

type message struct {
	Version int             `json:"version"`
	Op      string          `json:"op"`
	Name    string          `json:"name,omitempty"`
	Meta    json.RawMessage `json:"meta,omitempty"`
	Names   []string        `json:"names,omitempty"`
	Files   bool            `json:"files,omitempty"`
	Count   int             `json:"count,omitempty"`
	Error   string          `json:"error,omitempty"`

	TakeLetGo    bool    `json:"takeLetGo,omitempty"`
	LetGo        []LetGo `json:"letGo,omitempty"`
	LetGoDropped int     `json:"letGoDropped,omitempty"`
}

// LetGo is one TUNSETIFF the holder let go on in the kernel, without
// NAPI, while no napitapd was there (Holder.NoteLetGo).
type LetGo struct {
	Entry string    `json:"entry"` // the listener's entry
	Tid   uint32    `json:"tid"`   // the caller's thread
	At    time.Time `json:"at"`
}

// MaxLetGo bounds the let-go calls a holder remembers: with entry names of
// MaxName bytes they still fit in one done message. Older ones are dropped
// and counted (letGoDropped).
const MaxLetGo = 128

// errUnsent: send failed before it wrote anything.
var errUnsent = errors.New("not sent")

// errMalformed: a message that cannot be read as one; the connection is
// out of step and closed.
var errMalformed = errors.New("malformed message")

// send writes m (as Version) with files as one datagram.
func send(c *net.UnixConn, m *message, files []*os.File) error {
	m.Version = Version
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	// Unescaped, meta of MaxMeta bytes stays as long, and fits.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return fmt.Errorf("%w: %w", errUnsent, err)
	}
	if b.Len() > MaxMessage || len(files) > MaxFDs {
		return fmt.Errorf("%w: %s message of %d bytes and %d fds exceeds %d and %d", errUnsent, m.Op, b.Len(), len(files), MaxMessage, MaxFDs)
	}
	oob, err := unixsock.Rights(files)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnsent, err)
	}
	_, _, err = c.WriteMsgUnix(b.Bytes(), oob, nil)
	return err
}

// recv reads one datagram into buf (MaxMessage+1 bytes). The files that
// came are close-on-exec (Go reads with MSG_CMSG_CLOEXEC) and closed on any
// error. io.EOF: the peer hung up. os.NewFile leaves O_NONBLOCK as it is,
// which matters: it is the open file's, shared with every other holder.
func recv(c *net.UnixConn, buf []byte) (*message, []*os.File, error) {
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	files, perr := unixsock.ParseRights(oob[:max(oobn, 0)], "fdstore")
	var m message
	switch {
	case err != nil:
	case perr != nil:
		err = fmt.Errorf("%w: ancillary data: %w", errMalformed, perr)
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > MaxMessage:
		// CTRUNC is also a receiver out of fds.
		err = fmt.Errorf("%w: larger than %d bytes or %d fds, or fds this process could not take", errMalformed, MaxMessage, MaxFDs)
	case n == 0:
		err = io.EOF // SEQPACKET: a 0-byte read is the peer's close
	default:
		if jerr := json.Unmarshal(buf[:n], &m); jerr != nil {
			err = fmt.Errorf("%w: %w", errMalformed, jerr)
		}
	}
	if err != nil {
		closeFiles(files)
		return nil, nil, err
	}
	return &m, files, nil
}

// checkEntry is what the holder refuses to keep; the client checks it too,
// before it sends anything.
func checkEntry(name string, meta []byte, files int) error {
	switch {
	case len(name) == 0 || len(name) > MaxName || !utf8.ValidString(name):
		return fmt.Errorf("a name must be 1 to %d bytes of UTF-8, not %d bytes", MaxName, len(name))
	case len(meta) > MaxMeta:
		return fmt.Errorf("meta of %d bytes exceeds %d", len(meta), MaxMeta)
	case len(meta) > 0 && !json.Valid(meta):
		return errors.New("meta is not JSON")
	case files < 1 || files > MaxFDs:
		return fmt.Errorf("an entry holds 1 to %d fds, not %d", MaxFDs, files)
	}
	return nil
}

// dupFiles copies files into new close-on-exec fds (the same open files).
// It reads each fd through SyscallConn: Fd would make the file blocking.
func dupFiles(files []*os.File) ([]*os.File, error) {
	out := make([]*os.File, 0, len(files))
	for _, f := range files {
		nfd, derr := -1, error(nil)
		rc, err := f.SyscallConn()
		if err == nil {
			err = rc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) })
		}
		if err == nil {
			err = derr
		}
		if err != nil {
			closeFiles(out)
			return nil, fmt.Errorf("dup %s: %w", f.Name(), err)
		}
		out = append(out, os.NewFile(uintptr(nfd), f.Name()))
	}
	return out, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
