// Package datapath is napitap-bench datapath: what NAPI, threaded NAPI,
// gro_flush_timeout, NAPI_FRAGS and the root qdisc do to the data path of
// a VMM without vhost-net (Cloud Hypervisor, Firecracker, QEMU vhost=off),
// which writes each guest frame into a tap queue fd with write(2) and
// reads each frame for the guest with read(2) (h2g.go), and what threaded
// NAPI costs at scale (scale.go).
//
// A writer plays that VMM: 12-byte virtio-net header, one frame per write,
// optionally 64 KB GSO frames; for TCP it is a real peer in userspace (it
// sends the SYN, reads the kernel's SYN-ACK and ACKs back from the tap and
// keeps to the advertised window). A receiver in the pod netns plays the
// application: recvmmsg for UDP, a plain TCP socket from accept for TCP.
// Writers and receivers run on OS threads pinned apart (DESIGN.md fact 8).
//
// Every cell (run × size × queues × mode) gets a fresh tap, created with the
// mode's queue flags; its NAPI knobs are set while every queue is attached,
// threaded NAPI is only ever switched on, and the tap is deleted afterwards
// (DESIGN.md fact 9).
package datapath

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mrand "math/rand/v2"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// Mode is one tap configuration.
type Mode struct {
	Name            string
	NAPI            bool // IFF_NAPI on every queue
	Frags           bool // IFF_NAPI_FRAGS
	Threaded        bool // /sys/class/net/<tap>/threaded = 1
	GROFlushTimeout uint64
	DeferHardIRQs   uint32
	// Qdisc is the tap's root qdisc, set before it goes up: "" leaves the
	// kernel's (mq over pfifo_fast for a multiqueue tap, pfifo_fast for a
	// single-queue one; DESIGN.md fact 15).
	Qdisc string
}

// qdiscBase is the mode with the kernel's root qdisc that a mode with its
// own qdisc is compared with: "threaded+noqueue" -> "threaded".
func qdiscBase(name string) (string, bool) { return strings.CutSuffix(name, "+noqueue") }

func (m Mode) knobs() tapsetup.NAPIKnobs {
	k := tapsetup.NAPIKnobs{Threaded: m.Threaded}
	if m.GROFlushTimeout != 0 {
		v := m.GROFlushTimeout
		k.GROFlushTimeout = &v
	}
	if m.DeferHardIRQs != 0 {
		v := m.DeferHardIRQs
		k.DeferHardIRQs = &v
	}
	return k
}

func (m Mode) describe() string {
	parts := []string{"plain queue (no IFF_NAPI)"}
	if m.NAPI {
		parts = []string{"IFF_NAPI"}
	}
	if m.Frags {
		parts = append(parts, "IFF_NAPI_FRAGS")
	}
	if m.Threaded {
		parts = append(parts, "threaded=1")
	}
	if m.GROFlushTimeout != 0 {
		parts = append(parts, fmt.Sprintf("gro_flush_timeout=%d", m.GROFlushTimeout))
	}
	if m.DeferHardIRQs != 0 {
		parts = append(parts, fmt.Sprintf("napi_defer_hard_irqs=%d", m.DeferHardIRQs))
	}
	if m.Qdisc != "" {
		parts = append(parts, "root qdisc "+m.Qdisc)
	}
	return strings.Join(parts, ", ")
}

// parseMode: "plain", or '+'-joined tokens out of napi, threaded, frags,
// gro<µs> (gro_flush_timeout) and defer<n> (napi_defer_hard_irqs), which
// imply napi; either may end in "+noqueue" (root qdisc noqueue). Examples:
// threaded+gro50, plain+noqueue.
func parseMode(s string) (Mode, error) {
	m := Mode{Name: s}
	rest := s
	if base, ok := qdiscBase(s); ok {
		m.Qdisc, rest = "noqueue", base
	}
	if rest == "plain" {
		return m, nil
	}
	for _, tok := range strings.Split(rest, "+") {
		m.NAPI = true
		switch {
		case tok == "napi":
		case tok == "threaded":
			m.Threaded = true
		case tok == "frags":
			m.Frags = true
		case strings.HasPrefix(tok, "gro"):
			us, err := strconv.ParseUint(tok[3:], 10, 32)
			if err != nil || us == 0 {
				return m, fmt.Errorf("mode %q: %q: want gro<microseconds>, e.g. gro50", s, tok)
			}
			m.GROFlushTimeout = us * 1000
		case strings.HasPrefix(tok, "defer"):
			n, err := strconv.ParseUint(tok[5:], 10, 32)
			if err != nil || n == 0 {
				return m, fmt.Errorf("mode %q: %q: want defer<n>, e.g. defer2", s, tok)
			}
			m.DeferHardIRQs = uint32(n)
		default:
			return m, fmt.Errorf("mode %q: unknown token %q (plain, napi, threaded, frags, gro<us>, defer<n>, then +noqueue)", s, tok)
		}
	}
	return m, nil
}

