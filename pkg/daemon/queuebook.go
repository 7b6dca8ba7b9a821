package daemon

import (
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/metrics"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapqueues"
	"github.com/napitap/napitap/pkg/unixsock"
)

// queueBook is napitapd's record of the open queues of napitap's taps:
// which it attached with IFF_NAPI, which ended plain and why, and which it
// cannot tell. The kernel shows no queue's own NAPI (docs/DESIGN.md fact
// 2), so this is napitapd's word, which napitapctl node prints beside the
// kernel's tap flags. Each plain queue napitapd learns of is counted in
// napitapd_plain_queues_total and logged as a WARN naming its pod, once:
//
//   - the agent's answer (seccompagent.Options.OnQueue): NAPI, or left to
//     the kernel (left_to_kernel; caller_unreadable when the caller's ifreq
//     could not be read, so which tap is unknown until the scan finds it);
//   - the fd holder's let-go calls, taken at each sync (holder_bounded_wait);
//   - the scan (scan), every Config.QueueScan: a queue of an intercept tap
//     that none of the above accounts for on two scans in a row was opened
//     without reaching the agent (not_intercepted). Queues there at this
//     napitapd's first scan are unknown: it was not there to see them.
//
// It lives as long as the process: a takeover or a restart starts a new
// one, whose first scan marks what is open then as unknown.
type queueBook struct {
	log     *slog.Logger
	metrics *metrics.Metrics
	start   time.Time

	mu      sync.Mutex
	queues  map[queueID]handoff.QueueState
	notes   map[int][]note   // by process: plain calls whose queue the scan has not found yet
	seen    map[queueID]bool // unaccounted for at the last scan
	scanned bool             // the first scan is done
	// origins names each listener entry of the fd holder's by its origin,
	// for the holder's let-go calls.
	origins map[string]string
	// unread spaces out caller_unreadable's lines, which a caller that
	// stalls call after call repeats; each is still counted.
	unread unixsock.Every
}

// queueID is one open queue: the tap, the process holding it, the fd.
type queueID struct {
	tap tapqueues.TapID
	pid int
	fd  int
}

// note is a plain call of a process whose queue napitapd does not know
// yet: the scan gives each to one of that process's unaccounted queues.
type note struct {
	reason, why string
	at          time.Time
}

// noteLife bounds how long a note waits for the scan: a call that attached
// nothing (the kernel refused it) leaves one for no queue.
const noteLife = 10 * time.Minute

// maxWhy bounds a reason's text, so that a list page of queue states stays
// well inside handoff.MaxHeader.
const maxWhy = 200

func newQueueBook(log *slog.Logger, m *metrics.Metrics) *queueBook {
	return &queueBook{log: log, metrics: m, start: time.Now(),
		queues: map[queueID]handoff.QueueState{}, notes: map[int][]note{}, seen: map[queueID]bool{},
		origins: map[string]string{}, unread: unixsock.Every{Interval: 10 * time.Second}}
}

