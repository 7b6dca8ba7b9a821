package datapath

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// rcvTimeout bounds every blocking receive, so receivers notice stop.
	rcvTimeout = 100 * time.Millisecond
	// tcpRTO: with the window closed and nothing acknowledged for this
	// long, the writer goes back to the first unacknowledged byte.
	tcpRTO = 200 * time.Millisecond
	// udpRcvBuf is each UDP socket's receive buffer (SO_RCVBUFFORCE).
	udpRcvBuf = 4 << 20
	recvBatch = 64

	soMeminfo      = 55 // SO_MEMINFO, not in x/sys/unix
	skMeminfoDrops = 8
	skMeminfoVars  = 9
)

// pinThread locks the calling goroutine to its OS thread and that thread to
// cpu. The thread is never unlocked: it ends with the goroutine, so its
// affinity never leaks into the Go scheduler's pool.
func pinThread(cpu int) (tid int, err error) {
	runtime.LockOSThread()
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return 0, fmt.Errorf("pin thread to CPU %d: %w", cpu, err)
	}
	return unix.Gettid(), nil
}

// counter is an atomic counter alone on its cache line, so a writer on one
// CPU and a receiver on another never share one.
type counter struct {
	atomic.Uint64
	_ [56]byte
}

// flow is one stream: one queue fd, one writer, one receiver socket.
type flow struct {
	idx              int
	queueFD          int
	srcPort, dstPort uint16
	sock             int       // the pod's socket: UDP, accepted or connected TCP
	tcp              *tcpState // guest to host: the VMM writes the stream
	guest            *guestTCP // host to guest: the VMM receives the stream
	response         []byte    // round trips: the VMM's answer
	rtts             []time.Duration

	txFrames, txBytes, retrans, paced, blocked, acks counter
	rxPackets, rxBytes                               counter
	// writerTID is the VMM side's thread, receiverTID the pod side's,
	// whichever way the traffic goes.
	writerTID, receiverTID atomic.Int32
}

func packEdge(una, right uint32) uint64 { return uint64(una)<<32 | uint64(right) }

func unpackEdge(e uint64) (una, right uint32) { return uint32(e >> 32), uint32(e) }

// tcpState is the writer's view of one TCP connection. The handshake fills
// the plain fields before any writer runs; ACKs read by any writer update
// the atomics (an ACK may come back on another queue than its flow's).
type tcpState struct {
	iss, irs   uint32
	peerWScale uint8
	ts         bool
	synAckSeen bool
	// edge packs the first unacknowledged byte (high half) and the right
	// edge of the advertised window (low half), so that ACKs read by two
	// writers can never pair one ACK's una with another's window.
	edge        atomic.Uint64
	tsecr       atomic.Uint32
	lastAdvance atomic.Int64 // ns since the cell started
	dupAcks     atomic.Int32
	goBack      atomic.Bool
}

// cellRun is everything one measurement cell runs.
type cellRun struct {
	b        *bench
	tap      *podTap
	size     Size
	flows    []*flow
	listener int
	start    time.Time
	tsBase   uint32

	// stopWriters stops the side that sends (the VMM's writers, or the
	// pod's senders), stopReceivers the other, once the senders stopped.
	stopWriters, stopReceivers atomic.Bool
	measuring                  atomic.Bool // round trips are recorded
	wg                         sync.WaitGroup
	errMu                      sync.Mutex
	errs                       []error
}

func (c *cellRun) fail(err error) {
	c.errMu.Lock()
	c.errs = append(c.errs, err)
	c.errMu.Unlock()
}

func (c *cellRun) err() error {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return errors.Join(c.errs...)
}

func (c *cellRun) nowNs() int64 { return int64(time.Since(c.start)) }

// tsval is a guest's TCP timestamp clock: milliseconds, so that segments
// written within one millisecond carry the same options and GRO can merge
// them, as with a Linux guest.
func (c *cellRun) tsval() uint32 { return c.tsBase + uint32(time.Since(c.start)/time.Millisecond) }

// goPinned runs fn on a new goroutine pinned to cpu, recording its thread
// id; onExit (if any) runs when the goroutine ends, whatever happened.
func (c *cellRun) goPinned(cpu int, tid *atomic.Int32, ready *sync.WaitGroup, name string, onExit func(), fn func()) {
	c.wg.Add(1)
	ready.Add(1)
	go func() {
		defer c.wg.Done()
		if onExit != nil {
			defer onExit()
		}
		defer func() {
			if r := recover(); r != nil {
				c.fail(fmt.Errorf("%s: panic: %v", name, r))
				c.stopWriters.Store(true)
			}
		}()
		t, err := pinThread(cpu)
		tid.Store(int32(t))
		ready.Done()
		if err != nil {
			c.fail(fmt.Errorf("%s: %w", name, err))
			return
		}
		fn()
	}()
}