type proto int

const (
	protoUDP proto = iota
	protoTCP
)

// dir is where the traffic goes through the tap.
type dir int

const (
	// guestToHost: the VMM writes frames into the queue fds (the tap
	// receives, NAPI's side).
	guestToHost dir = iota
	// hostToGuest: the pod's socket sends and the VMM reads the queue fds
	// (the tap transmits, the root qdisc's side).
	hostToGuest
	// roundTrip: one request from the pod, one response from the VMM,
	// one at a time.
	roundTrip
)

// Size is one workload: UDP datagrams or TCP segments of Payload bytes per
// frame, or TCP GSO frames of Payload bytes cut at 1448, guest to host;
// or, host to guest, the same sent by a socket in the pod; or round trips
// of Payload-byte UDP requests and responses.
type Size struct {
	Name    string
	Dir     dir
	Proto   proto
	Payload int
	GSO     bool
}

func (s Size) describe() string {
	switch {
	case s.Dir == roundTrip:
		return fmt.Sprintf("round trips, %d-byte UDP request from the pod, %d-byte response from the VMM", s.Payload, s.Payload)
	case s.Dir == hostToGuest && s.Proto == protoTCP:
		return "host to guest, TCP, one stream per queue, 1448-byte segments"
	case s.Dir == hostToGuest:
		return fmt.Sprintf("host to guest, UDP, %d-byte datagrams", s.Payload)
	case s.GSO:
		return fmt.Sprintf("TCP, %d-byte GSO frames (gso_size %d, %d segments)", s.Payload, tcpMSS, s.Payload/tcpMSS)
	case s.Proto == protoTCP:
		return fmt.Sprintf("TCP, %d-byte segments", s.Payload)
	default:
		return fmt.Sprintf("UDP, %d-byte datagrams", s.Payload)
	}
}

// parseSize: udp<N> (UDP payload N), tcp<N> (TCP payload N per segment),
// gso<N>[k] (TCP GSO frames of N bytes, cut down to whole 1448-byte
// segments that fit one IPv4 packet), all guest to host; h2g-udp<N> and
// h2g-tcp host to guest; rr<N> round trips of N-byte UDP payloads.
func parseSize(s string) (Size, error) {
	if rest, ok := strings.CutPrefix(s, "h2g-"); ok {
		if rest == "tcp" {
			return Size{Name: s, Dir: hostToGuest, Proto: protoTCP, Payload: tcpMSS}, nil
		}
		if !strings.HasPrefix(rest, "udp") {
			return Size{}, fmt.Errorf("size %q: want h2g-udp<N> or h2g-tcp", s)
		}
		sz, err := parseSize(rest)
		sz.Name, sz.Dir = s, hostToGuest
		return sz, err
	}
	if rest, ok := strings.CutPrefix(s, "rr"); ok {
		sz, err := parseSize("udp" + rest)
		sz.Name, sz.Dir = s, roundTrip
		return sz, err
	}
	num := func(t string) (int, error) {
		mul := 1
		if strings.HasSuffix(t, "k") {
			mul, t = 1024, strings.TrimSuffix(t, "k")
		}
		n, err := strconv.Atoi(t)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("size %q: bad number", s)
		}
		return n * mul, nil
	}
	switch {
	case strings.HasPrefix(s, "udp"):
		n, err := num(s[3:])
		if err != nil {
			return Size{}, err
		}
		if n > 1500-ipHdrLen-udpHdrLen {
			return Size{}, fmt.Errorf("size %q: at most %d bytes of UDP payload in a 1500-byte MTU", s, 1500-ipHdrLen-udpHdrLen)
		}
		return Size{Name: s, Proto: protoUDP, Payload: n}, nil
	case strings.HasPrefix(s, "tcp"):
		n, err := num(s[3:])
		if err != nil {
			return Size{}, err
		}
		if n > tcpMSS {
			return Size{}, fmt.Errorf("size %q: at most %d bytes per segment (1500-byte MTU with timestamps); use gso<N> for more", s, tcpMSS)
		}
		return Size{Name: s, Proto: protoTCP, Payload: n}, nil
	case strings.HasPrefix(s, "gso"):
		n, err := num(s[3:])
		if err != nil {
			return Size{}, err
		}
		n = min(n, maxGSOPayload) / tcpMSS * tcpMSS
		if n < 2*tcpMSS {
			return Size{}, fmt.Errorf("size %q: a GSO frame needs at least two %d-byte segments", s, tcpMSS)
		}
		return Size{Name: s, Proto: protoTCP, Payload: n, GSO: true}, nil
	}
	return Size{}, fmt.Errorf("size %q: want udp<N>, tcp<N>, gso<N>[k], h2g-udp<N>, h2g-tcp or rr<N>", s)
}

