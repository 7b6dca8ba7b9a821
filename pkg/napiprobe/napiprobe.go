// Package napiprobe proves behaviourally that a tap queue fd carries NAPI.
//
// Device flags cannot tell whether a given queue was opened with IFF_NAPI:
// NAPI belongs to each queue file, and TUNGETIFF and sysfs report the flags
// of whoever attached first. What only a NAPI queue does is feed GRO: with
// gro_flush_timeout set on the tap, in-order TCP segments of one flow written
// back to back into a NAPI queue reach the tap's network namespace merged
// into fewer, larger skbs, while a plain queue hands each one to
// netif_receive_skb as it is. Run writes such segments and reports what an
// AF_PACKET socket in the namespace saw.
package napiprobe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/inet"
)

const (
	ethHdrLen = 14
	ipHdrLen  = 20
	tcpHdrLen = 20
	hdrsLen   = ethHdrLen + ipHdrLen + tcpHdrLen

	srcPort = 40000
	dstPort = 40001

	// recvTimeout bounds the wait after the last frame received. GRO holds
	// merged segments for gro_flush_timeout (typically well under 1ms), so
	// this is ample and still keeps a failed probe short.
	recvTimeout = 300 * time.Millisecond
)

var (
	// srcMAC is locally administered so it never collides with a real NIC.
	srcMAC = net.HardwareAddr{0x02, 0x6e, 0x61, 0x70, 0x69, 0x01}
	// TEST-NET-1 addresses (RFC 5737): nothing in the namespace owns them,
	// so the stack drops the segments after the packet socket has seen them.
	srcIP = net.IPv4(192, 0, 2, 1).To4()
	dstIP = net.IPv4(192, 0, 2, 2).To4()
)

// Result of one probe.
type Result struct {
	Tap        string // the tap's name
	Segments   int    // TCP segments written
	SegmentLen int    // TCP payload bytes per segment
	SKBLens    []int  // lengths of the frames the tap's netns received, as AF_PACKET saw them (L2 length)
}

// Merged reports whether GRO merged segments: any received frame longer than
// one segment's frame.
func (r Result) Merged() bool {
	for _, l := range r.SKBLens {
		if l > hdrsLen+r.SegmentLen {
			return true
		}
	}
	return false
}

// String tells what came out of the tap and what that means, e.g. "16
// segments of 1054 B came out of tap0 as 1 skb of 16054 B: GRO merged them,
// the queue has NAPI".
func (r Result) String() string {
	seg := hdrsLen + r.SegmentLen
	head := fmt.Sprintf("%d segments of %d B", r.Segments, seg)
	if len(r.SKBLens) == 0 {
		return fmt.Sprintf("none of the %s came out of %s", head, r.Tap)
	}
	lens := make([]string, len(r.SKBLens))
	same := true
	for i, l := range r.SKBLens {
		lens[i] = strconv.Itoa(l)
		same = same && l == r.SKBLens[0]
	}
	skbs := "1 skb of " + lens[0] + " B"
	switch {
	case len(lens) > 1 && same:
		skbs = fmt.Sprintf("%d skbs of %s B", len(lens), lens[0])
	case len(lens) > 1:
		skbs = fmt.Sprintf("%d skbs of %s B", len(lens), strings.Join(lens, "+"))
	}
	verdict := "GRO merged them, the queue has NAPI"
	if !r.Merged() {
		verdict = "GRO merged nothing: the queue has no NAPI, or the tap's gro_flush_timeout is unset or too short"
	}
	return fmt.Sprintf("%s came out of %s as %s: %s", head, r.Tap, skbs, verdict)
}