// --- sockets in the pod netns ----------------------------------------------

func podSockaddr(port uint16) *unix.SockaddrInet4 {
	return &unix.SockaddrInet4{Port: int(port), Addr: podIP}
}

func setRcvTimeout(fd int, d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
}

// udpSocket must run in the pod netns.
func udpSocket(port uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, udpRcvBuf); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("SO_RCVBUFFORCE: %w", err)
	}
	if err := setRcvTimeout(fd, rcvTimeout); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Bind(fd, podSockaddr(port)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind udp %d: %w", port, err)
	}
	return fd, nil
}

// tcpListener must run in the pod netns. The receive buffer is left to
// autotuning, as an application would.
func tcpListener(port uint16) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	if err := unix.Bind(fd, podSockaddr(port)); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind tcp %d: %w", port, err)
	}
	if err := unix.Listen(fd, 16); err != nil {
		unix.Close(fd)
		return -1, err
	}
	// accept(2) honours SO_RCVTIMEO: a lost handshake ACK cannot hang it.
	if err := setRcvTimeout(fd, 500*time.Millisecond); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// closeAbortive closes a TCP connection with RST: no FIN_WAIT state left
// holding a route through a tap that is about to go.
func closeAbortive(fd int) {
	_ = unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	unix.Close(fd)
}

func (c *cellRun) closeSockets() {
	for _, f := range c.flows {
		if f.sock >= 0 {
			if c.size.Proto == protoTCP {
				closeAbortive(f.sock)
			} else {
				unix.Close(f.sock)
			}
			f.sock = -1
		}
	}
	if c.listener >= 0 {
		unix.Close(c.listener)
		c.listener = -1
	}
}

// --- TCP: the writer is the peer ---------------------------------------------

func (c *cellRun) flowByPort(port uint16) *flow {
	for _, f := range c.flows {
		if f.srcPort == port {
			return f
		}
	}
	return nil
}

// ingest handles one frame the kernel sent out of the tap.
func (c *cellRun) ingest(frame []byte) {
	t, ok := parseTCP(frame)
	if !ok || t.flags&tcpACK == 0 {
		return
	}
	f := c.flowByPort(t.dstPort)
	if f == nil || f.tcp == nil || t.srcPort != f.dstPort {
		return
	}
	st := f.tcp
	if t.flags&tcpSYN != 0 {
		// Only the handshake, on the main goroutine, may take a SYN-ACK.
		// Writers start after every handshake, so they only ever see
		// retransmitted SYN-ACKs of flows already established.
		if !st.synAckSeen && t.ack == st.iss+1 {
			st.irs = t.seq
			st.synAckSeen = true
			st.ts = t.hasTS
			if t.wscale >= 0 {
				st.peerWScale = uint8(t.wscale)
			}
			st.edge.Store(packEdge(t.ack, t.ack+uint32(t.win))) // never scaled in a SYN
			st.tsecr.Store(t.tsval)
			st.lastAdvance.Store(c.nowNs())
		}
		return
	}
	if !st.synAckSeen {
		return
	}
	f.acks.Add(1)
	if t.hasTS {
		st.tsecr.Store(t.tsval)
	}
	right := t.ack + uint32(t.win)<<st.peerWScale
	for {
		old := st.edge.Load()
		una, r := unpackEdge(old)
		d := int32(t.ack - una)
		if d < 0 {
			return // an older ACK, read late
		}
		nr := r
		if int32(right-r) > 0 {
			nr = right // the right edge never moves left
		}
		if d == 0 {
			// A duplicate ACK (RFC 5681: no data, same window) means a
			// hole, or a segment beyond the window.
			if t.payloadLen == 0 && right == r && t.flags&(tcpFIN|tcpRST) == 0 {
				if st.dupAcks.Add(1) >= 3 {
					st.dupAcks.Store(0)
					st.goBack.Store(true)
				}
			}
			if nr == r {
				return
			}
		}
		if st.edge.CompareAndSwap(old, packEdge(t.ack, nr)) {
			if d > 0 {
				st.lastAdvance.Store(c.nowNs())
				st.dupAcks.Store(0)
			}
			return
		}
	}
}

// drain reads and ingests whatever the kernel has sent out of queue fd.
func (c *cellRun) drain(fd int, buf []byte) {
	for {
		n, err := unix.Read(fd, buf)
		if err != nil || n <= 0 {
			return
		}
		c.ingest(buf[:n])
	}
}