// agentEvent is the agent's OnQueue.
func (b *queueBook) agentEvent(ev seccompagent.QueueEvent) {
	// The agent reads the caller's process with its credentials where it
	// attaches: reading /proc/TID/status again cost more than the rest of
	// the record, on the CPU the caller's next call wants.
	pid := ev.PID
	if pid <= 0 {
		pid = processOf(ev.Tid)
	}
	why := clip(ev.Why)
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case ev.Tap == "":
		b.metrics.PlainQueue(metrics.PlainCallerUnreadable)
		if pid > 0 {
			b.notes[pid] = append(b.notes[pid], note{metrics.PlainCallerUnreadable, why, time.Now()})
		}
		if ok, held := b.unread.Allow(); ok {
			b.log.Warn("plain queue: the agent could not read a TUNSETIFF's ifreq in time and left it to the kernel: that queue has no NAPI",
				"reason", metrics.PlainCallerUnreadable, "pod", ev.Listener, "pid", pid, "tid", ev.Tid, "fd", ev.FD, "heldBackSinceLastLine", held)
		}
		return
	case pid <= 0:
		return // the caller is gone, and its queue with it
	}
	id := queueID{tapqueues.TapID{NetnsID: ev.NetnsID, Name: ev.Tap}, pid, int(ev.FD)}
	switch {
	case ev.NAPI:
		b.queues[id] = handoff.QueueState{PID: pid, FD: int(ev.FD), NAPI: handoff.QueueNAPI, Why: "attached by napitapd's agent with IFF_NAPI", Since: time.Now()}
	case ev.NAPIOff:
		b.queues[id] = handoff.QueueState{PID: pid, FD: int(ev.FD), NAPI: handoff.QueuePlain, Why: why, Since: time.Now()}
	default:
		b.queues[id] = handoff.QueueState{PID: pid, FD: int(ev.FD), NAPI: handoff.QueuePlain, Reason: metrics.PlainLeftToKernel, Why: why, Since: time.Now()}
		b.metrics.PlainQueue(metrics.PlainLeftToKernel)
		b.log.Warn("plain queue: the agent left a napitap tap's TUNSETIFF to the kernel: that queue has no NAPI",
			"reason", metrics.PlainLeftToKernel, "pod", ev.Listener, "attachment", ev.Attachment, "tap", ev.Tap, "pid", pid, "fd", ev.FD, "why", why)
	}
	delete(b.seen, id)
}

// keepOrigin and forgetOrigin follow the holder's listener entries.
func (b *queueBook) keepOrigin(entry, origin string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.origins[entry] = origin
	b.mu.Unlock()
}

func (b *queueBook) forgetOrigin(entry string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	delete(b.origins, entry)
	b.mu.Unlock()
}

// letGo is the fd holder's report (fdstore.Mirror.OnLetGo): calls it let
// go on in the kernel while no napitapd was there (docs/DESIGN.md fact 22).
func (b *queueBook) letGo(r fdstore.LetGoReport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range r.Calls {
		b.metrics.PlainQueue(metrics.PlainHolderWait)
		pid := processOf(int(c.Tid))
		if pid > 0 {
			b.notes[pid] = append(b.notes[pid], note{metrics.PlainHolderWait, "no napitapd for the fd holder's bounded wait (--plain-queue-after)", c.At})
		}
		origin := b.origins[c.Entry]
		if origin == "" {
			origin = "unknown (listener " + c.Entry + ")"
		}
		b.log.Warn("plain queue: with no napitapd, the fd holder let a TUNSETIFF go on in the kernel: that queue has no NAPI",
			"reason", metrics.PlainHolderWait, "pod", origin, "pid", pid, "tid", c.Tid, "at", c.At)
	}
	for range r.Dropped {
		b.metrics.PlainQueue(metrics.PlainHolderWait)
	}
	if r.Dropped > 0 {
		b.log.Warn("plain queue: the fd holder let more TUNSETIFFs go on in the kernel than it could name", "reason", metrics.PlainHolderWait, "count", r.Dropped)
	}
}

// states is what the book knows of the open queues of att's tap
// (handoff.Server.QueueStates), as of the last scan and the agent's
// answers since.
func (b *queueBook) states(att handoff.Attachment) []handoff.QueueState {
	tap := tapOf(att)
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []handoff.QueueState
	for id, st := range b.queues {
		if id.tap == tap {
			out = append(out, st)
		}
	}
	return out
}

// tapOf names att's tap on the node.
func tapOf(att handoff.Attachment) tapqueues.TapID {
	id := att.NetnsID
	if att.NodeTap {
		id = att.TapNetnsID
	}
	return tapqueues.TapID{NetnsID: id, Name: att.TapName}
}

