package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Host to guest: a socket in the pod netns sends, the tap transmits through
// its root qdisc into the queue rings, and the VMM reads each queue fd as
// QEMU and Cloud Hypervisor do: O_NONBLOCK, read(2) until EAGAIN, then
// poll(2). For TCP the VMM side is the peer: it answers the pod's SYN,
// and ACKs what arrives in order by writing into the queue it came from.
// Round trips: the VMM answers each UDP request at once on the same queue.
//
// Ports: a flow's srcPort is the guest's and its dstPort the pod's, in
// both directions, so flowByPort finds it from a frame either way.

// guestTCP is the guest's side of one TCP connection from the pod. The
// reader of the queue the flow's frames come on updates it; the lock is
// for the frames the kernel may steer to another queue before it learns
// the flow.
type guestTCP struct {
	mu          sync.Mutex
	iss, rcvNxt uint32
	synSeen     bool
	tsRecent    uint32
	unacked     int
	ack         *tcpSegmenter // a reusable pure ACK
	// ofo are the ranges received beyond a hole, as a guest's
	// out-of-order queue holds them: without it one lost segment would
	// cost the sender its whole window.
	ofo [][2]uint32
}

// maxOFO bounds the out-of-order ranges kept, as a receive buffer would.
const maxOFO = 1024

// addOFO keeps [seq, end) beyond rcvNxt, ranges sorted and merged.
func (g *guestTCP) addOFO(seq, end uint32) {
	off := func(v uint32) int32 { return int32(v - g.rcvNxt) }
	i := 0
	for i < len(g.ofo) && off(g.ofo[i][1]) < off(seq) {
		i++
	}
	if i == len(g.ofo) || off(end) < off(g.ofo[i][0]) {
		if len(g.ofo) < maxOFO {
			g.ofo = slices.Insert(g.ofo, i, [2]uint32{seq, end})
		}
		return
	}
	// Overlaps or touches g.ofo[i]: merge it and any it now reaches.
	if off(seq) < off(g.ofo[i][0]) {
		g.ofo[i][0] = seq
	}
	if off(end) > off(g.ofo[i][1]) {
		g.ofo[i][1] = end
	}
	for i+1 < len(g.ofo) && off(g.ofo[i+1][0]) <= off(g.ofo[i][1]) {
		g.ofo[i][1] = max(g.ofo[i][1]-g.rcvNxt, g.ofo[i+1][1]-g.rcvNxt) + g.rcvNxt
		g.ofo = slices.Delete(g.ofo, i+1, i+2)
	}
}

// advance moves rcvNxt to end and over the out-of-order ranges that now
// follow it; it returns the bytes that became in order.
func (g *guestTCP) advance(end uint32) uint32 {
	start := g.rcvNxt
	g.rcvNxt = end
	for len(g.ofo) > 0 && int32(g.ofo[0][0]-g.rcvNxt) <= 0 {
		if int32(g.ofo[0][1]-g.rcvNxt) > 0 {
			g.rcvNxt = g.ofo[0][1]
		}
		g.ofo = g.ofo[1:]
	}
	return g.rcvNxt - start
}

// ackEvery is how many in-order segments the guest takes before it ACKs;
// a Linux guest with GRO ACKs less often than every second segment.
const ackEvery = 4

// readQueue is the VMM's loop on one queue fd.
func (c *cellRun) readQueue(f *flow) {
	fd := f.queueFD
	buf := make([]byte, 1<<17)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	var pending []*flow // TCP flows with segments not yet ACKed
	for !c.stopReceivers.Load() {
		n, err := unix.Read(fd, buf)
		switch {
		case err == nil:
			if g := c.guestFrame(fd, buf[:n]); g != nil && !slices.Contains(pending, g) {
				pending = append(pending, g)
			}
		case errors.Is(err, unix.EAGAIN):
			for _, g := range pending {
				c.guestACK(fd, g)
			}
			pending = pending[:0]
			if _, err := unix.Poll(pfd, int(rcvTimeout/time.Millisecond)); err != nil && !errors.Is(err, unix.EINTR) {
				c.fail(fmt.Errorf("queue %d: poll: %w", f.idx, err))
				return
			}
		case errors.Is(err, unix.EINTR):
		default:
			c.fail(fmt.Errorf("queue %d: read: %w", f.idx, err))
			return
		}
	}
}

