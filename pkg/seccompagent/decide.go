package seccompagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/peer"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/pkg/threadcred"
)

// verdict is the answer to one notification.
type verdict struct {
	cont  bool       // let the kernel run the caller's own TUNSETIFF
	errno unix.Errno // else this, 0 for success
	gone  bool       // the caller is gone: nothing to answer
	// queue is the caller's fd attached, with success: remembered for the
	// call's restart should a signal interrupt it (restart.go).
	queue *attachedQueue
	// announce logs what was done, once the answer is out: the caller
	// waits on the answer, not on napitapd's log.
	announce func()
	// event is what Options.OnQueue is told once the answer is out (the
	// caller's tid, fd and listener filled in there); nil: a tap that is
	// not napitap's, or a refusal.
	event *QueueEvent
}

var (
	continueVerdict = verdict{cont: true}
	goneVerdict     = verdict{gone: true}
)

const (
	pidfdThread = unix.O_EXCL // PIDFD_THREAD (Linux 6.9+): a pidfd for one thread
	tunTypeMask = 0x000f
	tunMinor    = 200
	miscMajor   = 10
)

// ifreq is what the agent reads of the caller's struct ifreq.
type ifreq struct {
	name  string
	flags uint16
}

// decide handles one TUNSETIFF notification. Anything not a managed tap,
// or that it cannot read, is the kernel's to answer (CONTINUE), so the
// caller sees what it would without napitapd.
//
// prev is the queue last attached for the same thread, if any. The attach
// is announced in s before it is made, so that no attach escapes the slot
// however napitapd dies; answer takes it back if the attach fails. own is
// the listener's own taps (owntaps.go), nil if it has none.
func (a *Agent) decide(listener int, n *seccompNotif, sock *netnsSocket, prev *attachedQueue, s *slot, own ownTaps) verdict {
	arch, _ := auditArch()
	if n.Data.Arch != arch || n.Data.Nr != int32(unix.SYS_IOCTL) || uint32(n.Data.Args[1]) != tunSetIffLo || n.Pid == 0 {
		return continueVerdict
	}
	tid := int(n.Pid)
	ifr, err := a.readCallerIfreq(tid, n.Data.Args[2])
	if errors.Is(err, errReadGivenUp) {
		// CONTINUE grants nothing: the kernel reads the ifreq itself, in
		// the caller's context, and judges the caller.
		if ok, held := a.givenUp.Allow(); ok {
			a.log.Warn("cannot read the caller's ifreq in time: left to the kernel (no NAPI)", "pid", tid, "err", err, "heldBackSinceLastLine", held)
		}
	}
	if errors.Is(err, errReadGivenUp) {
		// Under napitap's filter, so most likely a napitap tap's queue,
		// now plain; which tap, nobody can tell.
		return verdict{cont: true, event: &QueueEvent{Why: "the caller's ifreq could not be read in time"}}
	}
	if err != nil || !interesting(ifr) {
		return continueVerdict
	}

	pidfd, err := openPidfd(tid)
	if err != nil {
		return continueVerdict
	}
	defer unix.Close(pidfd)
	// From here on the memory read and the pidfd are known to be the
	// caller's, not those of a process that took over its pid.
	if !notifIDValid(listener, n.ID) {
		return goneVerdict
	}
	fd, err := unix.PidfdGetfd(pidfd, int(int32(n.Data.Args[0])), 0)
	if err != nil {
		return continueVerdict
	}
	defer unix.Close(fd)
	if !unattachedTun(fd) {
		fdNum := int32(n.Data.Args[0])
		if restartOf(prev, fd, fdNum, ifr.name) {
			a.log.Info("TUNSETIFF restarted by a signal after napitapd attached the queue: 0, not EEXIST",
				"tap", ifr.name, "pid", tid, "fd", fdNum)
			return verdict{queue: prev}
		}
		// Not /dev/net/tun, or attached already (Cloud Hypervisor repeats
		// TUNSETIFF on fds it was given): the kernel's EEXIST or ENOTTY.
		return continueVerdict
	}
	nsfd, err := fileNetns(fd)
	if err != nil {
		return continueVerdict
	}
	defer unix.Close(nsfd)
	netnsID, err := tapsetup.NetnsIDOf(nsfd)
	if err != nil {
		return continueVerdict
	}
	t, managed := a.reg.Lookup(netnsID, ifr.name)
	// plain leaves a napitap tap's TUNSETIFF to the kernel, which attaches
	// the queue without NAPI, and says so to OnQueue; a launched tree's
	// own tap is no attachment's, and goes untold.
	plain := func(why string) verdict {
		if !managed {
			return continueVerdict
		}
		return verdict{cont: true, event: &QueueEvent{NetnsID: netnsID, Tap: ifr.name, Attachment: t.Key, Why: why, NAPIOff: !t.NAPI}}
	}
	if managed && !t.NAPI {
		a.log.Info("TUNSETIFF of a tap whose network sets napi false: left to the kernel, no NAPI", "tap", ifr.name, "attachment", t.Key, "pid", tid)
		return plain("the network sets napi false")
	}
	if !managed && own == nil {
		a.log.Debug("TUNSETIFF of a tap that is no intercept-mode attachment: left to the kernel", "tap", ifr.name, "pid", tid, "netns", netnsID)
		return continueVerdict
	}
	exists, alias, err := tapMark(nsfd, netnsID, ifr.name, sock)
	creates := false
	switch {
	case !managed:
		// The launched tree's: a tap it creates now, or created before.
		if err != nil || exists && !own.has(netnsID, ifr.name) {
			return continueVerdict
		}
		creates = !exists
		t = Target{Key: "created by napitapctl launch's tree", NAPI: true, MultiQueue: ifr.flags&unix.IFF_MULTI_QUEUE != 0}
	case err != nil || !exists:
		// napitapd's TUNSETIFF would create it; the caller may not.
		a.log.Warn("managed tap is not in its netns; left to the kernel", "tap", ifr.name, "attachment", t.Key, "pid", tid, "netns", netnsID, "err", err)
		return continueVerdict
	}
	log := a.log.With("tap", ifr.name, "attachment", t.Key, "pid", tid, "netns", netnsID)
	if t.Mark != "" && alias != t.Mark {
		// A link of that name that napitap did not make for this
		// attachment: not napitapd's to attach.
		log.Warn("a tap of that name is not marked as the attachment's; left to the kernel", "ifalias", alias, "want", t.Mark)
		return continueVerdict
	}
	if asked := ifr.flags&unix.IFF_MULTI_QUEUE != 0; asked != t.MultiQueue {
		// libvirt reports only "Invalid argument": say what differs.
		log.Warn("multiqueue mode mismatch: EINVAL, as the kernel answers", "asked_mode", queueMode(asked), "tap_mode", queueMode(t.MultiQueue))
		return verdict{errno: unix.EINVAL}
	}
	// The TUNSETIFF below runs on a thread with the caller's credentials
	// (threadcred), so that the kernel judges the caller: the tap's live
	// owner and group (tun_not_capable), the right to create a tap whose
	// name went meanwhile, IFF_NAPI_FRAGS. The thread gets CAP_NET_ADMIN
	// only if the caller has it over the tap's netns, which is all the
	// kernel asks of it there.
	owners, err := sock.netnsOwners(nsfd, netnsID)
	if err != nil {
		log.Warn("cannot read the user namespaces that own the tap's netns; left to the kernel (no NAPI)", "err", err)
		return plain("cannot read the user namespaces that own the tap's netns: " + err.Error())
	}
	c, err := peer.Thread(tid, pidfd, owners)
	if err != nil {
		return plain("cannot read the caller's credentials: " + err.Error())
	}
	if !notifIDValid(listener, n.ID) {
		return goneVerdict
	}
	creds := threadcred.Creds{UID: c.EUID, GID: c.EGID, Groups: c.Groups}
	if c.NetAdmin {
		creds.Caps = 1 << unix.CAP_NET_ADMIN
	}
	flags := ifr.flags | unix.IFF_NAPI
	if t.NAPIFrags {
		// The thread's CAP_NET_ADMIN counts in napitapd's user namespace,
		// the initial one, where the kernel asks it for IFF_NAPI_FRAGS
		// (docs/DESIGN.md fact 4): ask it of the caller there.
		if c.InitNetAdmin {
			flags |= unix.IFF_NAPI_FRAGS
		} else {
			log.Warn("napiFrags: the caller lacks CAP_NET_ADMIN in the initial user namespace, which the kernel requires for IFF_NAPI_FRAGS; IFF_NAPI only")
		}
	}
	req, err := unix.NewIfreq(ifr.name)
	if err != nil {
		return plain(err.Error())
	}
	req.SetUint16(flags)
	queue := &attachedQueue{fd: int32(n.Data.Args[0]), tap: ifr.name, netnsID: netnsID}
	s.setLast(n.Pid, *queue)
	var persistent bool
	attach := func() error {
		return threadcred.Run(creds, func() error {
			// The caller's own open file: its fd number, FD_CLOEXEC and
			// O_NONBLOCK stay as they were.
			if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, req); err != nil {
				return err
			}
			got, err := unix.NewIfreq("")
			if err == nil {
				err = unix.IoctlIfreq(fd, unix.TUNGETIFF, got)
			}
			persistent = err == nil && got.Uint16()&unix.IFF_PERSIST != 0
			return nil
		})
	}
	err = attach()
	if errors.Is(err, unix.EPERM) && !c.GroupsRead {
		// The kernel judged the caller without its supplementary groups,
		// which it asks for only where the tap's group is not the
		// caller's egid; a refused TUNSETIFF changed nothing, so ask
		// again with them.
		if groups, gerr := peer.ThreadGroups(tid); gerr == nil && len(groups) > 0 && notifIDValid(listener, n.ID) {
			c.Groups, creds.Groups = groups, groups
			err = attach()
		}
	}
	var credErr *threadcred.Error
	if errors.As(err, &credErr) {
		// napitapd lacks CAP_SETUID or CAP_SETGID: it cannot act as the
		// caller, so it does not act at all.
		log.Error("cannot take on the caller's credentials; left to the kernel (no NAPI)", "err", err)
		return plain("cannot take on the caller's credentials: " + err.Error())
	}
	if err != nil {
		var errno unix.Errno
		if !errors.As(err, &errno) {
			errno = unix.EIO
		}
		if errno == unix.EPERM {
			log.Warn("caller may not attach: EPERM from the kernel, judging the caller's credentials", "euid", c.EUID, "egid", c.EGID, "groups", c.Groups, "net_admin", c.NetAdmin)
		} else {
			log.Warn("TUNSETIFF for the caller failed", "flags", fmt.Sprintf("0x%x", flags), "err", err)
		}
		return verdict{errno: errno}
	}
	if creates {
		own.add(netnsID, ifr.name)
	} else if managed && !persistent {
		// Every tap napitap makes is persistent: the name went between
		// the check above and the TUNSETIFF, and the kernel made a tap for
		// a caller with CAP_NET_ADMIN over the netns, as the caller's own
		// TUNSETIFF would have.
		log.Warn("the caller's TUNSETIFF made a new tap, not napitap's: the name was replaced meanwhile", "net_admin", c.NetAdmin)
	}
	var event *QueueEvent
	if managed {
		event = &QueueEvent{PID: c.PID, NetnsID: netnsID, Tap: ifr.name, Attachment: t.Key, NAPI: true}
	}
	return verdict{queue: queue, event: event, announce: func() {
		if creates {
			log.Info("the caller created a tap, with NAPI on its queue", "flags", fmt.Sprintf("0x%x", flags))
		}
		log.Log(context.Background(), a.attachLevel, "attached the caller's queue with NAPI", "flags", fmt.Sprintf("0x%x", flags))
	}}
}

