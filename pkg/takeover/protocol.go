// Package takeover hands a running napitapd's open files to a new one on
// the same state dir, for an upgrade without loss: its listening sockets
// (which move, so no connection is refused), every seccomp listener and
// every held queue fd, and the state dir's lock.
//
// Transport: SocketName in the state dir (root only, in a directory no
// VM pod mounts), SOCK_SEQPACKET. Each side checks that the other is a
// napitapd (pkg/peer: root with napitapd's capabilities) before it
// says anything: the old one on connect, the new one on accept. Every message is
// one datagram holding one JSON object (at most MaxHeader bytes) with its
// fds, if any, as SCM_RIGHTS (at most MaxFDs):
//
//	new -> old  hello    {versions}       the versions the new one speaks
//	old -> new  refuse   {error}          none in common: the old one serves on
//	old -> new  accept   {version, pid}   the old one stops serving
//	old -> new  files    {items} + fds    one item per fd, in batches
//	old -> new  done     {count}          every fd sent
//	new -> old  ready                     or abort {error}: the old one resumes
//	old -> new  go                        the old one exits; the new one serves
//
// The old napitapd serves nothing from accept on, and again only if the
// exchange fails before go: never are two serving. Version is 1.
package takeover

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/unixsock"
)

const (
	// Version is the protocol this napitapd speaks; a later one that can
	// also speak this lists it in its hello.
	Version = 1
	// SocketName and LockName are in the state dir.
	SocketName = "takeover.sock"
	LockName   = "napitapd.lock"
	// FaultFile, in the state dir, makes a napitapd built with the tag
	// napitap_faults (fault_hook.go) hang up on every takeover request
	// while it exists: the node e2e's rollout that cannot complete. A
	// shipped build has no such hook and ignores the file.
	FaultFile = "refuse-takeover"
	// MaxHeader bounds one message's JSON.
	MaxHeader = 64 << 10
	// MaxFDs is the kernel's SCM_MAX_FD, as handoff.MaxFDs.
	MaxFDs = handoff.MaxFDs
	// batchHeader is where a batch of items stops growing; an item longer
	// than that goes alone. An item with the longest origin the agent
	// writes (seccompagent.MaxOrigin) is far shorter.
	batchHeader = 32 << 10
	// maxItem bounds an item's JSON (fit), leaving a message's other
	// fields room under MaxHeader.
	maxItem = MaxHeader - 1<<10
	// cutOrigin is what fit cuts an Origin to, and maxError bounds a
	// refusal's or abort's message: at most 6 times as many bytes of
	// JSON (\u003c for '<').
	cutOrigin = 512
	maxError  = 4 << 10
)

// Kinds of files.
const (
	KindLock     = "lock"             // the state dir's lock (LockName)
	KindSocket   = "socket"           // a listening socket, Name says which
	KindListener = "seccomp-listener" // UID, Origin and ID as the agent knew them
	KindSlot     = "seccomp-slot"     // the slot of the listener ID (seccompagent.Listener)
	KindQueue    = "queue"            // a held queue of the attachment Key
)

// Item is what the old napitapd knows of a file it hands over.
type Item struct {
	Kind   string       `json:"kind"`
	Name   string       `json:"name,omitempty"`
	UID    uint32       `json:"uid,omitempty"`
	Origin string       `json:"origin,omitempty"`
	ID     string       `json:"id,omitempty"`
	Key    *handoff.Key `json:"key,omitempty"`
	// OwnTaps is a listener's seccompagent.Listener.OwnTaps.
	OwnTaps bool `json:"ownTaps,omitempty"`
	// PodRoot is a listener's seccompagent.Listener.PodRoot. A napitapd
	// older than it counted every uid 0 as napitapd's equal, as its
	// listeners then stay.
	PodRoot bool `json:"podRoot,omitempty"`
}

// File is a file handed over, with what is known of it.
type File struct {
	Item
	File *os.File
}

// CloseAll closes every file.
func CloseAll(files []File) {
	for _, f := range files {
		f.File.Close()
	}
}

const (
	opHello  = "hello"
	opRefuse = "refuse"
	opAccept = "accept"
	opFiles  = "files"
	opDone   = "done"
	opReady  = "ready"
	opAbort  = "abort"
	opGo     = "go"
)

type message struct {
	Version  int    `json:"version"`
	Op       string `json:"op"`
	Versions []int  `json:"versions,omitempty"`
	Error    string `json:"error,omitempty"`
	Items    []Item `json:"items,omitempty"`
	Count    int    `json:"count,omitempty"`
	// Pid is the old napitapd's, in accept: the new one checks that this
	// process holds the other end of its connection and is a napitapd.
	Pid int `json:"pid,omitempty"`
	// Build is the sender's napitapd version (pkg/buildinfo), in hello and
	// accept: each side logs the other's, so a rollout's log says from
	// which version to which.
	Build string `json:"build,omitempty"`
}

