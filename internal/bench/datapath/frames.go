package datapath

import (
	"encoding/binary"
	"net"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/inet"
)

// Frame layout as a VMM without vhost-net writes it into a queue fd: a
// 12-byte virtio-net header (struct virtio_net_hdr_v1, what QEMU, Cloud
// Hypervisor and Firecracker use; TUNSETVNETHDRSZ 12), then the Ethernet
// frame, one frame per write(2).
const (
	vnetHdrLen = 12
	ethHdrLen  = 14
	ipHdrLen   = 20
	udpHdrLen  = 8
	tcpHdrLen  = 20 // without options
	tcpTSLen   = 32 // with NOP NOP TS, what a Linux guest sends
	l3Off      = vnetHdrLen + ethHdrLen
	l4Off      = l3Off + ipHdrLen

	// tcpMSS is the payload of a full-sized segment with timestamps on a
	// 1500-byte MTU, the GSO segment size of the 64 KB case.
	tcpMSS = 1448
	// maxGSOPayload is what fits one IPv4 packet with a 32-byte TCP header.
	maxGSOPayload = 0xffff - ipHdrLen - tcpTSLen

	vnetFlagNeedsCsum = 1 // VIRTIO_NET_HDR_F_NEEDS_CSUM
	vnetGSOTCPv4      = 1 // VIRTIO_NET_HDR_GSO_TCPV4

	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpRST = 0x04
	tcpACK = 0x10

	// ourWScale is the window scale the guest side announces: 0xffff << 7,
	// 8 MiB, never closes, since it consumes what arrives at once.
	ourWScale = 7
)

var (
	// writerMAC and writerIP are the "guest" behind the tap: the pod netns
	// has a permanent neighbour entry for them, so the kernel's ACKs go out
	// of the tap without ARP. 198.18.0.0/15 is the benchmarking range
	// (RFC 2544).
	writerMAC = net.HardwareAddr{0x02, 0x6e, 0x61, 0x70, 0x64, 0x01}
	writerIP  = [4]byte{198, 18, 0, 1}
	podIP     = [4]byte{198, 18, 0, 2}
)

const podPrefixLen = 24

// vnetHdr is struct virtio_net_hdr_v1 without num_buffers, which a
// transmitting VMM leaves 0. Fields are in the guest's (here: native)
// byte order: tun without IFF_VNET_LE uses the legacy native-endian layout.
type vnetHdr struct {
	flags      uint8
	gsoType    uint8
	hdrLen     uint16
	gsoSize    uint16
	csumStart  uint16
	csumOffset uint16
}

func (h vnetHdr) put(b []byte) {
	b[0] = h.flags
	b[1] = h.gsoType
	binary.NativeEndian.PutUint16(b[2:], h.hdrLen)
	binary.NativeEndian.PutUint16(b[4:], h.gsoSize)
	binary.NativeEndian.PutUint16(b[6:], h.csumStart)
	binary.NativeEndian.PutUint16(b[8:], h.csumOffset)
	binary.NativeEndian.PutUint16(b[10:], 0)
}

// putEthIPv4 writes the Ethernet and IPv4 headers at b[vnetHdrLen:] for an
// L4 payload of l4Len bytes and returns the IPv4 header.
func putEthIPv4(b []byte, dstMAC net.HardwareAddr, proto uint8, ipID uint16, l4Len int) []byte {
	eth := b[vnetHdrLen:]
	copy(eth[0:6], dstMAC)
	copy(eth[6:12], writerMAC)
	binary.BigEndian.PutUint16(eth[12:], unix.ETH_P_IP)
	ip := b[l3Off : l3Off+ipHdrLen]
	ip[0] = 0x45
	ip[1] = 0
	binary.BigEndian.PutUint16(ip[2:], uint16(ipHdrLen+l4Len))
	binary.BigEndian.PutUint16(ip[4:], ipID)
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = 64
	ip[9] = proto
	copy(ip[12:16], writerIP[:])
	copy(ip[16:20], podIP[:])
	setIPv4Checksum(ip)
	return ip
}

func setIPv4Checksum(ip []byte) {
	binary.BigEndian.PutUint16(ip[10:], 0)
	binary.BigEndian.PutUint16(ip[10:], inet.Checksum(ip[:ipHdrLen], 0))
}

// pseudoSum is the unfolded IPv4 pseudo-header sum of an L4 segment of
// l4Len bytes from the writer to the pod.
func pseudoSum(proto uint8, l4Len int) uint32 {
	return inet.PseudoHeaderSum(writerIP[:], podIP[:], proto, l4Len)
}