func queueMode(mq bool) string {
	if mq {
		return "multi-queue"
	}
	return "single-queue"
}

func fmtID(id *uint32) any {
	if id == nil {
		return "unset"
	}
	return *id
}

// interesting: a tap named outright, as QEMU, libvirt, Kata, Cloud
// Hypervisor and Firecracker ask. A TUN, a '%d' pattern, IFF_TUN_EXCL or
// IFF_NAPI_FRAGS (which needs the caller's CAP_NET_ADMIN) are the
// kernel's to answer.
func interesting(r ifreq) bool {
	return r.name != "" && !bytes.ContainsRune([]byte(r.name), '%') &&
		r.flags&tunTypeMask == unix.IFF_TAP &&
		r.flags&(unix.IFF_TUN_EXCL|unix.IFF_NAPI_FRAGS) == 0
}

const (
	// readDeadline bounds a read of a caller's memory, which the caller
	// can stall for as long as it lives (its ifreq on a userfaultfd or
	// FUSE page nobody fills): far above a read that does not stall
	// (microseconds; a page in from swap, milliseconds), and well below
	// daemon.StopGrace (2 s), since the listener's other callers wait
	// meanwhile.
	readDeadline = 250 * time.Millisecond
	// maxStalledReads bounds the reads given up and still blocked, a
	// thread each (Go kills the process at 10000 threads): past it a
	// TUNSETIFF is left to the kernel unread.
	maxStalledReads = 64
)