// send writes m with files as one datagram.
func send(c *net.UnixConn, m *message, files []*os.File) error {
	m.Version = Version
	m.Error = cut(m.Error, maxError)
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > MaxHeader || len(files) > MaxFDs {
		return fmt.Errorf("takeover: %s message of %d bytes and %d fds exceeds %d and %d", m.Op, len(b), len(files), MaxHeader, MaxFDs)
	}
	oob, err := unixsock.Rights(files)
	if err != nil {
		return err
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// recv reads one datagram and wants one of ops (or refuse or abort, which
// it returns as a *PeerError). Received fds are close-on-exec; on any error they
// are closed. io.EOF: the peer hung up.
func recv(c *net.UnixConn, ops ...string) (*message, []*os.File, error) {
	buf := make([]byte, MaxHeader+1)
	oob := make([]byte, unix.CmsgSpace(MaxFDs*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	files, perr := unixsock.ParseRights(oob[:max(oobn, 0)], "takeover")
	var m message
	switch {
	case err != nil:
	case perr != nil:
		err = fmt.Errorf("takeover: ancillary data: %w", perr)
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > MaxHeader:
		err = fmt.Errorf("takeover: message larger than %d bytes or %d fds", MaxHeader, MaxFDs)
	case n == 0:
		err = io.EOF // SEQPACKET: a 0-byte read is the peer's close
	default:
		if jerr := json.Unmarshal(buf[:n], &m); jerr != nil {
			err = fmt.Errorf("takeover: malformed message: %w", jerr)
		} else if m.Op == opRefuse || m.Op == opAbort {
			err = &PeerError{Op: m.Op, Message: m.Error}
		} else if !slices.Contains(ops, m.Op) {
			err = fmt.Errorf("takeover: got %q, want %q", m.Op, ops)
		} else if len(files) != len(m.Items) {
			err = fmt.Errorf("takeover: %q message names %d files, %d came with it", m.Op, len(m.Items), len(files))
		}
	}
	if err != nil {
		closeFiles(files)
		return nil, nil, err
	}
	return &m, files, nil
}

// PeerError is the other side's refusal (refuse) or abort.
type PeerError struct {
	Op, Message string
}

func (e *PeerError) Error() string { return "takeover: peer answered " + e.Op + ": " + e.Message }

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// sendFiles sends files in batches of at most batchHeader bytes of items,
// or one item alone, then done.
func sendFiles(c *net.UnixConn, files []File) error {
	for start := 0; start < len(files); {
		m, fs, size := &message{Op: opFiles}, []*os.File(nil), 0
		for _, f := range files[start:min(start+MaxFDs, len(files))] {
			item, n, err := fit(f.Item)
			if err != nil {
				return err
			}
			if size += n + 1; size > batchHeader && len(fs) > 0 {
				break
			}
			m.Items = append(m.Items, item)
			fs = append(fs, f.File)
		}
		if err := send(c, m, fs); err != nil {
			return fmt.Errorf("takeover: send files %d-%d of %d: %w", start, start+len(fs), len(files), err)
		}
		start += len(fs)
	}
	return send(c, &message{Op: opDone, Count: len(files)}, nil)
}

// fit returns it as it is sent, with the length of its JSON: an item of
// more than maxItem bytes has its Origin, which only names it in logs,
// cut to cutOrigin bytes, so that one item with a long name (an older
// agent's origins were a sender's, unbounded) cannot fail a takeover.
// What else an item holds napitapd itself bounds.
func fit(it Item) (Item, int, error) {
	b, err := json.Marshal(it)
	if err == nil && len(b) > maxItem {
		it.Origin = cut(it.Origin, cutOrigin)
		b, err = json.Marshal(it)
	}
	return it, len(b), err
}

// cut bounds s to n bytes, cut on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// recvFiles reads batches until done.
func recvFiles(c *net.UnixConn) ([]File, error) {
	var out []File
	for {
		m, files, err := recv(c, opFiles, opDone)
		if err == nil && m.Op == opDone && m.Count != len(out) {
			err = fmt.Errorf("takeover: done after %d files, the old napitapd counts %d", len(out), m.Count)
		}
		if err != nil {
			CloseAll(out)
			return nil, err
		}
		if m.Op == opDone {
			return out, nil
		}
		for i, f := range files {
			out = append(out, File{Item: m.Items[i], File: f})
		}
	}
}
