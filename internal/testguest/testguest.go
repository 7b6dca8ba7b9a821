// Package testguest is a tiny userspace stand-in for a VM guest behind a
// tap, for traffic tests that cannot boot a VM. It reads frames from tap
// queue fds as a VMM without vhost-net would, and answers ARP requests, UDP
// datagrams (echoed) and ICMP echo requests addressed to its IPv4 address.
package testguest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/napitap/napitap/pkg/inet"
)

const (
	ethHdrLen  = 14
	ipv4HdrLen = 20
	arpLen     = 28

	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806

	protoICMP = 1
	protoUDP  = 17
)

// Guest answers for one MAC and IPv4 address. Its fields must be set
// before Serve and not changed while it runs; a Guest must not be copied
// after first use.
type Guest struct {
	MAC        net.HardwareAddr
	IP         net.IP // IPv4
	VnetHdrLen int    // bytes of virtio-net header before each frame (0, 10, 12)

	frames, arpReplies, udpEchoes, icmpEchoes atomic.Int64
}

// Stats counts what a Guest saw and answered, over all queues.
type Stats struct {
	Frames     int // frames read, answered or not
	ARPReplies int
	UDPEchoes  int
	ICMPEchoes int
}

// Stats returns a snapshot of the counters.
func (g *Guest) Stats() Stats {
	return Stats{
		Frames:     int(g.frames.Load()),
		ARPReplies: int(g.arpReplies.Load()),
		UDPEchoes:  int(g.udpEchoes.Load()),
		ICMPEchoes: int(g.icmpEchoes.Load()),
	}
}

// Serve reads frames from the tap queue fds (one goroutine per fd), answers
// ARP requests for g.IP, echoes UDP datagrams addressed to g.IP (MACs, IPs
// and ports swapped, same payload, valid checksums) and answers ICMP echo
// requests, each reply on the queue its request came from. It returns nil
// once ctx is cancelled, or the first error reading or writing a queue.
//
// Cancellation works by setting a read deadline in the past, so every queue
// must support SetReadDeadline: an fd made non-blocking (unix.SetNonblock)
// before os.NewFile, so that Go's poller manages it. The fd must already be
// attached (TUNSETIFF) when os.NewFile sees it: an unattached tun fd polls
// as EPOLLERR, and the poller then fails every read with "not pollable".
// Serve clears the deadlines before it returns; it never closes the queues.
func (g *Guest) Serve(ctx context.Context, queues []*os.File) error {
	ip := g.IP.To4()
	switch {
	case ip == nil:
		return fmt.Errorf("guest IP %v is not IPv4", g.IP)
	case len(g.MAC) != 6:
		return fmt.Errorf("guest MAC %v is not an Ethernet address", g.MAC)
	case g.VnetHdrLen < 0:
		return fmt.Errorf("negative virtio-net header length %d", g.VnetHdrLen)
	case len(queues) == 0:
		return errors.New("no queues to serve")
	}
	for _, q := range queues {
		// Also clears any deadline the caller left behind.
		if err := q.SetReadDeadline(time.Time{}); err != nil {
			return fmt.Errorf("queue %s: Serve needs a file with read deadlines (a non-blocking fd given to os.NewFile): %w", q.Name(), err)
		}
	}
	defer func() {
		for _, q := range queues {
			_ = q.SetReadDeadline(time.Time{})
		}
	}()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Wake every blocked Read when ctx ends, whether the caller or a failing
	// sibling queue ended it.
	stop := context.AfterFunc(ctx, func() {
		for _, q := range queues {
			_ = q.SetReadDeadline(time.Unix(1, 0))
		}
	})
	defer stop()

	errc := make(chan error, len(queues))
	for _, q := range queues {
		go func() { errc <- g.serveQueue(ctx, q, ip) }()
	}
	var first error
	for range queues {
		if err := <-errc; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

func (g *Guest) serveQueue(ctx context.Context, q *os.File, ip net.IP) error {
	// Room for a 64 KiB frame: the tap hands out whole frames or nothing.
	buf := make([]byte, g.VnetHdrLen+ethHdrLen+65535)
	out := make([]byte, len(buf))
	for {
		n, err := q.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading queue %s: %w", q.Name(), err)
		}
		if n < g.VnetHdrLen {
			continue
		}
		g.frames.Add(1)
		// The vnet header of a reply is all zero: no offloads, no GSO.
		clear(out[:g.VnetHdrLen])
		m := g.reply(out[g.VnetHdrLen:], buf[g.VnetHdrLen:n], ip)
		if m == 0 {
			continue
		}
		if _, err := q.Write(out[:g.VnetHdrLen+m]); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("writing queue %s: %w", q.Name(), err)
		}
	}
}