var errReadGivenUp = errors.New("read given up")

// readCallerIfreq is readIfreq on a thread of its own, given up at
// readDeadline or when the agent stops: that thread stays blocked in the
// kernel until the page arrives or the caller exits, and is counted in
// a.stalled meanwhile.
func (a *Agent) readCallerIfreq(tid int, addr uint64) (ifreq, error) {
	if n := a.stalled.Load(); n >= maxStalledReads {
		return ifreq{}, fmt.Errorf("ifreq of thread %d at 0x%x: %w unread: %d reads of callers' memory still stalled", tid, addr, errReadGivenUp, n)
	}
	type result struct {
		ifr ifreq
		err error
	}
	done := make(chan result, 1)
	var state atomic.Int32 // 0 reading, 1 read, 2 given up
	go func() {
		// Unlocked only after a read in time: a thread that stalled exits
		// with the goroutine instead of idling in Go's pool after a flood
		// of stalled reads, and one that did not is used again.
		runtime.LockOSThread()
		ifr, err := readIfreq(tid, addr)
		if state.CompareAndSwap(0, 1) {
			runtime.UnlockOSThread()
		} else {
			a.stalled.Add(-1)
		}
		done <- result{ifr, err}
	}()
	timer := time.NewTimer(readDeadline)
	defer timer.Stop()
	why := "stalled for " + readDeadline.String()
	select {
	case r := <-done:
		return r.ifr, r.err
	case <-timer.C:
	case <-a.quit:
		why = "the agent stops"
	}
	a.stalled.Add(1) // before the swap, so that the reader's -1 follows it
	if !state.CompareAndSwap(0, 2) {
		a.stalled.Add(-1)
		r := <-done
		return r.ifr, r.err
	}
	return ifreq{}, fmt.Errorf("ifreq of thread %d at 0x%x: %w: %s", tid, addr, errReadGivenUp, why)
}

