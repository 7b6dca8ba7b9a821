package datapath

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/inet"
)

var tapMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x2a}

func TestParseMode(t *testing.T) {
	cases := []struct {
		in   string
		want Mode
		bad  bool
	}{
		{in: "plain", want: Mode{Name: "plain"}},
		{in: "napi", want: Mode{Name: "napi", NAPI: true}},
		{in: "threaded", want: Mode{Name: "threaded", NAPI: true, Threaded: true}},
		{in: "gro50", want: Mode{Name: "gro50", NAPI: true, GROFlushTimeout: 50000}},
		{in: "frags", want: Mode{Name: "frags", NAPI: true, Frags: true}},
		{in: "threaded+gro20+defer2", want: Mode{Name: "threaded+gro20+defer2", NAPI: true, Threaded: true, GROFlushTimeout: 20000, DeferHardIRQs: 2}},
		{in: "plain+noqueue", want: Mode{Name: "plain+noqueue", Qdisc: "noqueue"}},
		{in: "threaded+noqueue", want: Mode{Name: "threaded+noqueue", NAPI: true, Threaded: true, Qdisc: "noqueue"}},
		{in: "noqueue", bad: true},
		{in: "noqueue+threaded", bad: true},
		{in: "gro", bad: true},
		{in: "gro0", bad: true},
		{in: "plain+napi", bad: true},
		{in: "turbo", bad: true},
	}
	for _, c := range cases {
		got, err := parseMode(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("parseMode(%q) = %+v, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("parseMode(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
	// Threaded NAPI is only ever switched on (DESIGN.md fact 9).
	if k := (Mode{Name: "napi", NAPI: true}).knobs(); k.Threaded || k.GROFlushTimeout != nil || k.DeferHardIRQs != nil {
		t.Errorf("napi mode knobs %+v, want none", k)
	}
}

func TestParseSize(t *testing.T) {
	cases := []struct {
		in   string
		want Size
		bad  bool
	}{
		{in: "udp64", want: Size{Name: "udp64", Proto: protoUDP, Payload: 64}},
		{in: "tcp1448", want: Size{Name: "tcp1448", Proto: protoTCP, Payload: 1448}},
		{in: "gso64k", want: Size{Name: "gso64k", Proto: protoTCP, Payload: 45 * 1448, GSO: true}},
		{in: "h2g-udp64", want: Size{Name: "h2g-udp64", Dir: hostToGuest, Proto: protoUDP, Payload: 64}},
		{in: "h2g-tcp", want: Size{Name: "h2g-tcp", Dir: hostToGuest, Proto: protoTCP, Payload: 1448}},
		{in: "rr64", want: Size{Name: "rr64", Dir: roundTrip, Proto: protoUDP, Payload: 64}},
		{in: "h2g-tcp1448", bad: true},
		{in: "h2g-gso64k", bad: true},
		{in: "rr2000", bad: true},
		{in: "udp1473", bad: true},
		{in: "tcp1449", bad: true},
		{in: "gso2000", bad: true},
		{in: "sctp9", bad: true},
	}
	for _, c := range cases {
		got, err := parseSize(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("parseSize(%q) = %+v, want an error", c.in, got)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("parseSize(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}

func l4Check(frame []byte) uint16 {
	ip := frame[l3Off : l3Off+ipHdrLen]
	l4 := frame[l4Off:]
	return inet.Checksum(l4, inet.PseudoHeaderSum(ip[12:16], ip[16:20], ip[9], len(l4)))
}

func parseVnetHdr(b []byte) vnetHdr {
	return vnetHdr{
		flags: b[0], gsoType: b[1],
		hdrLen:     binary.NativeEndian.Uint16(b[2:]),
		gsoSize:    binary.NativeEndian.Uint16(b[4:]),
		csumStart:  binary.NativeEndian.Uint16(b[6:]),
		csumOffset: binary.NativeEndian.Uint16(b[8:]),
	}
}

func TestUDPFrame(t *testing.T) {
	for _, n := range []int{1, 64, 512, 1472} {
		f := buildUDPFrame(tapMAC, 1000, 9000, n)
		if len(f) != vnetHdrLen+ethHdrLen+ipHdrLen+udpHdrLen+n {
			t.Fatalf("payload %d: frame of %d bytes", n, len(f))
		}
		if h := parseVnetHdr(f); h != (vnetHdr{}) {
			t.Errorf("payload %d: vnet header %+v, want all zero", n, h)
		}
		if !bytes.Equal(f[vnetHdrLen:vnetHdrLen+6], tapMAC) || !bytes.Equal(f[vnetHdrLen+6:vnetHdrLen+12], writerMAC) {
			t.Errorf("payload %d: MACs % x", n, f[vnetHdrLen:vnetHdrLen+12])
		}
		if c := inet.Checksum(f[l3Off:l4Off], 0); c != 0 {
			t.Errorf("payload %d: IPv4 header does not check: %#04x", n, c)
		}
		if c := l4Check(f); c != 0 {
			t.Errorf("payload %d: UDP checksum does not check: %#04x", n, c)
		}
	}
}

func TestTCPSegments(t *testing.T) {
	for _, ts := range []bool{true, false} {
		s := newTCPSegmenter(tapMAC, 40000, 5201, tcpMSS, ts, false)
		for i, seq := range []uint32{1, 0xfffffff0, 12345678} {
			f := s.segment(seq, 77, 1000+uint32(i), 555, tcpMSS)
			if c := inet.Checksum(f[l3Off:l4Off], 0); c != 0 {
				t.Errorf("ts=%v seg %d: IPv4 header does not check", ts, i)
			}
			if c := l4Check(f); c != 0 {
				t.Errorf("ts=%v seg %d: TCP checksum does not check: %#04x", ts, i, c)
			}
			info, ok := parseTCP(f)
			if !ok || info.seq != seq || info.ack != 77 || info.flags != tcpACK || info.payloadLen != tcpMSS || info.hasTS != ts {
				t.Errorf("ts=%v seg %d: parsed %+v, ok %v", ts, i, info, ok)
			}
			if ts && (info.tsval != 1000+uint32(i) || info.tsecr != 555) {
				t.Errorf("ts=%v seg %d: timestamps %d/%d", ts, i, info.tsval, info.tsecr)
			}
		}
	}

	payload := 45 * tcpMSS
	g := newTCPSegmenter(tapMAC, 40000, 5201, payload, true, true)
	for _, n := range []int{payload, 3 * tcpMSS} {
		f := g.segment(9, 10, 11, 12, n)
		h := parseVnetHdr(f)
		want := vnetHdr{flags: vnetFlagNeedsCsum, gsoType: vnetGSOTCPv4, hdrLen: 66, gsoSize: tcpMSS, csumStart: 34, csumOffset: 16}
		if h != want {
			t.Errorf("GSO frame of %d: vnet header %+v, want %+v", n, h, want)
		}
		if got := int(binary.BigEndian.Uint16(f[l3Off+2:])); got != ipHdrLen+tcpTSLen+n || len(f) != l4Off+tcpTSLen+n {
			t.Errorf("GSO frame of %d: IPv4 total length %d, frame %d", n, got, len(f))
		}
		l4 := f[l4Off:]
		binary.BigEndian.PutUint16(l4[16:], inet.Checksum(l4, 0))
		if r := l4Check(f); r != 0 {
			t.Errorf("GSO frame of %d: completed checksum does not check", n)
		}
	}
}

func TestAUDPFrameParsesToItsPortAndPayload(t *testing.T) {
	f := buildUDPFrame(tapMAC, 1000, 9000, 64)
	if port, n, ok := parseUDP(f); !ok || port != 9000 || n != 64 {
		t.Errorf("parseUDP = %d, %d, %v; want 9000, 64, true", port, n, ok)
	}
	if _, _, ok := parseUDP(tcpControl(tapMAC, 1, 2, 3, 4, tcpSYN, nil)); ok {
		t.Errorf("a TCP frame parsed as UDP")
	}
}

func TestTheGuestKeepsWhatCameBeyondAHoleAndAcksOverItOnceFilled(t *testing.T) {
	cases := []struct {
		name     string
		start    uint32      // rcvNxt before
		segs     [][2]uint32 // [seq, end) in arrival order
		wantNxt  uint32
		wantOFO  int
		wantRead uint32
	}{
		{"in order", 0, [][2]uint32{{0, 10}, {10, 20}}, 20, 0, 20},
		{"a hole keeps what follows", 0, [][2]uint32{{0, 10}, {20, 30}, {30, 40}}, 10, 1, 10},
		{"filling the hole takes everything kept", 0, [][2]uint32{{0, 10}, {20, 30}, {40, 50}, {30, 40}, {10, 20}}, 50, 0, 50},
		{"two holes, the first filled", 0, [][2]uint32{{20, 30}, {40, 50}, {0, 20}}, 30, 1, 30},
		{"a duplicate changes nothing", 0, [][2]uint32{{0, 10}, {0, 10}}, 10, 0, 10},
		{"across the sequence wrap", 0xfffffff0, [][2]uint32{{0xfffffff0, 0xfffffffa}, {5, 15}, {0xfffffffa, 5}}, 15, 0, 0x1f},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := &guestTCP{rcvNxt: c.start}
			var read uint32
			for _, s := range c.segs {
				switch {
				case int32(s[0]-g.rcvNxt) <= 0 && int32(s[1]-g.rcvNxt) > 0:
					read += g.advance(s[1])
				case int32(s[0]-g.rcvNxt) > 0:
					g.addOFO(s[0], s[1])
				}
			}
			if g.rcvNxt != c.wantNxt || len(g.ofo) != c.wantOFO || read != c.wantRead {
				t.Errorf("rcvNxt %d, %d ranges kept (%v), %d bytes in order; want %d, %d, %d", g.rcvNxt, len(g.ofo), g.ofo, read, c.wantNxt, c.wantOFO, c.wantRead)
			}
		})
	}
}

func TestParseSynAck(t *testing.T) {
	opts := []byte{2, 4, 0x05, 0xb4, 1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 8, 1, 3, 3, 10}
	f := tcpControl(tapMAC, 5201, 40000, 100, 201, tcpSYN|tcpACK, opts)
	info, ok := parseTCP(f)
	if !ok || info.flags != tcpSYN|tcpACK || info.seq != 100 || info.ack != 201 || info.wscale != 10 || !info.hasTS || info.tsval != 9 || info.tsecr != 8 {
		t.Errorf("parsed %+v, ok %v", info, ok)
	}
	if c := l4Check(f); c != 0 {
		t.Errorf("SYN-ACK checksum does not check")
	}
	if _, ok := parseTCP(buildUDPFrame(tapMAC, 1, 2, 64)); ok {
		t.Errorf("a UDP frame parsed as TCP")
	}
	if _, ok := parseTCP(f[:l4Off+10]); ok {
		t.Errorf("a truncated frame parsed")
	}
}

func TestProcParsers(t *testing.T) {
	m := map[string]uint64{}
	parseNetstat([]byte("Ip: Forwarding InReceives\nIp: 1 42\nUdp: InDatagrams RcvbufErrors\nUdp: 7 3\n"), m)
	if m["Ip.InReceives"] != 42 || m["Udp.RcvbufErrors"] != 3 || m["Udp.InDatagrams"] != 7 {
		t.Errorf("parseNetstat = %v", m)
	}
	all, per, err := readProcStat()
	if err != nil || len(per) != runtime.NumCPU() || all.Idle <= 0 {
		t.Errorf("readProcStat: %d CPUs, all %+v, %v; want %d CPUs", len(per), all, err, runtime.NumCPU())
	}
	if c := split(all, all, 2); c != (CPUSplit{}) {
		t.Errorf("split over no time = %+v", c)
	}
	// A thread that spins gets ticks; a thread of no one's counts none.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if u, s := threadTicks([]int{unix.Gettid()}); u+s > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("threadTicks of a spinning thread stays 0")
		}
	}
	if u, s := pidTicks([]int{0, 1 << 30}); u+s != 0 {
		t.Errorf("pidTicks of no process = %d, %d", u, s)
	}
}

func TestSpread(t *testing.T) {
	if s := spreadOf([]float64{3, 1, 2}); s != (Spread{Median: 2, Min: 1, Max: 3, N: 3}) {
		t.Errorf("odd: %+v", s)
	}
	if s := spreadOf([]float64{4, 1, 2, 3}); s.Median != 2.5 {
		t.Errorf("even: %+v", s)
	}
}

func testResults() (*Results, options) {
	opts := options{Runs: 2, Queues: []int{1}}
	for _, m := range []string{"plain", "napi", "threaded", "gro50"} {
		mode, _ := parseMode(m)
		opts.Modes = append(opts.Modes, mode)
	}
	for _, s := range []string{"udp64", "tcp1448"} {
		size, _ := parseSize(s)
		opts.Sizes = append(opts.Sizes, size)
	}
	res := &Results{Command: "napitap-bench datapath", Machine: MachineInfo{CPUs: 2, LoadAvg: "0.1 0.1 0.1"}}
	rate := map[string][2]float64{"plain": {100, 100}, "napi": {80, 80}, "threaded": {90, 280}, "gro50": {97, 210}}
	for run := 1; run <= 2; run++ {
		for m, r := range rate {
			res.Samples = append(res.Samples,
				Sample{Run: run, Mode: m, Size: "udp64", Queues: 1, PPS: r[0] * float64(run) * 1000, FramesPerSKB: 1},
				Sample{Run: run, Mode: m, Size: "tcp1448", Queues: 1, PPS: r[1] * float64(run) * 1000, Gbps: r[1] / 40, FramesPerSKB: 1 + r[1]/100})
		}
	}
	return res, opts
}

func TestReport(t *testing.T) {
	res, opts := testResults()
	tb := newTable(res, opts)
	if r, ok := tb.ratio("tcp1448", 1, "threaded"); !ok || r.Median != 2.8 || r.N != 2 {
		t.Errorf("threaded ratio %+v %v, want 2.8 over 2 runs", r, ok)
	}
	md := tb.markdown()
	for _, want := range []string{"**Meets both (by the median):** `gro50`", "| threaded | 420 (280–560) | 7.00 | 2.80x |", "| napi | ", "datapath-tcp.svg"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	for _, pr := range []proto{protoTCP, protoUDP} {
		svg := tb.plot("plot", 1, func(s Size) bool { return s.Proto == pr })
		d := xml.NewDecoder(strings.NewReader(svg))
		for {
			_, err := d.Token()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("plot %d is not well-formed XML: %v", pr, err)
			}
		}
		if !strings.Contains(svg, "<rect") {
			t.Errorf("plot %d has no bars", pr)
		}
	}
}

// testBench makes a bench from command-line args, closed at the test's end.
func testBench(t *testing.T, args ...string) (*bench, options) {
	t.Helper()
	opts, err := parseFlags(args, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newBench(opts, testLog{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.close(); err != nil {
			t.Error(err)
		}
	})
	return b, opts
}

// TestQuickRun measures plain and NAPI queues for a moment each and checks
// that something arrived and that no tap and no netns is left behind. The
// moment is long enough for a TCP handshake on a machine busy with the
// other packages' tests (200 ms, after 100 ms, once in five runs was not).
func TestQuickRun(t *testing.T) {
	nstest.RequireRoot(t)
	b, opts := testBench(t, "--duration", "500ms", "--warmup", "300ms", "--runs", "1",
		"--modes", "plain,napi+noqueue", "--sizes", "udp512,tcp1448,h2g-udp64,h2g-tcp,rr64", "--queues", "1", "--out", t.TempDir())
	netnsPath := b.ns.Path()
	res := &Results{Machine: machineInfo(), Settings: settings(opts)}
	for _, size := range opts.Sizes {
		for _, mode := range opts.Modes {
			s, err := b.cell(context.Background(), 1, mode, size, 1)
			if err != nil {
				t.Fatalf("%s %s: %v", size.Name, mode.Name, err)
			}
			t.Logf("%s %s: %.0f pps, %.2f Gbit/s, tx %.0f pps, %.1f frames/skb", size.Name, mode.Name, s.PPS, s.Gbps, s.TxPPS, s.FramesPerSKB)
			if s.PPS <= 0 || s.RxBytes == 0 {
				t.Errorf("%s %s: nothing received (%d frames written)", size.Name, mode.Name, s.TxFrames)
			}
			if want := map[string]string{"plain": "pfifo_fast", "napi+noqueue": "noqueue"}[mode.Name]; s.Qdisc != want {
				t.Errorf("%s %s: root qdisc %q, want %q", size.Name, mode.Name, s.Qdisc, want)
			}
			if size.Dir == roundTrip && (s.P50Us <= 0 || s.P99Us < s.P50Us) {
				t.Errorf("%s %s: round trips p50 %.1f µs, p99 %.1f µs", size.Name, mode.Name, s.P50Us, s.P99Us)
			}
			if gone, err := b.ns.linkGone(s.Tap); err != nil || !gone {
				t.Errorf("%s %s: tap %s left behind (%v)", size.Name, mode.Name, s.Tap, err)
			}
			res.Samples = append(res.Samples, s)
		}
	}
	if err := writeReport(res, opts); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"datapath.md", "datapath.json", "datapath-tcp.svg", "datapath-udp.svg", "datapath-h2g.svg"} {
		if _, err := os.Stat(filepath.Join(opts.Out, f)); err != nil {
			t.Error(err)
		}
	}
	if err := b.close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(netnsPath); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("netns %s left behind: %v", netnsPath, err)
	}
}

func TestAThreadedCellCountsHowOftenItsKernelThreadRan(t *testing.T) {
	nstest.RequireRoot(t)
	// As long as TestQuickRun's cells, for traffic on a busy machine.
	b, opts := testBench(t, "--duration", "500ms", "--warmup", "300ms", "--runs", "1",
		"--modes", "threaded", "--sizes", "tcp1448", "--queues", "1", "--out", t.TempDir())
	s, err := b.cell(context.Background(), 1, opts.Modes[0], opts.Sizes[0], 1)
	if err != nil {
		t.Fatal(err)
	}
	if s.NAPIThreadN != 1 || s.NAPIThreadRuns <= 0 {
		t.Errorf("%d napi/ threads ran %.0f times/s, want 1 thread that ran", s.NAPIThreadN, s.NAPIThreadRuns)
	}
}

func TestTheScaleRoundMakesOneKernelThreadPerQueueOnlyWhenThreaded(t *testing.T) {
	nstest.RequireRoot(t)
	b, _ := testBench(t, "--sizes", "none", "--scale-taps", "3", "--scale-queues", "2", "--scale-idle", "200ms", "--runs", "1")
	sc, err := b.scale(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"napi": 0, "threaded": 6}
	for _, s := range sc.Samples {
		if s.Threads != want[s.Mode] {
			t.Errorf("%s: %d napi/ threads, want %d", s.Mode, s.Threads, want[s.Mode])
		}
	}
	if len(sc.Samples) != 2 {
		t.Errorf("%d samples, want one per mode", len(sc.Samples))
	}
	var left []string
	err = b.ns.do(func() error {
		links, err := netlink.LinkList()
		for _, l := range links {
			if l.Attrs().Name != "lo" {
				left = append(left, l.Attrs().Name)
			}
		}
		return err
	})
	if err != nil || len(left) > 0 {
		t.Errorf("links left in the netns: %v (%v)", left, err)
	}
}

func TestAReportMergesRunsAndComparesNoqueueWithTheSameNAPIMode(t *testing.T) {
	g2h, _ := testResults()
	h2g := &Results{Command: "napitap-bench datapath --sizes h2g-udp64", Runs: 2, Queues: []int{1},
		Modes: []string{"plain", "threaded", "threaded+noqueue"}, Sizes: []string{"h2g-udp64"}}
	rate := map[string]float64{"plain": 100, "threaded": 100, "threaded+noqueue": 120}
	for run := 1; run <= 2; run++ {
		for m, r := range rate {
			h2g.Samples = append(h2g.Samples, Sample{Run: run, Mode: m, Size: "h2g-udp64", Queues: 1, PPS: r * float64(run) * 1000, Seconds: 1})
		}
	}
	g2h.Modes, g2h.Sizes, g2h.Queues, g2h.Runs = []string{"plain", "napi", "threaded", "gro50"}, []string{"udp64", "tcp1448"}, []int{1}, 2
	dir := t.TempDir()
	var files []string
	for i, r := range []*Results{g2h, h2g} {
		raw, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.Join(dir, strconv.Itoa(i)+".json"))
		if err := os.WriteFile(files[i], raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	res, opts, err := loadResults(options{FromJSON: strings.Join(files, ",")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Merged) != 1 || len(opts.Sizes) != 3 || len(opts.Modes) != 5 {
		t.Fatalf("merged %d runs, sizes %v, modes %v; want 1 run, 3 sizes, 5 modes", len(res.Merged), opts.Sizes, opts.Modes)
	}
	md := newTable(res, opts).markdown()
	for _, want := range []string{"| h2g-udp64 | threaded | 1 |  | 1.20x | yes |", "--sizes h2g-udp64", "**Meets both (by the median):** `gro50`"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

// TestPinThread: the pinned thread runs where it was put.
func TestPinThread(t *testing.T) {
	done := make(chan error)
	cpu := runtime.NumCPU() - 1
	go func() {
		if _, err := pinThread(cpu); err != nil {
			done <- err
			return
		}
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			done <- err
			return
		}
		if set.Count() != 1 || !set.IsSet(cpu) {
			done <- errors.New("affinity not set")
			return
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("timeout")
	}
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
