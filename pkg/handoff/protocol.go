// Package handoff is the wire protocol between napitap, napitapd and VM
// runtimes: who holds a tap's NAPI queue fds, and how they change hands.
//
// Transport: an AF_UNIX SOCK_SEQPACKET socket. Every request and every
// response is one datagram holding one JSON object (at most MaxHeader bytes)
// with the fds, if any, as SCM_RIGHTS ancillary data of that same datagram
// (at most MaxFDs). A connection carries any number of request/response
// pairs, in order. Version is 1; a peer speaking another version gets an
// error response, never a guess.
package handoff

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/napitap/napitap/pkg/tapsetup"
)

const (
	Version   = 1
	MaxHeader = 64 << 10
	// MaxFDs is the kernel's SCM_MAX_FD: one sendmsg carries no more, so a
	// handed-off tap has at most 253 of its 256 possible queues (an
	// intercepted one, whose fds napitapd never holds, may have all 256).
	MaxFDs = 253

	DefaultSocket = "/run/napitap/napitapd.sock"
	// DefaultStateDir is napitapd's alone, outside DefaultSocket's dir,
	// which VM pods mount: it holds the attachments, the lock and the
	// takeover socket (docs/threat-model.md).
	DefaultStateDir = "/run/napitapd/state"
)

// Operations.
const (
	OpRegister = "register" // napitap ADD: keep these queues (root only)
	OpFetch    = "fetch"    // a runtime: give me the queues
	OpRelease  = "release"  // napitap DEL: forget the attachment (root only)
	OpGC       = "gc"       // napitap GC: forget all but the valid ones (root only)
	OpList     = "list"     // what is held (root: all; others: their netns)
	OpStatus   = "status"   // which napitapd answers (anyone)
)

// Key names an attachment the way CNI does.
type Key struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

func (k Key) String() string { return k.ContainerID + "/" + k.IfName }

// validContainerID: what CNI allows (letters, digits, '_', '.', '-', not
// starting with a punctuation mark), which also makes it safe in a file
// name. No regexp: compiling one costs every exec of the plugin 1 ms.
func validContainerID(id string) bool {
	if id == "" || len(id) > 254 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || (c != '_' && c != '.' && c != '-')) {
			return false
		}
	}
	return true
}

// Validate keeps keys safe to use in file names and logs.
func (k Key) Validate() error {
	if !validContainerID(k.ContainerID) {
		return fmt.Errorf("containerID %q: want letters, digits, '_', '.', '-'", k.ContainerID)
	}
	if err := tapsetup.ValidateLinkName(k.IfName); err != nil {
		return fmt.Errorf("ifName: %w", err)
	}
	return nil
}

// Attachment is what a VMM needs to know about a tap besides its fds.
type Attachment struct {
	Key
	Network     string  `json:"network,omitempty"`
	Netns       string  `json:"netns"`
	TapName     string  `json:"tapName"`
	Queues      int     `json:"queues"`
	MultiQueue  bool    `json:"multiQueue"`
	NAPI        bool    `json:"napi"`
	NAPIFrags   bool    `json:"napiFrags,omitempty"`
	VnetHdr     bool    `json:"vnetHdr"`
	VnetHdrSize int     `json:"vnetHdrSize,omitempty"`
	MAC         string  `json:"mac,omitempty"` // the MAC the guest must use
	MTU         int     `json:"mtu,omitempty"`
	Owner       *uint32 `json:"owner,omitempty"`
	Group       *uint32 `json:"group,omitempty"`
	// How the tap is wired to CNI_IFNAME, so GC can undo it after a
	// runtime that never called DEL.
	Wiring string `json:"wiring,omitempty"`
	Bridge string `json:"bridge,omitempty"`
	// Intercept: napitapd holds no queues; the runtime opens the tap by
	// name and napitapd's seccomp agent turns that open into a NAPI one.
	Intercept bool `json:"intercept,omitempty"`
	// NodeTap: the tap is in the node's netns, not the pod's, for Kata
	// runtime-rs, which looks a DAN tap up there (DESIGN.md fact 18).
	// TapNetnsID is the id of the netns the plugin made it in, which
	// napitapd requires to be its own: it serves the tap there.
	NodeTap    bool   `json:"nodeTap,omitempty"`
	TapNetnsID uint64 `json:"tapNetnsID,omitempty"`

	// Set by napitapd: the netns's unique id (tapsetup.NetnsID), never an
	// inode, which the kernel reuses.
	NetnsID uint64 `json:"netnsID,omitempty"`
	Held    int    `json:"held"` // queue fds napitapd holds right now
	// QueueStates is what napitapd knows of each open queue of the tap,
	// as of its last scan, in list's answer to napitapd's equals alone.
	QueueStates []QueueState `json:"queueStates,omitempty"`
}