// reply writes the answer to frame into out and returns its length, or 0
// when frame needs none.
func (g *Guest) reply(out, frame []byte, ip net.IP) int {
	if len(frame) < ethHdrLen {
		return 0
	}
	dst := frame[0:6]
	forUs := bytes.Equal(dst, g.MAC)
	copy(out[0:6], frame[6:12])
	copy(out[6:12], g.MAC)
	copy(out[12:14], frame[12:14])
	switch binary.BigEndian.Uint16(frame[12:]) {
	case etherTypeARP:
		if !forUs && !bytes.Equal(dst, broadcast) {
			return 0
		}
		if n := arpReply(out[ethHdrLen:], frame[ethHdrLen:], g.MAC, ip); n > 0 {
			g.arpReplies.Add(1)
			return ethHdrLen + n
		}
	case etherTypeIPv4:
		if !forUs {
			return 0
		}
		n, proto := ipv4Reply(out[ethHdrLen:], frame[ethHdrLen:], ip)
		if n == 0 {
			return 0
		}
		switch proto {
		case protoUDP:
			g.udpEchoes.Add(1)
		case protoICMP:
			g.icmpEchoes.Add(1)
		}
		return ethHdrLen + n
	}
	return 0
}

var broadcast = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// arpReply answers an Ethernet/IPv4 ARP request for ip.
func arpReply(out, req []byte, mac net.HardwareAddr, ip net.IP) int {
	if len(req) < arpLen ||
		binary.BigEndian.Uint16(req[0:]) != 1 || // Ethernet
		binary.BigEndian.Uint16(req[2:]) != etherTypeIPv4 ||
		req[4] != 6 || req[5] != 4 ||
		binary.BigEndian.Uint16(req[6:]) != 1 || // request
		!bytes.Equal(req[24:28], ip) {
		return 0
	}
	copy(out[0:6], req[0:6])
	binary.BigEndian.PutUint16(out[6:], 2) // reply
	copy(out[8:14], mac)
	copy(out[14:18], ip)
	copy(out[18:28], req[8:18]) // the asker's MAC and IP become the target
	return arpLen
}

// ipv4Reply answers a UDP datagram or ICMP echo request addressed to ip
// with a fresh option-less IPv4 header. It returns the reply's length and
// protocol, or 0 when there is nothing to answer.
func ipv4Reply(out, pkt []byte, ip net.IP) (int, int) {
	if len(pkt) < ipv4HdrLen || pkt[0]>>4 != 4 {
		return 0, 0
	}
	ihl := int(pkt[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(pkt[2:]))
	// Fragments (MF set or non-zero offset) are not reassembled here.
	if ihl < ipv4HdrLen || total < ihl || total > len(pkt) ||
		binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 ||
		!bytes.Equal(pkt[16:20], ip) {
		return 0, 0
	}
	l4 := pkt[ihl:total]
	r := out[ipv4HdrLen : ipv4HdrLen+len(l4)]
	proto := int(pkt[9])
	switch proto {
	case protoUDP:
		if len(l4) < 8 || int(binary.BigEndian.Uint16(l4[4:])) != len(l4) {
			return 0, 0
		}
		copy(r, l4)
		copy(r[0:2], l4[2:4])
		copy(r[2:4], l4[0:2])
		binary.BigEndian.PutUint16(r[6:], 0)
		// 0 means "no checksum" in UDP, so a computed 0 is sent as 0xffff.
		sum := inet.Checksum(r, inet.PseudoHeaderSum(ip, pkt[12:16], protoUDP, len(r)))
		if sum == 0 {
			sum = 0xffff
		}
		binary.BigEndian.PutUint16(r[6:], sum)
	case protoICMP:
		if len(l4) < 8 || l4[0] != 8 || l4[1] != 0 { // echo request
			return 0, 0
		}
		copy(r, l4)
		r[0] = 0 // echo reply
		binary.BigEndian.PutUint16(r[2:], 0)
		binary.BigEndian.PutUint16(r[2:], inet.Checksum(r, 0))
	default:
		return 0, 0
	}

	h := out[:ipv4HdrLen]
	h[0] = 0x45
	h[1] = pkt[1]
	binary.BigEndian.PutUint16(h[2:], uint16(ipv4HdrLen+len(r)))
	copy(h[4:6], pkt[4:6]) // reuse the ID: one reply per request
	binary.BigEndian.PutUint16(h[6:], 0)
	h[8] = 64
	h[9] = byte(proto)
	binary.BigEndian.PutUint16(h[10:], 0)
	copy(h[12:16], ip)
	copy(h[16:20], pkt[12:16])
	binary.BigEndian.PutUint16(h[10:], inet.Checksum(h, 0))
	return ipv4HdrLen + len(r), proto
}
