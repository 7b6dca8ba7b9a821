package napiprobe

import (
	"encoding/binary"
	"net"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/inet"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func TestBuildFrameChecksums(t *testing.T) {
	dst := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x2a}
	for _, payloadLen := range []int{1, 2, 999, 1000, 1448} {
		payload := make([]byte, payloadLen)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		frame := make([]byte, hdrsLen+payloadLen)
		buildFrame(frame, dst, 0x1234, 0xfffffff0, payload)

		if got := net.HardwareAddr(frame[0:6]).String(); got != dst.String() {
			t.Errorf("payload %d: dst MAC %s, want %s", payloadLen, got, dst)
		}
		ip := frame[ethHdrLen : ethHdrLen+ipHdrLen]
		// A correct checksum makes the sum over the whole header 0xffff,
		// i.e. inet.Checksum of it 0.
		if c := inet.Checksum(ip, 0); c != 0 {
			t.Errorf("payload %d: IPv4 header does not check: residue %#04x", payloadLen, c)
		}
		if got := int(binary.BigEndian.Uint16(ip[2:])); got != ipHdrLen+tcpHdrLen+payloadLen {
			t.Errorf("payload %d: IPv4 total length %d", payloadLen, got)
		}
		if ip[6]&0x40 == 0 {
			t.Errorf("payload %d: DF not set", payloadLen)
		}
		tcp := frame[ethHdrLen+ipHdrLen:]
		if c := inet.Checksum(tcp, inet.PseudoHeaderSum(ip[12:16], ip[16:20], ip[9], len(tcp))); c != 0 {
			t.Errorf("payload %d: TCP segment does not check: residue %#04x", payloadLen, c)
		}
		if tcp[13] != 0x10 {
			t.Errorf("payload %d: TCP flags %#02x, want ACK only", payloadLen, tcp[13])
		}
		if !isProbeFrame(frame) {
			t.Errorf("payload %d: frame not recognised as the probe flow", payloadLen)
		}
	}
}

func TestRun(t *testing.T) {
	nstest.RequireRoot(t)

	const (
		tapName    = "napiprobe0"
		vnetHdrLen = 12
		segments   = 16
		segmentLen = 1000
	)
	groFlushTimeout := uint64(200_000)
	tests := []struct {
		name       string
		napi       bool
		wantMerged bool
	}{
		{name: "a queue opened with IFF_NAPI merges segments in GRO", napi: true, wantMerged: true},
		{name: "a queue opened without IFF_NAPI does not merge", napi: false, wantMerged: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			netns := nstest.New(t, "probe")
			flags := tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: tt.napi}
			var queue *os.File
			netns.Run(t, func() error {
				// TUNSETIFF silently drops flags it does not know.
				if err := tapsetup.CheckFeatures(flags); err != nil {
					return err
				}
				tap, queues, err := tapsetup.Create(tapsetup.Spec{Name: tapName, Queues: 1, Flags: flags, VnetHdrSize: vnetHdrLen})
				if err != nil {
					return err
				}
				queue = queues[0]
				// The tap is persistent: the queue goes first, then the
				// device, then (nstest's earlier cleanup) the netns.
				t.Cleanup(func() {
					tapsetup.CloseQueues(queues)
					if err := netns.Do(func(ns.NetNS) error { return tapsetup.DeleteTap(tapName, "") }); err != nil {
						t.Errorf("deleting tap %q in netns %s: %v", tapName, netns.Name, err)
					}
				})
				return netlink.LinkSetUp(tap)
			})
			knobs := tapsetup.NAPIKnobs{GROFlushTimeout: &groFlushTimeout}
			if err := tapsetup.ApplyNAPIKnobs(netns.Path(), tapName, knobs); err != nil {
				t.Fatal(err)
			}

			res, err := Run(netns.Path(), tapName, queue, vnetHdrLen, segments, segmentLen)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("received frame lengths: %v", res.SKBLens)

			total := 0
			for _, l := range res.SKBLens {
				total += l - hdrsLen
			}
			if total != segments*segmentLen {
				t.Errorf("received %d payload bytes, want %d", total, segments*segmentLen)
			}
			if got := res.Merged(); got != tt.wantMerged {
				t.Errorf("Merged() = %v, want %v", got, tt.wantMerged)
			}

			// The same from the fd alone, as `napitapctl probe` does it.
			res, err = RunQueue(queue, segments, segmentLen)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("RunQueue: %s", res)
			if res.Tap != tapName || res.Merged() != tt.wantMerged {
				t.Errorf("RunQueue: tap %q, Merged() = %v (%v), want %q, %v", res.Tap, res.Merged(), res.SKBLens, tapName, tt.wantMerged)
			}
		})
	}
}

func TestResultString(t *testing.T) {
	for _, tt := range []struct {
		lens []int
		want string
	}{
		{[]int{16054}, "16 segments of 1054 B came out of tap0 as 1 skb of 16054 B: GRO merged them, the queue has NAPI"},
		{[]int{8054, 8054}, "16 segments of 1054 B came out of tap0 as 2 skbs of 8054 B: GRO merged them, the queue has NAPI"},
		{[]int{15054, 1054}, "16 segments of 1054 B came out of tap0 as 2 skbs of 15054+1054 B: GRO merged them, the queue has NAPI"},
		{[]int{1054, 1054}, "16 segments of 1054 B came out of tap0 as 2 skbs of 1054 B: GRO merged nothing: the queue has no NAPI, or the tap's gro_flush_timeout is unset or too short"},
		{nil, "none of the 16 segments of 1054 B came out of tap0"},
	} {
		r := Result{Tap: "tap0", Segments: 16, SegmentLen: 1000, SKBLens: tt.lens}
		if got := r.String(); got != tt.want {
			t.Errorf("%v:\n got %q\nwant %q", tt.lens, got, tt.want)
		}
	}
}