// QueueState is napitapd's record of one open queue of an attachment's
// tap: whether napitapd attached it with IFF_NAPI, knows it plain, or
// cannot tell. The kernel shows no queue's own NAPI (docs/DESIGN.md fact
// 2): this is what napitapd did or was told, not what the kernel says.
type QueueState struct {
	PID int `json:"pid"` // the process holding it
	FD  int `json:"fd"`
	// NAPI is one of QueueNAPI, QueuePlain, QueueUnknown.
	NAPI string `json:"napi"`
	// Reason is napitapd_plain_queues_total's, for a plain queue counted
	// there; Why says more.
	Reason string    `json:"reason,omitempty"`
	Why    string    `json:"why,omitempty"`
	Since  time.Time `json:"since"` // when napitapd learnt it
}

// QueueState.NAPI's values.
const (
	QueueNAPI    = "napi"    // napitapd attached it with IFF_NAPI, or opened it so (fds)
	QueuePlain   = "plain"   // attached without IFF_NAPI, napitapd knows why
	QueueUnknown = "unknown" // there before this napitapd started, or not yet scanned
)

// tapNetnsID is the id of the netns the tap is in.
func (a *Attachment) tapNetnsID() uint64 {
	if a.NodeTap {
		return a.TapNetnsID
	}
	return a.NetnsID
}

// Validate checks what napitapd will act on.
func (a *Attachment) Validate() error {
	if err := a.Key.Validate(); err != nil {
		return err
	}
	if a.Netns == "" || a.Netns[0] != '/' {
		return fmt.Errorf("attachment %s: netns %q is not an absolute path", a.Key, a.Netns)
	}
	if err := tapsetup.ValidateLinkName(a.TapName); err != nil {
		return fmt.Errorf("attachment %s: tapName: %w", a.Key, err)
	}
	// napitapd holds no fds for an intercepted tap: the only bound is the
	// kernel's.
	maxQueues := MaxFDs
	if a.Intercept {
		maxQueues = tapsetup.MaxQueues
	}
	if a.Queues < 1 || a.Queues > maxQueues {
		return fmt.Errorf("attachment %s: queues %d out of range 1-%d", a.Key, a.Queues, maxQueues)
	}
	if a.Queues > 1 && !a.MultiQueue {
		return fmt.Errorf("attachment %s: %d queues on a single-queue tap", a.Key, a.Queues)
	}
	if a.NodeTap && !a.Intercept {
		return fmt.Errorf("attachment %s: a tap in the node's netns is the runtime's to open by name: intercept only", a.Key)
	}
	return nil
}

// Request is one client datagram.
type Request struct {
	Version    int         `json:"version"`
	Op         string      `json:"op"`
	Key        *Key        `json:"key,omitempty"`        // fetch, release
	Attachment *Attachment `json:"attachment,omitempty"` // register
	Network    string      `json:"network,omitempty"`    // gc
	Valid      []Key       `json:"valid,omitempty"`      // gc
	Offset     int         `json:"offset,omitempty"`     // list: page start
}