type options struct {
	Duration, Warmup time.Duration
	Runs             int
	Modes            []Mode
	Sizes            []Size
	Queues           []int
	Out              string
	WriterCPUs       []int
	ReceiverCPUs     []int
	MaxBacklog       int
	FromJSON         string
	ScaleTaps        int
	ScaleQueues      int
	ScaleIdle        time.Duration
	Args             []string
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := parse(f)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list %q", s)
	}
	return out, nil
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{Args: args}
	fs := flag.NewFlagSet("napitap-bench datapath", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.Duration, "duration", 2*time.Second, "measurement window of each run")
	fs.DurationVar(&o.Warmup, "warmup", 300*time.Millisecond, "traffic before each measurement window")
	fs.IntVar(&o.Runs, "runs", 5, "runs of every cell; modes are interleaved within a run")
	modes := fs.String("modes", "plain,napi,threaded,gro20,gro50,gro200,frags",
		"tap configurations: plain, or '+'-joined napi, threaded, frags, gro<us>, defer<n> (e.g. threaded+gro50); either may end in +noqueue (root qdisc noqueue)")
	sizes := fs.String("sizes", "udp64,udp512,tcp1448,gso64k", "workloads, guest to host: udp<payload>, tcp<segment payload>, gso<frame bytes>[k]; host to guest: h2g-udp<payload>, h2g-tcp; round trips: rr<payload>; none: only --scale-taps")
	queues := fs.String("queues", "1,2", "queue counts; N queues get N flows, N writers (one per queue fd) and N receivers")
	fs.StringVar(&o.Out, "out", "docs/bench", "directory for datapath.md, datapath.json and the plots datapath-tcp.svg, datapath-udp.svg and datapath-h2g.svg")
	wcpus := fs.String("writer-cpus", "0", "CPUs for the writers (writer i on entry i mod len)")
	rcpus := fs.String("receiver-cpus", "", "CPUs for the receivers (default: the last CPU)")
	fs.StringVar(&o.FromJSON, "from-json", "", "measure nothing: write the report from the datapath.json of earlier runs, comma-separated (cells measured in one run are only compared with each other)")
	fs.IntVar(&o.ScaleTaps, "scale-taps", 0, "also measure threaded NAPI at scale: this many idle taps at once, NAPI against threaded NAPI, --runs rounds (0: not)")
	fs.IntVar(&o.ScaleQueues, "scale-queues", 4, "queues of each --scale-taps tap")
	fs.DurationVar(&o.ScaleIdle, "scale-idle", 10*time.Second, "how long --scale-taps counts the idle taps' kernel threads' wakeups")
	fs.IntVar(&o.MaxBacklog, "max-backlog", 65536, "UDP: frames a writer may have outstanding (written, not yet received or dropped) before it waits; 0: no limit")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.Modes, err = parseList(*modes, parseMode); err != nil {
		return o, err
	}
	if *sizes != "none" {
		if o.Sizes, err = parseList(*sizes, parseSize); err != nil {
			return o, err
		}
	}
	posInt := func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q: want a non-negative integer", s)
		}
		return n, nil
	}
	if o.Queues, err = parseList(*queues, posInt); err != nil {
		return o, err
	}
	for _, q := range o.Queues {
		if q < 1 || q > 64 {
			return o, fmt.Errorf("--queues: %d queues: want 1 to 64", q)
		}
	}
	ncpu := runtime.NumCPU()
	if *rcpus == "" {
		*rcpus = strconv.Itoa(ncpu - 1)
	}
	if o.WriterCPUs, err = parseList(*wcpus, posInt); err != nil {
		return o, err
	}
	if o.ReceiverCPUs, err = parseList(*rcpus, posInt); err != nil {
		return o, err
	}
	for _, c := range append(slices.Clone(o.WriterCPUs), o.ReceiverCPUs...) {
		if c >= ncpu {
			return o, fmt.Errorf("CPU %d: this machine has CPUs 0-%d", c, ncpu-1)
		}
	}
	switch {
	case o.Duration < 50*time.Millisecond:
		return o, errors.New("--duration: at least 50ms")
	case o.Runs < 1:
		return o, errors.New("--runs: at least 1")
	case o.MaxBacklog < 0:
		return o, errors.New("--max-backlog: not negative")
	case o.ScaleTaps < 0 || o.ScaleTaps > 1000 || o.ScaleQueues < 1 || o.ScaleQueues > 64:
		return o, errors.New("--scale-taps: 0 to 1000, --scale-queues: 1 to 64")
	case len(o.Sizes) == 0 && o.ScaleTaps == 0 && o.FromJSON == "":
		return o, errors.New("--sizes none: nothing to measure without --scale-taps")
	}
	return o, nil
}