// RunQueue is Run on queue alone: the tap's name, network namespace and
// virtio-net header length come from the fd (TUNGETIFF, TUNGETDEVNETNS of
// Linux 5.2+, TUNGETVNETHDRSZ), so a program handed queue fds, as
// `napitapctl exec` hands them, needs nothing else. It needs CAP_NET_ADMIN
// over the tap's netns.
func RunQueue(queue *os.File, segments, segmentLen int) (Result, error) {
	res := Result{Segments: segments, SegmentLen: segmentLen}
	fd := int(queue.Fd())
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return res, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return res, fmt.Errorf("%s: not an attached tap queue: TUNGETIFF: %w", queue.Name(), err)
	}
	res.Tap = ifr.Name()
	vnetHdrLen := 0
	if ifr.Uint16()&unix.IFF_VNET_HDR != 0 {
		if vnetHdrLen, err = unix.IoctlGetInt(fd, unix.TUNGETVNETHDRSZ); err != nil {
			return res, fmt.Errorf("tap %q (%s): TUNGETVNETHDRSZ: %w", res.Tap, queue.Name(), err)
		}
	}
	nsfd, err := unix.IoctlRetInt(fd, unix.TUNGETDEVNETNS)
	if err != nil {
		return res, fmt.Errorf("tap %q (%s): TUNGETDEVNETNS: %w", res.Tap, queue.Name(), err)
	}
	netns := os.NewFile(uintptr(nsfd), "netns of "+res.Tap)
	defer netns.Close()
	return Run(fmt.Sprintf("/proc/self/fd/%d", nsfd), res.Tap, queue, vnetHdrLen, segments, segmentLen)
}

// Run writes `segments` in-order TCP segments of one flow into queue, an
// attached tap queue fd whose device has a virtio-net header of vnetHdrLen
// bytes (0 when the tap has no IFF_VNET_HDR; 10 or 12 otherwise), and reports
// the lengths of what the tap's network namespace (netnsPath) received on
// tapName. A NAPI queue with gro_flush_timeout set on the device merges them;
// a plain queue never does.
//
// The tap must be up. Run does not set gro_flush_timeout: that is the
// caller's, as is the choice of a value.
func Run(netnsPath, tapName string, queue *os.File, vnetHdrLen int, segments, segmentLen int) (Result, error) {
	res := Result{Tap: tapName, Segments: segments, SegmentLen: segmentLen}
	switch {
	case queue == nil:
		return res, fmt.Errorf("tap %q in netns %s: no queue fd", tapName, netnsPath)
	case vnetHdrLen != 0 && vnetHdrLen < 10:
		return res, fmt.Errorf("tap %q in netns %s: virtio-net header of %d bytes, want 0 or at least 10", tapName, netnsPath, vnetHdrLen)
	case segments < 1 || segmentLen < 1 || segmentLen > 0xffff-ipHdrLen-tcpHdrLen:
		return res, fmt.Errorf("tap %q in netns %s: invalid probe of %d segments of %d bytes", tapName, netnsPath, segments, segmentLen)
	}

	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		link, err := netlink.LinkByName(tapName)
		if err != nil {
			return err
		}
		attrs := link.Attrs()
		if attrs.Flags&net.FlagUp == 0 {
			return errors.New("link is down")
		}

		// The socket must exist before the first write, or the first
		// (possibly merged) skb is gone before anyone looks.
		sock, err := openPacketSocket(attrs.Index)
		if err != nil {
			return err
		}
		defer unix.Close(sock)

		payload := make([]byte, segmentLen)
		for i := range payload {
			payload[i] = byte(i)
		}
		buf := make([]byte, vnetHdrLen+hdrsLen+segmentLen)
		for i := 0; i < segments; i++ {
			// The zero vnet header means flags 0 and GSO_NONE: the skb
			// arrives CHECKSUM_NONE, which is why GRO needs correct checksums.
			clear(buf[:vnetHdrLen])
			buildFrame(buf[vnetHdrLen:], attrs.HardwareAddr, uint16(i+1), uint32(1+i*segmentLen), payload)
			// One write(2) per frame, as a VMM without vhost-net does.
			if _, err := queue.Write(buf); err != nil {
				return fmt.Errorf("writing segment %d: %w", i, err)
			}
		}

		res.SKBLens, err = receive(sock, segments*segmentLen)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("tap %q in netns %s: NAPI probe: %w", tapName, netnsPath, err)
	}
	return res, nil
}