// Response is one server datagram. Error is nil on success.
type Response struct {
	Version     int          `json:"version"`
	Error       *Error       `json:"error,omitempty"`
	Attachment  *Attachment  `json:"attachment,omitempty"`  // fetch; its fds ride along
	Attachments []Attachment `json:"attachments,omitempty"` // list, a page of them
	More        bool         `json:"more,omitempty"`        // list: ask again from offset+len
	Released    int          `json:"released,omitempty"`    // release, gc
	Status      *Status      `json:"status,omitempty"`      // status
}

// Status says which napitapd answers: after a takeover, or while a new
// one waits to take over, the socket's path is served by whichever
// napitapd holds the socket, in whichever container.
type Status struct {
	Pid int `json:"pid"` // in napitapd's pid namespace (the host's, in the DaemonSet)
	// MountNS is the inode of napitapd's mount namespace: a process in
	// napitapd's container (a probe) compares it with its own.
	MountNS uint64 `json:"mountNS"`
	// Version is napitapd's (pkg/buildinfo); empty from one older than it.
	Version string `json:"version,omitempty"`
	// Filter: the containers under napitap's seccomp filter whose
	// listener napitapd serves, for napitapd's equals only (it names
	// pods); nil for others and from a napitapd older than it.
	Filter *FilterStatus `json:"filter,omitempty"`
}

// FilterStatus is what napitapd's seccomp agent serves: one listener per
// container (or napitapctl launch tree) whose processes are under the
// filter. Each of those processes gets ENOSYS for TUNSETIFF once no
// process holds its listener (napitap removed from the node).
type FilterStatus struct {
	Listeners []string `json:"listeners"` // each one's origin: pod and container, or the launcher
}

// ListPage is how many attachments one list response carries, well inside
// MaxHeader.
const ListPage = 64

// Error codes a runtime can act on.
const (
	CodeBadRequest  = "bad-request" // malformed, wrong version, bad fields
	CodeDenied      = "denied"      // the caller may not do this
	CodeGone        = "gone"        // the caller exited before its request was read
	CodeNotFound    = "not-found"   // no such attachment
	CodeBusy        = "busy"        // queues still attached by another process
	CodeExists      = "exists"      // register of a key already held
	CodeUnavailable = "unavailable" // the pod netns or tap is gone
	CodeInternal    = "internal"    // napitapd failed
	codeUnreachable = "unreachable" // client side: no napitapd
	codeProtocol    = "protocol"    // client side: malformed response
)

// Error is a protocol error, on the wire and in Go.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return "napitapd: " + e.Code + ": " + e.Message }

func errorf(code, format string, a ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, a...)}
}

// ErrUnreachable wraps failures to reach napitapd at all, which callers may
// treat as "try again later" (CNI code 11).
var ErrUnreachable = errors.New("napitapd unreachable")

// IsCode reports whether err is a protocol error with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

func decodeRequest(b []byte) (*Request, *Error) {
	var req Request
	if err := json.Unmarshal(b, &req); err != nil {
		return nil, errorf(CodeBadRequest, "request is not a JSON object: %v", err)
	}
	if req.Version != Version {
		return nil, errorf(CodeBadRequest, "version %d is not supported (want %d)", req.Version, Version)
	}
	switch req.Op {
	case OpRegister:
		if req.Attachment == nil {
			return nil, errorf(CodeBadRequest, "register without attachment")
		}
		if err := req.Attachment.Validate(); err != nil {
			return nil, errorf(CodeBadRequest, "%v", err)
		}
	case OpFetch, OpRelease:
		if req.Key == nil && req.Op == OpRelease {
			return nil, errorf(CodeBadRequest, "%s without key", req.Op)
		}
		if req.Key != nil {
			if err := req.Key.Validate(); err != nil {
				return nil, errorf(CodeBadRequest, "%v", err)
			}
		}
	case OpGC:
		for _, k := range req.Valid {
			if err := k.Validate(); err != nil {
				return nil, errorf(CodeBadRequest, "valid: %v", err)
			}
		}
	case OpList, OpStatus:
	default:
		return nil, errorf(CodeBadRequest, "unknown op %q", req.Op)
	}
	return &req, nil
}
