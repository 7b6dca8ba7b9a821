// Package plainqueue bounds how long a VMM waits for napitapd. A VMM's
// TUNSETIFF under napitap's seccomp filter waits, its thread blocked (QEMU's
// main loop), until napitapd answers. The fd holder outlives napitapd, but
// when napitapd's whole container is down, the kubelet's back-off decides
// when it comes back: 10 s, doubling to 5 min. So once no napitapd has
// been connected to the holder for a while, the holder lets every waiting
// call go on in the kernel: the VMM opens its queue itself, without NAPI,
// as it would with no napitap at all. A queue without NAPI for that NIC,
// rather than a VM frozen for minutes (docs/DESIGN.md fact 22).
package plainqueue

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// DefaultAfter is how long the holder waits for a napitapd: longer than a
// supervised restart (0.1-0.2 s) or the kubelet's first restart of the
// container (about 1 s), shorter than its back-off after the second
// (10 s), and as long as an ADD waits for napitapd.
const DefaultAfter = 5 * time.Second

// tick is how often the holder looks while alone: a waiting call is let go
// at most this long after its bound.
const tick = 250 * time.Millisecond

// Run lets waiting calls go on, for every seccomp listener h holds, once
// no napitapd has been served for after, until ctx is done.
func Run(ctx context.Context, h *fdstore.Holder, after time.Duration, log *slog.Logger) {
	t := time.NewTicker(tick)
	defer t.Stop()
	left := map[string]uint32{} // logged once per entry and caller
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !h.WhileAlone(after, func(name string, files []*os.File) {
			// Noted before any napitapd is served again, so that the
			// first one's sync counts them and names the pod.
			for _, tid := range letGo(name, files, after, left, log) {
				h.NoteLetGo(name, tid)
			}
		}) {
			clear(left)
		}
	}
}

// letGo lets the calls waiting on an entry's listener go on, and returns
// their threads; an entry that is no seccomp listener (a queue, a socket)
// is left alone.
func letGo(name string, files []*os.File, after time.Duration, left map[string]uint32, log *slog.Logger) []uint32 {
	if len(files) == 0 || !isListener(files[0]) {
		return nil
	}
	var slot *os.File
	if len(files) > 1 {
		slot = files[1]
	}
	done, err := seccompagent.ContinueWaiting(files[0], slot)
	for _, tid := range done.Tids {
		log.Warn("plainqueue: no napitapd: a TUNSETIFF went on in the kernel, its queue without NAPI",
			"entry", name, "tid", tid, "after", after)
	}
	if done.Left != 0 && left[name] != done.Left {
		log.Warn("plainqueue: no napitapd: a TUNSETIFF whose fd the last napitapd may have attached waits for the next",
			"entry", name, "tid", done.Left)
	}
	left[name] = done.Left
	if err != nil {
		log.Error("plainqueue: seccomp listener", "entry", name, "err", err)
	}
	return done.Tids
}

// isListener reports whether f is a seccomp listener, asked without Fd,
// which would take the listener napitapd shares out of non-blocking mode.
func isListener(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var target string
	_ = rc.Control(func(fd uintptr) { target, err = os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd)) })
	return err == nil && target == "anon_inode:seccomp notify"
}