// guestFrame handles one frame the tap transmitted; it returns a TCP flow
// that owes an ACK.
func (c *cellRun) guestFrame(fd int, frame []byte) *flow {
	if c.size.Proto == protoTCP {
		t, ok := parseTCP(frame)
		if !ok {
			return nil
		}
		f := c.flowByPort(t.dstPort)
		if f == nil || f.guest == nil || t.srcPort != f.dstPort {
			return nil
		}
		if c.guestSegment(fd, f, t) {
			return f
		}
		return nil
	}
	dst, payload, ok := parseUDP(frame)
	if !ok {
		return nil
	}
	f := c.flowByPort(dst)
	if f == nil {
		return nil
	}
	f.rxPackets.Add(1)
	f.rxBytes.Add(uint64(payload))
	if c.size.Dir == roundTrip {
		if _, err := writeFrame(fd, f.response, nil); err != nil {
			c.fail(fmt.Errorf("flow %d: write response: %w", f.idx, err))
		}
	}
	return nil
}

// guestSegment is the guest's TCP receive path, reduced to what a bulk
// receiver needs: SYN-ACK, in-order data, and an immediate duplicate ACK
// for anything else so that the pod's sender retransmits a hole. It
// reports whether an ACK is owed.
func (c *cellRun) guestSegment(fd int, f *flow, t tcpInfo) bool {
	g := f.guest
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.flags&tcpSYN != 0 {
		if t.flags&tcpACK == 0 {
			// A SYN, or its retransmission: answer it the same way.
			g.synSeen, g.rcvNxt, g.tsRecent = true, t.seq+1, t.tsval
			g.ack = newTCPSegmenter(c.tap.mac, f.srcPort, f.dstPort, 0, t.hasTS, false)
			synAck := tcpControl(c.tap.mac, f.srcPort, f.dstPort, g.iss, g.rcvNxt, tcpSYN|tcpACK, synOptions(c.tsval(), t.tsval))
			if _, err := writeFrame(fd, synAck, nil); err != nil {
				c.fail(fmt.Errorf("flow %d: write SYN-ACK: %w", f.idx, err))
			}
		}
		return false
	}
	if !g.synSeen || t.payloadLen == 0 {
		return false
	}
	end := t.seq + uint32(t.payloadLen)
	switch {
	case t.seq == g.rcvNxt && len(g.ofo) == 0:
		g.rcvNxt = end
		g.tsRecent = t.tsval
		f.rxBytes.Add(uint64(t.payloadLen))
		f.rxPackets.Store(f.rxBytes.Load() / tcpMSS)
		if g.unacked++; g.unacked < ackEvery {
			return true
		}
	case int32(t.seq-g.rcvNxt) <= 0 && int32(end-g.rcvNxt) > 0:
		// Fills the hole (or overlaps what came): ACK at once, as a
		// receiver does when its out-of-order queue drains.
		g.tsRecent = t.tsval
		f.rxBytes.Add(uint64(g.advance(end)))
		f.rxPackets.Store(f.rxBytes.Load() / tcpMSS)
	case int32(t.seq-g.rcvNxt) > 0:
		f.retrans.Add(1) // beyond a hole: kept, and a duplicate ACK
		g.addOFO(t.seq, end)
	default:
		f.retrans.Add(1) // a duplicate
	}
	c.ackLocked(fd, f)
	return false
}

// guestACK sends flow f's ACK if segments are waiting for one.
func (c *cellRun) guestACK(fd int, f *flow) {
	g := f.guest
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unacked > 0 {
		c.ackLocked(fd, f)
	}
}

func (c *cellRun) ackLocked(fd int, f *flow) {
	g := f.guest
	g.unacked = 0
	frame := g.ack.segment(g.iss+1, g.rcvNxt, c.tsval(), g.tsRecent, 0)
	if _, err := writeFrame(fd, frame, nil); err != nil {
		c.fail(fmt.Errorf("flow %d: write ACK: %w", f.idx, err))
	}
	f.acks.Add(1)
}