// Main runs the benchmark with command-line args.
func Main(args []string) error {
	opts, err := parseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if opts.FromJSON != "" {
		res, opts, err := loadResults(opts)
		if err != nil {
			return err
		}
		return writeReport(res, opts)
	}
	if os.Geteuid() != 0 {
		return errors.New("datapath: needs root (network namespaces, taps, IFF_NAPI_FRAGS)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, opts, os.Stdout)
	if err != nil {
		return err
	}
	return writeReport(res, opts)
}

// loadResults reads the samples of earlier runs, the first one's header
// first. Modes, sizes, queue counts and runs come from the files when they
// have them, else from the flags.
func loadResults(opts options) (*Results, options, error) {
	var res *Results
	for _, file := range strings.Split(opts.FromJSON, ",") {
		raw, err := os.ReadFile(file)
		if err != nil {
			return nil, opts, err
		}
		var r Results
		if err := json.Unmarshal(raw, &r); err != nil {
			return nil, opts, fmt.Errorf("%s: %w", file, err)
		}
		if res == nil {
			res = &r
			continue
		}
		// Ratios pair cells by run number: keep each file's runs apart.
		offset := 0
		for _, s := range res.Samples {
			offset = max(offset, s.Run)
		}
		for i := range r.Samples {
			r.Samples[i].Run += offset
		}
		res.Samples = append(res.Samples, r.Samples...)
		r.Samples = nil
		res.Merged = append(res.Merged, r)
		res.Modes = union(res.Modes, r.Modes)
		res.Sizes = union(res.Sizes, r.Sizes)
		res.Queues = union(res.Queues, r.Queues)
		res.Runs = max(res.Runs, r.Runs)
		if r.Scale != nil {
			res.Scale = r.Scale
		}
	}
	var err error
	if len(res.Modes) > 0 {
		if opts.Modes, err = parseList(strings.Join(res.Modes, ","), parseMode); err != nil {
			return nil, opts, err
		}
	}
	if len(res.Sizes) > 0 {
		if opts.Sizes, err = parseList(strings.Join(res.Sizes, ","), parseSize); err != nil {
			return nil, opts, err
		}
	}
	if len(res.Queues) > 0 {
		opts.Queues = res.Queues
		slices.Sort(opts.Queues)
	}
	if res.Runs > 0 {
		opts.Runs = res.Runs
	}
	for i := range res.Samples {
		res.Samples[i].derive()
	}
	return res, opts, nil
}

func union[T comparable](a, b []T) []T {
	for _, v := range b {
		if !slices.Contains(a, v) {
			a = append(a, v)
		}
	}
	return a
}

// Results of one benchmark.
type Results struct {
	Command  string      `json:"command"`
	Started  time.Time   `json:"started"`
	Finished time.Time   `json:"finished"`
	Machine  MachineInfo `json:"machine"`
	Settings []string    `json:"settings"`
	Modes    []string    `json:"modes"`
	Sizes    []string    `json:"sizes"`
	Queues   []int       `json:"queues"`
	Runs     int         `json:"runs"`
	Samples  []Sample    `json:"samples"`
	// Merged are the other runs a report was made from (--from-json),
	// without their samples.
	Merged []Results     `json:"merged,omitempty"`
	Scale  *ScaleResults `json:"scale,omitempty"`
}

// Sample is one measured cell.
type Sample struct {
	Run    int    `json:"run"`
	Mode   string `json:"mode"`
	Size   string `json:"size"`
	Queues int    `json:"queues"`
	Tap    string `json:"tap"`

	Seconds   float64 `json:"seconds"`
	RxPackets uint64  `json:"rx_packets"` // datagrams; for TCP payload / frame payload
	RxBytes   uint64  `json:"rx_bytes"`   // payload the application read
	TxFrames  uint64  `json:"tx_frames"`  // write(2)s of data frames
	TxBytes   uint64  `json:"tx_bytes"`
	Retrans   uint64  `json:"retransmits"` // host to guest: holes the guest saw
	Paced     uint64  `json:"paced"`       // UDP writer waits for a backlog
	Blocked   uint64  `json:"blocked"`     // TCP writer found the window full
	ACKs      uint64  `json:"acks"`        // TCP ACKs the writer read from the tap, or the guest wrote

	// Qdisc is the tap's root qdisc as the kernel reports it, with the
	// kind of its children: "mq/pfifo_fast", "pfifo_fast", "noqueue".
	Qdisc string `json:"qdisc,omitempty"`
	// Round trips: percentiles of the request/response times in µs.
	P50Us float64 `json:"p50_us,omitempty"`
	P99Us float64 `json:"p99_us,omitempty"`

	PPS   float64 `json:"pps"`
	Gbps  float64 `json:"gbps"`
	TxPPS float64 `json:"tx_pps"`
	Loss  float64 `json:"loss"` // UDP: 1 - received/written
	// FramesPerSKB is frames the tap took (its rx_packets) per skb reaching
	// IP in the pod netns (Ip.InReceives): above 1 when GRO merged frames.
	FramesPerSKB float64 `json:"frames_per_skb"`
	// SegsPerSKB is IpExt.InNoECTPkts / Ip.InReceives: TCP segments per
	// skb. A GSO frame from a tap counts 1 (gso_segs is left 0 for it).
	SegsPerSKB float64 `json:"segs_per_skb"`

	// CPUPerFrameUs is CPU time of this benchmark's threads (writers,
	// receivers, threaded-NAPI kthreads) per frame delivered, in µs; it
	// includes softirq work done in their context. WriterPerFrameUs is the
	// writers' CPU time per frame written. Both hold up better than rates
	// when other work competes for the CPUs.
	CPUPerFrameUs    float64 `json:"cpu_us_per_frame"`
	WriterPerFrameUs float64 `json:"writer_us_per_frame"`
	// OtherCores is how busy the machine was with anything but this
	// benchmark's threads (softirq work included), in cores.
	OtherCores float64 `json:"other_cores"`

	Machine     CPUSplit          `json:"machine_cpu"`
	PerCPU      []CPUSplit        `json:"per_cpu"`
	Writer      ThreadCPU         `json:"writer_cpu"`
	Receiver    ThreadCPU         `json:"receiver_cpu"`
	NAPIThreads ThreadCPU         `json:"napi_threads_cpu"`
	NAPIThreadN int               `json:"napi_threads"`
	Net         map[string]uint64 `json:"netstat"`

	// NAPIThreadRuns: how often per second the kthreads were put on a CPU
	// (schedstat), about one wakeup each. Each costs the writer a wakeup
	// (an IPI when the kthread sleeps on another CPU) and the kthread a
	// context switch: where those are dear, threaded NAPI's gain goes there.
	NAPIThreadRuns float64 `json:"napi_thread_runs_per_s"`
}

// bench holds what outlives a cell: the pod netns.
type bench struct {
	opts  options
	ns    *podNetns
	cells int
	log   io.Writer
}

// run runs every cell and returns the samples; the pod netns and every tap
// are gone when it returns, whatever happened.
func run(ctx context.Context, opts options, log io.Writer) (res *Results, err error) {
	b, err := newBench(opts, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := b.close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
	}()
	res = &Results{Command: commandLine(opts.Args), Started: time.Now(), Machine: machineInfo(), Settings: settings(opts),
		Modes: modeNames(opts.Modes), Queues: opts.Queues, Runs: opts.Runs}
	res.Machine.Costs = measureCosts(b.log, "start")
	for _, s := range opts.Sizes {
		res.Sizes = append(res.Sizes, s.Name)
	}
	fmt.Fprintf(log, "datapath: netns %s, %d runs x %d sizes x %d queue counts x %d modes, %s each\n",
		b.ns.Name, opts.Runs, len(opts.Sizes), len(opts.Queues), len(opts.Modes), opts.Duration)
	for r := 1; r <= opts.Runs; r++ {
		for _, size := range opts.Sizes {
			for _, q := range opts.Queues {
				for i := range opts.Modes {
					// Rotate the order of the modes from run to run so that
					// none always follows the same neighbour.
					m := opts.Modes[(i+r-1)%len(opts.Modes)]
					s, err := b.cell(ctx, r, m, size, q)
					if err != nil && ctx.Err() == nil {
						fmt.Fprintf(log, "  run %d %s q%d %s: %v; once more\n", r, size.Name, q, m.Name, err)
						s, err = b.cell(ctx, r, m, size, q)
					}
					if err != nil {
						return res, fmt.Errorf("run %d, %s, %d queues, mode %s: %w", r, size.Name, q, m.Name, err)
					}
					res.Samples = append(res.Samples, s)
					fmt.Fprintf(log, "  run %d %-8s q%d %-14s %9.0f pps %7.2f Gbit/s  tx %9.0f pps  frames/skb %5.1f  cpu usr %.2f sys %.2f si %.2f\n",
						r, size.Name, q, m.Name, s.PPS, s.Gbps, s.TxPPS, s.FramesPerSKB, s.Machine.User, s.Machine.Sys, s.Machine.SoftIRQ)
				}
			}
		}
	}
	if opts.ScaleTaps > 0 {
		if res.Scale, err = b.scale(ctx); err != nil {
			return res, fmt.Errorf("threaded NAPI at scale: %w", err)
		}
	}
	res.Machine.CostsAtEnd = measureCosts(b.log, "end")
	res.Finished = time.Now()
	return res, nil
}

func newBench(opts options, log io.Writer) (*bench, error) {
	if log == nil {
		log = io.Discard
	}
	p, err := newPodNetns()
	if err != nil {
		return nil, err
	}
	return &bench{opts: opts, ns: p, log: log}, nil
}

func (b *bench) close() error {
	if b.ns == nil {
		return nil
	}
	err := b.ns.close()
	b.ns = nil
	return err
}

// cell measures one mode on one fresh tap.
func (b *bench) cell(ctx context.Context, run int, mode Mode, size Size, queues int) (s Sample, err error) {
	if err := ctx.Err(); err != nil {
		return s, err
	}
	b.cells++
	name := "napidp" + nstest.RandomSuffix()
	s = Sample{Run: run, Mode: mode.Name, Size: size.Name, Queues: queues, Tap: name}

	// No collection in the window; between cells, collect explicitly.
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	// Room for every pinned worker plus the main goroutine.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(runtime.NumCPU(), 2*queues+2)))

	tap, err := b.ns.createTap(name, mode, queues, true)
	if err != nil {
		return s, err
	}
	defer func() {
		if derr := tap.destroy(); derr != nil {
			err = errors.Join(err, derr)
		}
	}()

	c := &cellRun{b: b, tap: tap, size: size, listener: -1, start: time.Now(), tsBase: mrand.Uint32()}
	// Ports change from cell to cell, so nothing of the last cell's flows
	// can be taken for this one's.
	base := uint16(20000 + (b.cells*16)%20000)
	for i := 0; i < queues; i++ {
		f := &flow{idx: i, queueFD: tap.fds[i], srcPort: base + uint16(i), dstPort: 5201, sock: -1}
		switch {
		case size.Dir != guestToHost:
			f.dstPort = 9000 + uint16(i)
			if size.Proto == protoTCP {
				f.guest = &guestTCP{iss: mrand.Uint32()}
			} else {
				f.response = buildUDPFrame(tap.mac, f.srcPort, f.dstPort, size.Payload)
			}
		case size.Proto == protoUDP:
			f.dstPort = 9000 + uint16(i)
		default:
			f.tcp = &tcpState{iss: mrand.Uint32()}
		}
		c.flows = append(c.flows, f)
	}
	defer c.closeSockets()

	// The side that receives starts first and stops last: the pod's
	// receivers and the VMM's writers guest to host, the VMM's readers and
	// the pod's senders host to guest.
	receive, send := c.receiveUDP, c.writeUDP
	recvCPUs, sendCPUs := b.opts.ReceiverCPUs, b.opts.WriterCPUs
	recvTID, sendTID := func(f *flow) *atomic.Int32 { return &f.receiverTID }, func(f *flow) *atomic.Int32 { return &f.writerTID }
	switch {
	case size.Dir == guestToHost && size.Proto == protoTCP:
		receive, send = c.receiveTCP, c.writeTCP
	case size.Dir != guestToHost:
		receive, send = c.readQueue, c.sendUDP
		if size.Proto == protoTCP {
			send = c.sendTCP
		} else if size.Dir == roundTrip {
			send = c.roundTrips
		}
		recvCPUs, sendCPUs = sendCPUs, recvCPUs
		recvTID, sendTID = sendTID, recvTID
	}
	if size.Dir == guestToHost {
		if err := c.podReceivers(); err != nil {
			return s, err
		}
	}
	var ready, writers sync.WaitGroup
	stopped := false
	stopAll := func() error {
		if stopped {
			return nil
		}
		stopped = true
		c.stopWriters.Store(true)
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		if err := waitOrTimer(&writers, t, "senders"); err != nil {
			return err
		}
		c.stopReceivers.Store(true)
		return waitOrTimer(&c.wg, t, "receivers")
	}
	defer func() {
		if serr := stopAll(); serr != nil {
			err = errors.Join(err, serr)
		}
	}()
	for i, f := range c.flows {
		c.goPinned(recvCPUs[i%len(recvCPUs)], recvTID(f), &ready, fmt.Sprintf("receiver %d", i), nil, func() { receive(f) })
	}
	ready.Wait()
	if size.Dir != guestToHost {
		if err := b.ns.do(c.podSockets); err != nil {
			return s, fmt.Errorf("netns %s: %w", b.ns.Name, err)
		}
	}
	for i, f := range c.flows {
		writers.Add(1)
		c.goPinned(sendCPUs[i%len(sendCPUs)], sendTID(f), &ready, fmt.Sprintf("sender %d", i), writers.Done, func() { send(f) })
	}
	ready.Wait()

	sleep := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return c.err()
		}
	}
	if err := sleep(b.opts.Warmup); err != nil {
		return s, err
	}
	kthreads := napiThreads(name)
	if mode.Threaded && len(kthreads) == 0 {
		fmt.Fprintf(b.log, "  warning: threaded NAPI on %s but no napi/%s-* kernel thread found\n", name, name)
	}
	s0, err := c.snapshot(kthreads)
	if err != nil {
		return s, err
	}
	c.measuring.Store(true)
	if err := sleep(b.opts.Duration); err != nil {
		return s, err
	}
	c.measuring.Store(false)
	s1, err := c.snapshot(kthreads)
	if err != nil {
		return s, err
	}
	if err := stopAll(); err != nil {
		return s, err
	}
	if err := c.err(); err != nil {
		return s, err
	}
	c.fill(&s, s0, s1, len(kthreads))
	if s.RxPackets == 0 {
		// Seen only when other work starved the threads; the sample
		// stays, the report shows it.
		fmt.Fprintf(b.log, "  warning: %s: nothing received in %s (%d frames written, writer %.2f cores)\n",
			name, b.opts.Duration, s.TxFrames, s.Writer.User+s.Writer.Sys)
	}
	return s, nil
}