// openPacketSocket returns an AF_PACKET socket that sees the IPv4 frames
// arriving on ifindex.
func openPacketSocket(ifindex int) (int, error) {
	// Protocol 0 receives nothing until bind, so no frame of another
	// interface slips in between socket and bind.
	sock, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening packet socket: %w", err)
	}
	// Room for every segment even unmerged; FORCE lifts rmem_max for root.
	const rcvbuf = 4 << 20
	if unix.SetsockoptInt(sock, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, rcvbuf) != nil {
		_ = unix.SetsockoptInt(sock, unix.SOL_SOCKET, unix.SO_RCVBUF, rcvbuf)
	}
	tv := unix.NsecToTimeval(recvTimeout.Nanoseconds())
	if err := unix.SetsockoptTimeval(sock, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(sock)
		return -1, fmt.Errorf("setting packet socket timeout: %w", err)
	}
	// ETH_P_ALL taps see frames before tc ingress; an ETH_P_IP one would
	// miss everything a tc-redirect wiring moves to the peer.
	sa := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifindex}
	if err := unix.Bind(sock, sa); err != nil {
		unix.Close(sock)
		return -1, fmt.Errorf("binding packet socket: %w", err)
	}
	return sock, nil
}

// receive collects the L2 lengths of the probe flow's incoming frames until
// they carry want payload bytes or nothing arrives for recvTimeout.
func receive(sock, want int) ([]int, error) {
	var lens []int
	// Large enough for the headers of a 64 KiB GRO skb; MSG_TRUNC makes
	// recvfrom report the full length anyway.
	buf := make([]byte, 1<<17)
	for got := 0; got < want; {
		n, from, err := unix.Recvfrom(sock, buf, unix.MSG_TRUNC)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return lens, nil // timed out: report what arrived
		case err != nil:
			return lens, fmt.Errorf("reading packet socket: %w", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		if !isProbeFrame(buf[:min(n, len(buf))]) {
			continue
		}
		lens = append(lens, n)
		got += n - hdrsLen
	}
	return lens, nil
}

// isProbeFrame reports whether frame is IPv4 TCP from srcPort to dstPort.
func isProbeFrame(frame []byte) bool {
	if len(frame) < hdrsLen || binary.BigEndian.Uint16(frame[12:]) != unix.ETH_P_IP {
		return false
	}
	ip := frame[ethHdrLen:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[9] != unix.IPPROTO_TCP || len(ip) < ihl+tcpHdrLen {
		return false
	}
	tcp := ip[ihl:]
	return binary.BigEndian.Uint16(tcp[0:]) == srcPort && binary.BigEndian.Uint16(tcp[2:]) == dstPort
}

// buildFrame writes into b (hdrsLen+len(payload) bytes) an Ethernet frame
// carrying one TCP segment of the probe flow with sequence number seq.
// Everything GRO compares between segments (addresses, ports, flags, ack,
// window, options) is fixed; only the IP ID and sequence number advance.
func buildFrame(b []byte, dst net.HardwareAddr, ipID uint16, seq uint32, payload []byte) {
	copy(b[0:6], dst)
	copy(b[6:12], srcMAC)
	binary.BigEndian.PutUint16(b[12:], unix.ETH_P_IP)

	ip := b[ethHdrLen : ethHdrLen+ipHdrLen]
	ip[0] = 0x45 // IPv4, no options
	ip[1] = 0
	binary.BigEndian.PutUint16(ip[2:], uint16(ipHdrLen+tcpHdrLen+len(payload)))
	binary.BigEndian.PutUint16(ip[4:], ipID)
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = 64
	ip[9] = unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(ip[10:], 0)
	copy(ip[12:16], srcIP)
	copy(ip[16:20], dstIP)
	binary.BigEndian.PutUint16(ip[10:], inet.Checksum(ip, 0))

	tcp := b[ethHdrLen+ipHdrLen:]
	binary.BigEndian.PutUint16(tcp[0:], srcPort)
	binary.BigEndian.PutUint16(tcp[2:], dstPort)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], 1) // ack
	tcp[12] = (tcpHdrLen / 4) << 4
	// ACK only: PSH would make GRO flush after each segment.
	tcp[13] = 0x10
	binary.BigEndian.PutUint16(tcp[14:], 0xffff) // window
	binary.BigEndian.PutUint16(tcp[16:], 0)      // checksum
	binary.BigEndian.PutUint16(tcp[18:], 0)      // urgent pointer
	copy(tcp[tcpHdrLen:], payload)
	tcp = tcp[:tcpHdrLen+len(payload)]
	binary.BigEndian.PutUint16(tcp[16:], inet.Checksum(tcp, inet.PseudoHeaderSum(ip[12:16], ip[16:20], unix.IPPROTO_TCP, len(tcp))))
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