// partialCsum is what a guest leaves in the L4 checksum field with
// NEEDS_CSUM: the folded pseudo-header sum, not complemented; the host
// (or nobody, for local delivery) completes it.
func partialCsum(proto uint8, l4Len int) uint16 {
	return ^inet.Checksum(nil, pseudoSum(proto, l4Len))
}

// foldedSum is the folded one's complement sum of b (not complemented),
// to be added to a later checksum.
func foldedSum(b []byte) uint32 { return uint32(^inet.Checksum(b, 0)) }

func payloadBytes(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return p
}

// buildUDPFrame returns a complete write(2) buffer: vnet header and one UDP
// datagram of payloadLen bytes to the pod. The checksum is complete and the
// vnet header all zero (CHECKSUM_NONE: the kernel verifies it).
func buildUDPFrame(dstMAC net.HardwareAddr, srcPort, dstPort uint16, payloadLen int) []byte {
	l4Len := udpHdrLen + payloadLen
	b := make([]byte, l4Off+l4Len)
	putEthIPv4(b, dstMAC, unix.IPPROTO_UDP, 1, l4Len)
	udp := b[l4Off:]
	binary.BigEndian.PutUint16(udp[0:], srcPort)
	binary.BigEndian.PutUint16(udp[2:], dstPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(l4Len))
	copy(udp[udpHdrLen:], payloadBytes(payloadLen))
	vnetHdr{}.put(b)
	c := inet.Checksum(udp, pseudoSum(unix.IPPROTO_UDP, l4Len))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	return b
}

// tcpControl builds a control segment (SYN, ACK of the handshake) with
// the given options and a full checksum.
func tcpControl(dstMAC net.HardwareAddr, srcPort, dstPort uint16, seq, ack uint32, flags uint8, opts []byte) []byte {
	thl := tcpHdrLen + len(opts)
	b := make([]byte, l4Off+thl)
	vnetHdr{}.put(b)
	putEthIPv4(b, dstMAC, unix.IPPROTO_TCP, 0, thl)
	tcp := b[l4Off:]
	binary.BigEndian.PutUint16(tcp[0:], srcPort)
	binary.BigEndian.PutUint16(tcp[2:], dstPort)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = byte(thl/4) << 4
	tcp[13] = flags
	binary.BigEndian.PutUint16(tcp[14:], 0xffff)
	copy(tcp[tcpHdrLen:], opts)
	binary.BigEndian.PutUint16(tcp[16:], inet.Checksum(tcp, pseudoSum(unix.IPPROTO_TCP, thl)))
	return b
}