// handshakes connects every flow: SYN written into the flow's queue, the
// kernel's SYN-ACK read back from the tap, ACK, accept. Runs before any
// worker, on the calling goroutine.
func (c *cellRun) handshakes(dstMAC net.HardwareAddr) error {
	buf := make([]byte, 1<<17)
	pfds := make([]unix.PollFd, len(c.flows))
	for i, f := range c.flows {
		pfds[i] = unix.PollFd{Fd: int32(f.queueFD), Events: unix.POLLIN}
	}
	for _, f := range c.flows {
		st := f.tcp
		var synAt time.Time
		deadline := time.Now().Add(3 * time.Second)
		for !st.synAckSeen {
			if time.Now().After(deadline) {
				return fmt.Errorf("flow %d: no SYN-ACK from %d within 3s", f.idx, f.dstPort)
			}
			if time.Since(synAt) > 500*time.Millisecond {
				syn := tcpControl(dstMAC, f.srcPort, f.dstPort, st.iss, 0, tcpSYN, synOptions(c.tsval(), 0))
				if _, err := unix.Write(f.queueFD, syn); err != nil {
					return fmt.Errorf("flow %d: write SYN: %w", f.idx, err)
				}
				synAt = time.Now()
			}
			if _, err := unix.Poll(pfds, 50); err != nil && !errors.Is(err, unix.EINTR) {
				return err
			}
			for _, f2 := range c.flows {
				c.drain(f2.queueFD, buf)
			}
		}
		var opts []byte
		if st.ts {
			opts = tsOptions(c.tsval(), st.tsecr.Load())
		}
		ack := tcpControl(dstMAC, f.srcPort, f.dstPort, st.iss+1, st.irs+1, tcpACK, opts)
		var conn int
		for attempt := 0; ; attempt++ {
			if _, err := unix.Write(f.queueFD, ack); err != nil {
				return fmt.Errorf("flow %d: write ACK: %w", f.idx, err)
			}
			var err error
			conn, _, err = unix.Accept4(c.listener, unix.SOCK_CLOEXEC)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) || attempt >= 5 {
				return fmt.Errorf("flow %d: accept: %w", f.idx, err)
			}
		}
		f.sock = conn
		if err := setRcvTimeout(conn, rcvTimeout); err != nil {
			return err
		}
	}
	return nil
}

// writeTCP is a VMM writing a guest's bulk TCP stream: one segment (or one
// GSO frame) per write(2), within the window the kernel advertises.
func (c *cellRun) writeTCP(f *flow) {
	st := f.tcp
	seg := newTCPSegmenter(c.tap.mac, f.srcPort, f.dstPort, c.size.Payload, st.ts, c.size.GSO)
	fd := f.queueFD
	buf := make([]byte, 1<<17)
	pfdIn := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	pfdOut := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	// ACKs come about every second full segment; read them before the
	// tap's transmit ring (500 frames) overflows, as a VMM's event loop
	// would for its guest.
	drainEvery := max(1, 16*tcpMSS/c.size.Payload)
	seq, _ := unpackEdge(st.edge.Load())
	ack := st.irs + 1
	tsval := c.tsval()
	var frames, bytes, retrans, blocked uint64
	publish := func() {
		f.txFrames.Store(frames)
		f.txBytes.Store(bytes)
		f.retrans.Store(retrans)
		f.blocked.Store(blocked)
	}
	defer publish()
	since := 0
	for i := uint64(0); ; i++ {
		if i&31 == 0 {
			publish()
			if c.stopWriters.Load() {
				return
			}
			tsval = c.tsval()
		}
		if since >= drainEvery {
			c.drain(fd, buf)
			since = 0
		}
		una, right := unpackEdge(st.edge.Load())
		if st.goBack.Swap(false) && seq != una {
			seq = una
			retrans++
		}
		if int32(una-seq) > 0 {
			seq = una
		}
		avail := int64(int32(right - seq))
		n := c.size.Payload
		if c.size.GSO && avail < int64(n) {
			n = int(avail) / tcpMSS * tcpMSS
		}
		if n <= 0 || avail < int64(n) {
			blocked++
			if now := c.nowNs(); time.Duration(now-st.lastAdvance.Load()) > tcpRTO {
				seq, _ = unpackEdge(st.edge.Load())
				retrans++
				st.lastAdvance.Store(now)
			}
			if _, err := unix.Poll(pfdIn, 1); err != nil && !errors.Is(err, unix.EINTR) {
				c.fail(fmt.Errorf("flow %d: poll: %w", f.idx, err))
				return
			}
			since = drainEvery
			continue
		}
		frame := seg.segment(seq, ack, tsval, st.tsecr.Load(), n)
		if written, err := writeFrame(fd, frame, pfdOut); err != nil {
			c.fail(fmt.Errorf("flow %d: write: %w", f.idx, err))
			return
		} else if !written {
			continue
		}
		seq += uint32(n)
		frames++
		bytes += uint64(n)
		since++
	}
}