// waitOrTimer waits for wg until t fires.
func waitOrTimer(wg *sync.WaitGroup, t *time.Timer, what string) error {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-t.C:
		return fmt.Errorf("%s did not stop within 5s", what)
	}
}

// podReceivers opens the pod's receiving sockets of a guest-to-host cell
// and, for TCP, connects every flow.
func (c *cellRun) podReceivers() error {
	err := c.b.ns.do(func() error {
		if c.size.Proto == protoTCP {
			l, err := tcpListener(5201)
			c.listener = l
			return err
		}
		for _, f := range c.flows {
			fd, err := udpSocket(f.dstPort)
			if err != nil {
				return err
			}
			f.sock = fd
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netns %s: %w", c.b.ns.Name, err)
	}
	if c.size.Proto == protoTCP {
		return c.handshakes(c.tap.mac)
	}
	return nil
}

type snapshot struct {
	at                         time.Time
	txFrames, txBytes, retrans uint64
	paced, blocked, acks       uint64
	rxPackets, rxBytes         uint64
	qdisc                      string
	machine                    procfs.CPUStat
	perCPU                     []procfs.CPUStat
	wU, wS, rU, rS, kU, kS     uint64
	kRuns                      uint64
	net                        map[string]uint64
}

func (c *cellRun) snapshot(kthreads []int) (snapshot, error) {
	var s snapshot
	s.at = time.Now()
	var wt, rt []int
	for _, f := range c.flows {
		s.txFrames += f.txFrames.Load()
		s.txBytes += f.txBytes.Load()
		s.retrans += f.retrans.Load()
		s.paced += f.paced.Load()
		s.blocked += f.blocked.Load()
		s.rxPackets += f.rxPackets.Load()
		s.rxBytes += f.rxBytes.Load()
		s.acks += f.acks.Load()
		wt = append(wt, int(f.writerTID.Load()))
		rt = append(rt, int(f.receiverTID.Load()))
	}
	var err error
	if s.machine, s.perCPU, err = readProcStat(); err != nil {
		return s, err
	}
	s.wU, s.wS = threadTicks(wt)
	s.rU, s.rS = threadTicks(rt)
	s.kU, s.kS = pidTicks(kthreads)
	s.kRuns, _ = schedstats(kthreads)
	if s.net, s.qdisc, err = c.b.ns.netstat(c.tap.name); err != nil {
		return s, err
	}
	return s, nil
}

var netCounters = []string{
	"Tap.RxPackets", "Tap.TxPackets", "Tap.TxDropped", "Qdisc.Drops", "Qdisc.Requeues", "Ip.InReceives", "IpExt.InNoECTPkts", "Ip.InDiscards", "Udp.InDatagrams", "Udp.RcvbufErrors",
	"Udp.InErrors", "Udp.InCsumErrors", "Tcp.InSegs", "Tcp.OutSegs", "Tcp.InCsumErrors",
	"TcpExt.TCPOFOQueue", "TcpExt.TCPRcvQDrop", "TcpExt.PruneCalled", "TcpExt.TCPZeroWindowDrop",
}

func (c *cellRun) fill(s *Sample, a, b snapshot, kthreads int) {
	sec := b.at.Sub(a.at).Seconds()
	s.Seconds = sec
	s.RxPackets = b.rxPackets - a.rxPackets
	s.RxBytes = b.rxBytes - a.rxBytes
	s.TxFrames = b.txFrames - a.txFrames
	s.TxBytes = b.txBytes - a.txBytes
	s.Retrans = b.retrans - a.retrans
	s.Paced = b.paced - a.paced
	s.Blocked = b.blocked - a.blocked
	s.ACKs = b.acks - a.acks
	s.PPS = float64(s.RxPackets) / sec
	s.Gbps = float64(s.RxBytes) * 8 / sec / 1e9
	s.TxPPS = float64(s.TxFrames) / sec
	if c.size.Proto == protoUDP && s.TxFrames > 0 {
		s.Loss = max(0, 1-float64(s.RxPackets)/float64(s.TxFrames))
	}
	s.Net = map[string]uint64{}
	for _, k := range netCounters {
		s.Net[k] = b.net[k] - a.net[k]
	}
	if skbs := s.Net["Ip.InReceives"]; skbs > 0 {
		s.FramesPerSKB = float64(s.Net["Tap.RxPackets"]) / float64(skbs)
		s.SegsPerSKB = float64(s.Net["IpExt.InNoECTPkts"]) / float64(skbs)
	}
	s.Machine = split(a.machine, b.machine, len(b.perCPU))
	for i := range min(len(a.perCPU), len(b.perCPU)) {
		s.PerCPU = append(s.PerCPU, split(a.perCPU[i], b.perCPU[i], 1))
	}
	cores := func(d uint64) float64 { return float64(d) / userHZ / sec }
	s.Writer = ThreadCPU{User: cores(b.wU - a.wU), Sys: cores(b.wS - a.wS)}
	s.Receiver = ThreadCPU{User: cores(b.rU - a.rU), Sys: cores(b.rS - a.rS)}
	s.NAPIThreads = ThreadCPU{User: cores(b.kU - a.kU), Sys: cores(b.kS - a.kS)}
	s.NAPIThreadN = kthreads
	s.NAPIThreadRuns = float64(b.kRuns-a.kRuns) / sec
	var rtts []time.Duration
	for _, f := range c.flows {
		rtts = append(rtts, f.rtts...)
	}
	slices.Sort(rtts)
	s.P50Us, s.P99Us = percentileUs(rtts, 0.5), percentileUs(rtts, 0.99)
	s.Qdisc = b.qdisc
	s.derive()
}

// derive computes what follows from the measured fields.
func (s *Sample) derive() {
	s.CPUPerFrameUs, s.WriterPerFrameUs = 0, 0
	ours := s.Writer.User + s.Writer.Sys + s.Receiver.User + s.Receiver.Sys + s.NAPIThreads.User + s.NAPIThreads.Sys
	s.OtherCores = max(0, s.Machine.busy()-ours)
	if s.RxPackets > 0 && s.PPS > 0 {
		s.CPUPerFrameUs = ours * 1e6 / s.PPS
	}
	if s.TxFrames > 0 && s.TxPPS > 0 {
		s.WriterPerFrameUs = (s.Writer.User + s.Writer.Sys) * 1e6 / s.TxPPS
	}
}

// MachineInfo says where the numbers come from.
type MachineInfo struct {
	Kernel      string  `json:"kernel"`
	CPU         string  `json:"cpu"`
	CPUs        int     `json:"cpus"`
	MemoryGiB   float64 `json:"memory_gib"`
	GoVersion   string  `json:"go"`
	LoadAvg     string  `json:"loadavg_at_start"`
	Commit      string  `json:"commit,omitempty"`
	Virtualized string  `json:"hypervisor,omitempty"`
	// The costs that predict threaded NAPI's gain, at the run's start and end.
	Costs      *MachineCosts `json:"costs_at_start,omitempty"`
	CostsAtEnd *MachineCosts `json:"costs_at_end,omitempty"`
}

func machineInfo() MachineInfo {
	m := MachineInfo{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = fmt.Sprintf("Linux %s %s", unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:]))
	}
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if cpus, err := fs.CPUInfo(); err == nil && len(cpus) > 0 {
			m.CPU = cpus[0].ModelName
			if slices.Contains(cpus[0].Flags, "hypervisor") {
				m.Virtualized = "yes (cpuinfo flag hypervisor)"
			}
		}
		if mi, err := fs.Meminfo(); err == nil && mi.MemTotal != nil {
			m.MemoryGiB = float64(*mi.MemTotal) / (1 << 20)
		}
	}
	if raw, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(raw))
		if len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				m.Commit = s.Value
			}
		}
	}
	return m
}

