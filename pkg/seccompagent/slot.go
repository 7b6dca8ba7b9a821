package seccompagent

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A notification napitapd has received and not answered lives on only in
// the kernel, in state SENT, which a new RECV never returns: a napitapd
// killed then leaves its caller blocked in TUNSETIFF for good, even with
// the filter kept alive by the fd holder (Store). So each listener has a
// slot, a page of a memfd the holder keeps too: RECV writes the
// notification straight into it, and the queue an answer attaches is
// recorded there before the attach. The next napitapd reads in the slot
// what the dead one was doing (Adopt).

const (
	slotName    = "napitap-seccomp-slot"
	slotMagic   = 0x4e545331 // "NTS1"
	slotVersion = 1
	slotSeals   = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
)

// slotSize is the memfd's size: one page, of which slotData uses the start.
var slotSize = os.Getpagesize()

// slotData is the slot's layout, shared by every napitapd of one
// slotVersion: fixed, without Go pointers.
type slotData struct {
	Magic   uint32
	Version uint32
	Notif   seccompNotif // RECV writes here
	Last    lastAttach
}

// lastAttach is the queue last attached through the listener, what
// recentAttaches remembers of it.
type lastAttach struct {
	// Tid is 0 while the rest is written, and stored atomically last: a
	// record a SIGKILL cut in half is no record.
	Tid     uint32
	FD      int32
	NetnsID uint64
	Tap     [unix.IFNAMSIZ]byte
}

// The layout must not move under a napitapd of the same slotVersion.
var (
	_ [unsafe.Offsetof(slotData{}.Notif) - 8]byte
	_ [unsafe.Offsetof(slotData{}.Last) - 0x58]byte
	_ [unsafe.Sizeof(slotData{}) - 0x78]byte
	_ [0x78 - unsafe.Sizeof(slotData{})]byte
)

// slot is a listener's slot, mapped.
type slot struct {
	f   *os.File  // the memfd; nil when the slot is in napitapd's memory only
	mem []byte    // f's mapping
	d   *slotData // the start of mem, or of napitapd's memory
}

// takeSlot returns the slot f holds, or a fresh one if f is nil or not a
// slot to trust (logged): a file that is not a memfd sealed against
// resizing could SIGBUS napitapd, a foreign layout would be misread. It
// owns f from then on. A slot that cannot be made is in napitapd's memory
// only: the listener is served all the same, without recovery.
func takeSlot(f *os.File, log *slog.Logger) *slot {
	if f != nil {
		s, err := mapSlot(f, false)
		if err == nil {
			return s
		}
		f.Close()
		log.Warn("seccomp listener's slot not trusted: a fresh one replaces it", "err", err)
	}
	s, err := newSlot()
	if err != nil {
		log.Error("seccomp listener's slot: a notification pending when napitapd dies will be lost", "err", err)
		return &slot{d: new(slotData)}
	}
	return s
}

// newSlot makes an empty slot.
func newSlot() (*slot, error) {
	fd, err := unix.MemfdCreate(slotName, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd %s: %w", slotName, err)
	}
	f := os.NewFile(uintptr(fd), slotName)
	if err := unix.Ftruncate(fd, int64(slotSize)); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd %s: truncate: %w", slotName, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, slotSeals|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd %s: seal: %w", slotName, err)
	}
	s, err := mapSlot(f, true)
	if err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// mapSlot maps f, checked first; fresh, it writes the header. f is the
// slot's on success, still the caller's on error.
func mapSlot(f *os.File, fresh bool) (*slot, error) {
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("slot %s: %w", f.Name(), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(slotSize) {
		return nil, fmt.Errorf("slot %s: mode 0%o, %d bytes: not a memfd of %d", f.Name(), st.Mode, st.Size, slotSize)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("slot %s: not a memfd: %w", f.Name(), err)
	}
	if seals&slotSeals != slotSeals {
		return nil, fmt.Errorf("slot %s: seals 0x%x, not against shrinking and growing", f.Name(), seals)
	}
	mem, err := unix.Mmap(fd, 0, slotSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("slot %s: mmap: %w", f.Name(), err)
	}
	s := &slot{f: f, mem: mem, d: (*slotData)(unsafe.Pointer(&mem[0]))}
	if fresh {
		s.d.Magic, s.d.Version = slotMagic, slotVersion
	} else if s.d.Magic != slotMagic || s.d.Version != slotVersion {
		m, v := s.d.Magic, s.d.Version
		s.unmap()
		return nil, fmt.Errorf("slot %s: magic 0x%x version %d, want 0x%x version %d", f.Name(), m, v, slotMagic, slotVersion)
	}
	return s, nil
}

// notif is where RECV writes.
func (s *slot) notif() *seccompNotif { return &s.d.Notif }

// last is the record of the queue last attached, if any.
func (s *slot) last() (uint32, attachedQueue, bool) {
	r := &s.d.Last
	tid := atomic.LoadUint32(&r.Tid)
	if tid == 0 {
		return 0, attachedQueue{}, false
	}
	return tid, attachedQueue{fd: r.FD, tap: cString(r.Tap[:unix.IFNAMSIZ-1]), netnsID: r.NetnsID}, true
}

// setLast records q as the queue last attached, for thread tid.
func (s *slot) setLast(tid uint32, q attachedQueue) {
	r := lastAttach{Tid: tid, FD: q.fd, NetnsID: q.netnsID}
	copy(r.Tap[:unix.IFNAMSIZ-1], q.tap)
	s.putLast(r)
}

// putLast writes r, published by its Tid.
func (s *slot) putLast(r lastAttach) {
	if s.d.Last == r {
		return
	}
	atomic.StoreUint32(&s.d.Last.Tid, 0)
	s.d.Last.FD, s.d.Last.NetnsID, s.d.Last.Tap = r.FD, r.NetnsID, r.Tap
	atomic.StoreUint32(&s.d.Last.Tid, r.Tid)
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

func (s *slot) unmap() {
	if s.mem != nil {
		_ = unix.Munmap(s.mem)
		s.mem, s.d = nil, nil
	}
}

// release unmaps the slot and returns its memfd, the caller's from then
// on; nil for a slot in napitapd's memory.
func (s *slot) release() *os.File {
	s.unmap()
	f := s.f
	s.f = nil
	return f
}

// close unmaps the slot and closes its memfd.
func (s *slot) close() {
	if f := s.release(); f != nil {
		f.Close()
	}
}

// newListenerID names a listener for the fd holder.
func newListenerID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b[:])
}