// receiveTCP is the pod's application: read(2) until told to stop.
func (c *cellRun) receiveTCP(f *flow) {
	buf := make([]byte, 512<<10)
	var bytes uint64
	for !c.stopReceivers.Load() {
		n, err := unix.Read(f.sock, buf)
		switch {
		case err == nil && n > 0:
			bytes += uint64(n)
			f.rxBytes.Store(bytes)
			f.rxPackets.Store(bytes / uint64(c.size.Payload))
		case err == nil && n == 0:
			return
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		default:
			c.fail(fmt.Errorf("flow %d: read: %w", f.idx, err))
			return
		}
	}
}

// --- UDP ---------------------------------------------------------------------

// writeUDP writes the same datagram as fast as the queue takes it. A NAPI
// queue has no limit of its own: when the kernel falls behind (threaded
// NAPI on a busy CPU), the writer waits while more than maxBacklog frames
// are neither received nor dropped, so a run cannot eat the machine's
// memory. Plain queues process each write before it returns and never wait.
func (c *cellRun) writeUDP(f *flow) {
	frame := buildUDPFrame(c.tap.mac, f.srcPort, f.dstPort, c.size.Payload)
	fd := f.queueFD
	pfdOut := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
	maxBacklog := uint64(c.b.opts.MaxBacklog)
	var frames, paced uint64
	publish := func() {
		f.txFrames.Store(frames)
		f.txBytes.Store(frames * uint64(c.size.Payload))
		f.paced.Store(paced)
	}
	defer publish()
	pause := unix.NsecToTimespec((50 * time.Microsecond).Nanoseconds())
	for i := uint64(0); ; i++ {
		if i&63 == 0 {
			publish()
			if c.stopWriters.Load() {
				return
			}
			if maxBacklog > 0 && i&255 == 0 {
				for frames > f.rxPackets.Load()+maxBacklog && frames > f.rxPackets.Load()+socketDrops(f.sock)+maxBacklog {
					if c.stopWriters.Load() {
						return
					}
					_ = unix.Nanosleep(&pause, nil)
					paced++
				}
			}
		}
		if written, err := writeFrame(fd, frame, pfdOut); err != nil {
			c.fail(fmt.Errorf("flow %d: write: %w", f.idx, err))
			return
		} else if !written {
			continue
		}
		frames++
	}
}

// socketDrops is the socket's drop counter (SK_MEMINFO_DROPS).
func socketDrops(fd int) uint64 {
	var mi [skMeminfoVars]uint32
	l := uint32(unsafe.Sizeof(mi))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, soMeminfo,
		uintptr(unsafe.Pointer(&mi[0])), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return 0
	}
	return uint64(mi[skMeminfoDrops])
}

type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

func recvmmsg(fd int, msgs []mmsghdr, flags int) (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&msgs[0])),
		uintptr(len(msgs)), uintptr(flags), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// receiveUDP is the pod's application: recvmmsg(2) in batches of 64.
func (c *cellRun) receiveUDP(f *flow) {
	msgs := make([]mmsghdr, recvBatch)
	iovs := make([]unix.Iovec, recvBatch)
	bufLen := max(2048, c.size.Payload+1)
	bufs := make([]byte, recvBatch*bufLen)
	for i := range msgs {
		iovs[i].Base = &bufs[i*bufLen]
		iovs[i].SetLen(bufLen)
		msgs[i].hdr.Iov = &iovs[i]
		msgs[i].hdr.SetIovlen(1)
	}
	var packets, bytes uint64
	for !c.stopReceivers.Load() {
		n, err := recvmmsg(f.sock, msgs, unix.MSG_WAITFORONE)
		switch {
		case err == nil:
			for i := 0; i < n; i++ {
				bytes += uint64(msgs[i].n)
			}
			packets += uint64(n)
			f.rxPackets.Store(packets)
			f.rxBytes.Store(bytes)
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		default:
			c.fail(fmt.Errorf("flow %d: recvmmsg: %w", f.idx, err))
			return
		}
	}
	runtime.KeepAlive(bufs)
	runtime.KeepAlive(iovs)
}

// writeFrame writes one frame into a queue fd as a VMM does. A full queue
// (EAGAIN, ENOBUFS) waits a little for room and an interrupted write is
// retried by the caller: both report false with no error.
func writeFrame(fd int, frame []byte, pfdOut []unix.PollFd) (bool, error) {
	_, err := unix.Write(fd, frame)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOBUFS):
		if pfdOut == nil {
			pfdOut = []unix.PollFd{{Fd: int32(fd), Events: unix.POLLOUT}}
		}
		_, _ = unix.Poll(pfdOut, 1)
		return false, nil
	case errors.Is(err, unix.EINTR):
		return false, nil
	}
	return false, err
}