func commandLine(args []string) string {
	parts := []string{"napitap-bench", "datapath"}
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"") {
			a = strconv.Quote(a)
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

func settings(o options) []string {
	var modes []string
	for _, m := range o.Modes {
		modes = append(modes, fmt.Sprintf("`%s`: %s", m.Name, m.describe()))
	}
	var sizes []string
	for _, s := range o.Sizes {
		sizes = append(sizes, fmt.Sprintf("`%s`: %s", s.Name, s.describe()))
	}
	return []string{
		fmt.Sprintf("%d runs, %s measured after %s of traffic, every cell on a fresh tap; modes interleaved within a run, their order rotated from run to run", o.Runs, o.Duration, o.Warmup),
		"writer = the VMM: 12-byte virtio-net header (TUNSETVNETHDRSZ 12), one frame per write(2); queue fds O_NONBLOCK, as Cloud Hypervisor, Firecracker and QEMU open them (frames up to a page take tun_build_skb)",
		"non-GSO frames: full checksums, all-zero vnet header (CHECKSUM_NONE: the kernel verifies them); GSO frames: gso_type TCPV4, gso_size 1448, NEEDS_CSUM, hdr_len 66",
		"TCP: the writer is the peer (SYN, SYN-ACK read from the tap, ACK), sends in order within the advertised window (ACKs read back from the tap fd), timestamps on (1 ms clock), ACK flag only; the receiver is a socket from accept(2) reading 512 KiB at a time, its buffer autotuned",
		fmt.Sprintf("UDP: the receiver uses recvmmsg(2), 64 datagrams per call, SO_RCVBUF %d MiB; a writer waits when more than %d of its frames are neither received nor dropped (0: never)", udpRcvBuf>>20, o.MaxBacklog),
		fmt.Sprintf("writers pinned to CPU(s) %v, receivers to CPU(s) %v (writer/receiver i on entry i mod n); threaded-NAPI kernel threads are left to the scheduler", o.WriterCPUs, o.ReceiverCPUs),
		"modes: " + strings.Join(modes, "; "),
		"sizes: " + strings.Join(sizes, "; "),
	}
}