// parseUDP returns the destination port and payload length of a UDP
// frame read from a tap queue (vnet header included).
func parseUDP(b []byte) (dstPort uint16, payload int, ok bool) {
	if len(b) < l4Off+udpHdrLen || binary.BigEndian.Uint16(b[vnetHdrLen+12:]) != unix.ETH_P_IP {
		return 0, 0, false
	}
	ip := b[l3Off:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_UDP || ihl < ipHdrLen || len(ip) < ihl+udpHdrLen {
		return 0, 0, false
	}
	udp := ip[ihl:]
	return binary.BigEndian.Uint16(udp[2:]), int(binary.BigEndian.Uint16(udp[4:])) - udpHdrLen, true
}

// podSockets opens and connects the pod's sockets of a host-to-guest or
// round-trip cell; it runs in the pod netns once the VMM side reads.
func (c *cellRun) podSockets() error {
	for _, f := range c.flows {
		typ := unix.SOCK_DGRAM
		if c.size.Proto == protoTCP {
			typ = unix.SOCK_STREAM
		}
		fd, err := unix.Socket(unix.AF_INET, typ|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f.sock = fd
		// Bounded blocking, so that workers notice stop; connect(2)
		// honours SO_SNDTIMEO too.
		tv := unix.NsecToTimeval(rcvTimeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
			return err
		}
		if err := setRcvTimeout(fd, rcvTimeout); err != nil {
			return err
		}
		if err := unix.Bind(fd, podSockaddr(f.dstPort)); err != nil {
			return fmt.Errorf("bind %d: %w", f.dstPort, err)
		}
		to := &unix.SockaddrInet4{Port: int(f.srcPort), Addr: writerIP}
		deadline := time.Now().Add(3 * time.Second)
		for {
			err = unix.Connect(fd, to)
			if err == nil || errors.Is(err, unix.EISCONN) {
				break
			}
			if !errors.Is(err, unix.EINPROGRESS) && !errors.Is(err, unix.EALREADY) && !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.EAGAIN) || time.Now().After(deadline) {
				return fmt.Errorf("flow %d: connect to the guest's port %d: %w", f.idx, f.srcPort, err)
			}
		}
	}
	return nil
}

// sendUDP is the pod's application sending datagrams to the guest as fast
// as its socket takes them, 64 per sendmmsg(2).
func (c *cellRun) sendUDP(f *flow) {
	payload := payloadBytes(c.size.Payload)
	msgs := make([]mmsghdr, recvBatch)
	iov := unix.Iovec{Base: &payload[0]}
	iov.SetLen(len(payload))
	for i := range msgs {
		msgs[i].hdr.Iov = &iov
		msgs[i].hdr.SetIovlen(1)
	}
	var frames uint64
	for !c.stopWriters.Load() {
		n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(f.sock), uintptr(unsafe.Pointer(&msgs[0])), uintptr(len(msgs)), 0, 0, 0)
		switch {
		case e == 0:
			frames += uint64(n)
			f.txFrames.Store(frames)
			f.txBytes.Store(frames * uint64(c.size.Payload))
		case e == unix.EAGAIN, e == unix.EINTR, e == unix.ENOBUFS:
		default:
			c.fail(fmt.Errorf("flow %d: sendmmsg: %w", f.idx, e))
			return
		}
	}
}

// sendTCP is the pod's application writing a bulk stream to the guest.
func (c *cellRun) sendTCP(f *flow) {
	buf := payloadBytes(128 << 10)
	var bytes uint64
	for !c.stopWriters.Load() {
		n, err := unix.Write(f.sock, buf)
		switch {
		case err == nil:
			bytes += uint64(n)
			f.txBytes.Store(bytes)
			f.txFrames.Store(bytes / tcpMSS)
		case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		default:
			c.fail(fmt.Errorf("flow %d: write: %w", f.idx, err))
			return
		}
	}
}

// roundTrips is the pod's application asking the guest one request at a
// time; it records each round trip while the cell measures.
func (c *cellRun) roundTrips(f *flow) {
	req := payloadBytes(c.size.Payload)
	resp := make([]byte, 2048)
	var sent, got uint64
	for !c.stopWriters.Load() {
		t0 := time.Now()
		if _, err := unix.Write(f.sock, req); err != nil {
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EINTR) && !errors.Is(err, unix.ENOBUFS) {
				c.fail(fmt.Errorf("flow %d: send request: %w", f.idx, err))
				return
			}
			continue
		}
		sent++
		f.txFrames.Store(sent)
		_, err := unix.Read(f.sock, resp)
		if err != nil {
			// Lost, or later than rcvTimeout: counted as loss. A late
			// response is read as the next request's: harmless at this rate.
			continue
		}
		rtt := time.Since(t0)
		got++
		f.rxPackets.Store(got)
		if c.measuring.Load() {
			f.rtts = append(f.rtts, rtt)
		}
	}
}

// percentile of sorted durations, in µs.
func percentileUs(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(p*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Microsecond)
}