// readIfreq reads ifr_name and ifr_flags from the caller's memory.
func readIfreq(tid int, addr uint64) (ifreq, error) {
	var buf [unix.IFNAMSIZ + 2]byte
	local := []unix.Iovec{{Base: &buf[0], Len: uint64(len(buf))}}
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(buf)}}
	n, err := unix.ProcessVMReadv(tid, local, remote, 0)
	if err != nil {
		return ifreq{}, err
	}
	if n != len(buf) {
		return ifreq{}, fmt.Errorf("short read of ifreq: %d bytes", n)
	}
	// The kernel ends the name at byte 15 whatever follows.
	name := buf[:unix.IFNAMSIZ-1]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return ifreq{name: string(name), flags: *(*uint16)(unsafe.Pointer(&buf[unix.IFNAMSIZ]))}, nil
}

// openPidfd opens the caller thread. A kernel before 6.9 knows only
// process pidfds (pidfd_open answers EINVAL to PIDFD_THREAD, and to the
// tid of a thread that does not lead its group): the caller's process's
// then, its thread group leader's. That serves: the fds pidfd_getfd takes
// are the process's, and the credentials are read by tid (/proc/TID,
// there being no PIDFD_GET_INFO before 6.13). The notification's validity,
// checked after this, confirms that tid was still the caller, blocked in
// its call, when its thread group was read. A thread with a file table
// of its own (unshare(CLONE_FILES)) is refused: pidfd_getfd would take the
// leader's fd of that number, not the caller's.
func openPidfd(tid int) (int, error) {
	fd, err := unix.PidfdOpen(tid, pidfdThread)
	if !errors.Is(err, unix.EINVAL) {
		return fd, err
	}
	tgid, err := threadGroup(tid)
	if err != nil {
		return -1, err
	}
	if tgid != tid {
		same, _, errno := unix.Syscall6(unix.SYS_KCMP, uintptr(tgid), uintptr(tid), kcmpFiles, 0, 0, 0)
		switch {
		case errno != 0:
			return -1, fmt.Errorf("kcmp of the file tables of thread %d and its process %d: %w", tid, tgid, errno)
		case same != 0:
			return -1, fmt.Errorf("thread %d has a file table of its own: no pidfd reaches it before Linux 6.9", tid)
		}
	}
	return unix.PidfdOpen(tgid, 0)
}

// kcmpFiles is KCMP_FILES of include/uapi/linux/kcmp.h.
const kcmpFiles = 2

// threadGroup is the Tgid of /proc/TID/status: the process of thread tid.
func threadGroup(tid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no Tgid", tid)
}

// unattachedTun: fd is /dev/net/tun (10:200) and not attached to a tap yet
// (TUNGETIFF answers EBADFD).
func unattachedTun(fd int) bool {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR ||
		unix.Major(st.Rdev) != miscMajor || unix.Minor(st.Rdev) != tunMinor {
		return false
	}
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return false
	}
	return errors.Is(unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr), unix.EBADFD)
}