// synOptions: MSS 1460, window scale, timestamps, as a Linux guest offers
// (without SACK: neither side of the benchmark needs it); tsecr echoes a
// SYN's tsval in a SYN-ACK.
func synOptions(tsval, tsecr uint32) []byte {
	o := []byte{2, 4, 0x05, 0xb4, 1, 3, 3, ourWScale, 1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(o[12:], tsval)
	binary.BigEndian.PutUint32(o[16:], tsecr)
	return o
}

func tsOptions(tsval, tsecr uint32) []byte {
	o := []byte{1, 1, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(o[4:], tsval)
	binary.BigEndian.PutUint32(o[8:], tsecr)
	return o
}

// tcpSegmenter writes data segments of one flow into one reusable buffer,
// changing only what changes from segment to segment, so the writer does
// per frame about what a guest's virtio-net driver hands the VMM.
type tcpSegmenter struct {
	buf        []byte
	thl        int  // TCP header length: 32 with timestamps, else 20
	ts         bool // timestamps negotiated
	gso        bool // 64 KB frames with a GSO vnet header, NEEDS_CSUM
	payloadSum uint32
	fullLen    int // payload of a full frame
	ipID       uint16
}

func newTCPSegmenter(dstMAC net.HardwareAddr, srcPort, dstPort uint16, payload int, ts, gso bool) *tcpSegmenter {
	s := &tcpSegmenter{thl: tcpHdrLen, ts: ts, gso: gso, fullLen: payload}
	if ts {
		s.thl = tcpTSLen
	}
	s.buf = make([]byte, l4Off+s.thl+payload)
	p := payloadBytes(payload)
	copy(s.buf[l4Off+s.thl:], p)
	s.payloadSum = foldedSum(p)
	putEthIPv4(s.buf, dstMAC, unix.IPPROTO_TCP, 0, s.thl+payload)
	tcp := s.buf[l4Off:]
	binary.BigEndian.PutUint16(tcp[0:], srcPort)
	binary.BigEndian.PutUint16(tcp[2:], dstPort)
	tcp[12] = byte(s.thl/4) << 4
	// ACK only: PSH makes GRO flush after every segment, and a guest sets
	// it only at the end of a send.
	tcp[13] = tcpACK
	binary.BigEndian.PutUint16(tcp[14:], 0xffff)
	if ts {
		copy(tcp[tcpHdrLen:], []byte{1, 1, 8, 10})
	}
	h := vnetHdr{}
	if gso {
		h = vnetHdr{flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, hdrLen: uint16(ethHdrLen + ipHdrLen + s.thl),
			gsoSize: tcpMSS, csumStart: ethHdrLen + ipHdrLen, csumOffset: 16}
	}
	h.put(s.buf)
	return s
}

// segment fills in a segment of n payload bytes (n <= fullLen; only GSO
// frames shrink, to fit a small window) and returns the write buffer.
func (s *tcpSegmenter) segment(seq, ack, tsval, tsecr uint32, n int) []byte {
	l4Len := s.thl + n
	ip := s.buf[l3Off : l3Off+ipHdrLen]
	binary.BigEndian.PutUint16(ip[2:], uint16(ipHdrLen+l4Len))
	binary.BigEndian.PutUint16(ip[4:], s.ipID)
	if s.gso {
		s.ipID += uint16((n + tcpMSS - 1) / tcpMSS)
	} else {
		s.ipID++
	}
	setIPv4Checksum(ip)
	tcp := s.buf[l4Off : l4Off+l4Len]
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	if s.ts {
		binary.BigEndian.PutUint32(tcp[24:], tsval)
		binary.BigEndian.PutUint32(tcp[28:], tsecr)
	}
	if s.gso {
		binary.BigEndian.PutUint16(tcp[16:], partialCsum(unix.IPPROTO_TCP, l4Len))
	} else {
		// The payload never changes: only the header is summed per frame.
		binary.BigEndian.PutUint16(tcp[16:], 0)
		sum := pseudoSum(unix.IPPROTO_TCP, l4Len)
		if n == s.fullLen {
			sum += s.payloadSum
		} else {
			sum += foldedSum(tcp[s.thl:])
		}
		binary.BigEndian.PutUint16(tcp[16:], inet.Checksum(tcp[:s.thl], sum))
	}
	return s.buf[:l4Off+l4Len]
}

// tcpInfo is what the writer needs from a segment the kernel sent out of
// the tap.
type tcpInfo struct {
	srcPort, dstPort uint16
	seq, ack         uint32
	flags            uint8
	win              uint16
	payloadLen       int
	wscale           int // -1: no window scale option
	hasTS            bool
	tsval, tsecr     uint32
}

// parseTCP parses a frame read from a tap queue (vnet header included).
func parseTCP(b []byte) (tcpInfo, bool) {
	var t tcpInfo
	if len(b) < l4Off+tcpHdrLen || binary.BigEndian.Uint16(b[vnetHdrLen+12:]) != unix.ETH_P_IP {
		return t, false
	}
	ip := b[l3Off:]
	ihl := int(ip[0]&0x0f) * 4
	totLen := int(binary.BigEndian.Uint16(ip[2:]))
	if ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_TCP || ihl < ipHdrLen || totLen > len(ip) || totLen < ihl+tcpHdrLen {
		return t, false
	}
	tcp := ip[ihl:totLen]
	thl := int(tcp[12]>>4) * 4
	if thl < tcpHdrLen || thl > len(tcp) {
		return t, false
	}
	t.srcPort = binary.BigEndian.Uint16(tcp[0:])
	t.dstPort = binary.BigEndian.Uint16(tcp[2:])
	t.seq = binary.BigEndian.Uint32(tcp[4:])
	t.ack = binary.BigEndian.Uint32(tcp[8:])
	t.flags = tcp[13]
	t.win = binary.BigEndian.Uint16(tcp[14:])
	t.payloadLen = len(tcp) - thl
	t.wscale = -1
	opts := tcp[tcpHdrLen:thl]
	for len(opts) > 0 {
		kind := opts[0]
		if kind == 0 {
			break
		}
		if kind == 1 {
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || int(opts[1]) < 2 || int(opts[1]) > len(opts) {
			break
		}
		o := opts[:opts[1]]
		switch {
		case kind == 3 && len(o) == 3:
			t.wscale = int(min(o[2], 14))
		case kind == 8 && len(o) == 10:
			t.hasTS = true
			t.tsval = binary.BigEndian.Uint32(o[2:])
			t.tsecr = binary.BigEndian.Uint32(o[6:])
		}
		opts = opts[len(o):]
	}
	return t, true
}