// scan reads every open queue of atts' taps from the kernel and accounts
// for each: what the agent or the holder told, napitap's own queues (fds
// mode), or, on a second sighting, a VMM's open that never reached the
// agent.
func (b *queueBook) scan(atts []handoff.Attachment) {
	taps := map[tapqueues.TapID]bool{}
	byTap := map[tapqueues.TapID]handoff.Attachment{}
	for _, a := range atts {
		t := tapOf(a)
		taps[t], byTap[t] = true, a
	}
	started := time.Now()
	found, err := tapqueues.FindAll(taps)
	if err != nil {
		b.log.Warn("queue scan: some queues could not be read; napitapctl node shows them unknown", "err", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	open := map[queueID]bool{}
	for _, q := range found {
		id := queueID{q.TapID, q.PID, q.FD}
		open[id] = true
		if _, ok := b.queues[id]; ok {
			continue
		}
		att := byTap[q.TapID]
		switch notes := b.notes[q.PID]; {
		case !att.Intercept:
			// fds mode: the tap's queues are those napitap's ADD opened,
			// with IFF_NAPI as the network says; a by-name open of it
			// cannot be told from them.
			st := handoff.QueueState{PID: q.PID, FD: q.FD, NAPI: handoff.QueueNAPI, Why: "fds mode: opened by napitap's ADD with IFF_NAPI", Since: started}
			if !att.NAPI {
				st.NAPI, st.Why = handoff.QueuePlain, "fds mode: the network sets napi false"
			}
			b.queues[id] = st
		case len(notes) > 0:
			// Counted and logged when napitapd was told.
			n := notes[0]
			if b.notes[q.PID] = notes[1:]; len(notes) == 1 {
				delete(b.notes, q.PID)
			}
			delete(b.seen, id)
			b.queues[id] = handoff.QueueState{PID: q.PID, FD: q.FD, NAPI: handoff.QueuePlain, Reason: n.reason, Why: n.why, Since: n.at}
		case !b.scanned:
			b.queues[id] = handoff.QueueState{PID: q.PID, FD: q.FD, NAPI: handoff.QueueUnknown,
				Why: "open before this napitapd started (" + b.start.Format(time.RFC3339) + ")", Since: started}
		case !b.seen[id]:
			// An attach the agent made during the walk, not yet told:
			// look again next time.
			b.seen[id] = true
		default:
			delete(b.seen, id)
			b.queues[id] = handoff.QueueState{PID: q.PID, FD: q.FD, NAPI: handoff.QueuePlain, Reason: metrics.PlainNotIntercepted,
				Why: "not attached through napitapd's agent: its opener is not under napitap's seccomp filter", Since: started}
			b.metrics.PlainQueue(metrics.PlainNotIntercepted)
			b.log.Warn("plain queue: a VMM opened a napitap tap's queue without reaching the agent: that queue has no NAPI",
				"reason", metrics.PlainNotIntercepted, "attachment", att.Key.String(), "tap", att.TapName, "netns", att.Netns,
				"pid", q.PID, "command", q.Command, "fd", q.FD)
		}
	}
	// Queues closed since, unless learnt during the walk.
	for id, st := range b.queues {
		if !open[id] && st.Since.Before(started) {
			delete(b.queues, id)
		}
	}
	for id := range b.seen {
		if !open[id] {
			delete(b.seen, id)
		}
	}
	for pid, notes := range b.notes {
		if time.Since(notes[len(notes)-1].at) > noteLife {
			delete(b.notes, pid)
		}
	}
	b.scanned = true
}

// processOf is the process (thread group) of thread tid, 0 if it is gone:
// a queue is the process's, whose fd table every thread shares.
func processOf(tid int) int {
	if tid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Tgid:"); ok {
			pid, _ := strconv.Atoi(strings.TrimSpace(v))
			return pid
		}
	}
	return 0
}

func clip(s string) string {
	if len(s) > maxWhy {
		return s[:maxWhy] + "..."
	}
	return s
}
