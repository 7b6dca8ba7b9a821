// Package metrics is napitapd's Prometheus metrics: what it holds, what
// its seccomp agent answered, its hand-off requests, takeovers and
// recoveries, served at /metrics (napitapd --metrics-address). A nil
// *Metrics records nothing, so callers need no check.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/buildinfo"
	"github.com/napitap/napitap/pkg/seccompagent"
)

// Metrics holds napitapd's collectors. Make it with New.
type Metrics struct {
	srv              *http.Server // while Serve serves
	reg              *prometheus.Registry
	tunsetiff        *prometheus.CounterVec
	tunsetiffSeconds *prometheus.HistogramVec
	requests         *prometheus.CounterVec
	takeovers        prometheus.Counter
	takeoverSeconds  prometheus.Histogram
	recoveries       prometheus.Counter
	plainQueues      *prometheus.CounterVec
}

// Why a VM's queue of a napitap tap ended without NAPI
// (napitapd_plain_queues_total's reason label; deploy/README.md).
const (
	// PlainHolderWait: no napitapd for the fd holder's bounded wait, so
	// the holder let the VMM's TUNSETIFF go on in the kernel (fact 22).
	PlainHolderWait = "holder_bounded_wait"
	// PlainLeftToKernel: the agent left a napitap tap's TUNSETIFF to the
	// kernel, unable to act for the caller (its credentials, its netns'
	// owners).
	PlainLeftToKernel = "left_to_kernel"
	// PlainCallerUnreadable: the agent gave up reading the caller's ifreq
	// (a stalled page) and let the kernel answer; which tap is unknown.
	PlainCallerUnreadable = "caller_unreadable"
	// PlainNotIntercepted: a queue of an intercept-mode tap that napitapd
	// did not attach and was not told of: its opener was not under
	// napitap's filter (found by napitapd's queue scan).
	PlainNotIntercepted = "not_intercepted"
)

// PlainReasons are every reason, each counted from 0.
var PlainReasons = []string{PlainHolderWait, PlainLeftToKernel, PlainCallerUnreadable, PlainNotIntercepted}

// Sources are what the gauges read when scraped.
type Sources struct {
	Attachments, HeldQueues, Listeners func() int
}

// New makes napitapd's metrics, its version among them
// (napitapd_build_info).
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		tunsetiff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napitapd_tunsetiff_total",
			Help: "TUNSETIFF calls the seccomp agent answered, by outcome: napi, passed_through, refused, error.",
		}, []string{"outcome"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napitapd_handoff_requests_total",
			Help: "Hand-off requests by operation (register, fetch, release, list, ...; connect for a connection refused before any) and result (ok, or the error code).",
		}, []string{"op", "result"}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "napitapd_takeovers_total",
			Help: "Takeovers of everything a running napitapd held, by this process (0 or 1).",
		}),
		takeoverSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "napitapd_takeover_seconds",
			Help:    "How long this process's takeover took, from its request to serving.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5},
		}),
		recoveries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "napitapd_recoveries_total",
			Help: "Starts that took back what a dead napitapd left in the fd holder (0 or 1).",
		}),
		tunsetiffSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "napitapd_tunsetiff_answer_seconds",
			Help: "How long the seccomp agent took to answer a TUNSETIFF, from reading the notification to sending the answer, by outcome: " +
				"what a VMM's open waits on napitapd, a passed_through one (a tap not napitap's) included.",
			Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 10e-3, 100e-3, 1},
		}, []string{"outcome"}),
		plainQueues: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "napitapd_plain_queues_total",
			Help: "Queues of napitap taps that a VMM attached without NAPI, by reason: holder_bounded_wait, left_to_kernel, caller_unreadable, not_intercepted.",
		}, []string{"reason"}),
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "napitapd_build_info",
		Help:        "napitapd's version, as --version prints it.",
		ConstLabels: prometheus.Labels{"version": buildinfo.Version()},
	})
	info.Set(1)
	m.reg.MustRegister(m.tunsetiff, m.tunsetiffSeconds, m.requests, m.takeovers, m.takeoverSeconds, m.recoveries, m.plainQueues, info,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, o := range []string{seccompagent.OutcomeNAPI, seccompagent.OutcomePassed, seccompagent.OutcomeRefused, seccompagent.OutcomeError} {
		m.tunsetiff.WithLabelValues(o) // present at 0 from the start
		m.tunsetiffSeconds.WithLabelValues(o)
	}
	for _, r := range PlainReasons {
		m.plainQueues.WithLabelValues(r) // an alert's rate() needs the 0
	}
	return m
}

// Watch registers the gauges of what napitapd holds, read from s at each
// scrape: napitapd_attachments and napitapd_held_queues (what napitapctl
// list shows), napitapd_seccomp_listeners.
func (m *Metrics) Watch(s Sources) {
	if m == nil {
		return
	}
	for _, g := range []struct {
		name, help string
		read       func() int
	}{
		{"napitapd_attachments", "Attachments napitapd records, as napitapctl list shows them.", s.Attachments},
		{"napitapd_held_queues", "Queue fds napitapd holds for fetches (napitapctl list's HELD, summed).", s.HeldQueues},
		{"napitapd_seccomp_listeners", "Seccomp listeners the agent serves: one per container or launched tree under napitap's filter.", s.Listeners},
	} {
		read := g.read
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: g.name, Help: g.help}, func() float64 {
			if read == nil {
				return 0
			}
			return float64(read())
		}))
	}
}

// TUNSETIFF counts one answered TUNSETIFF, a seccompagent.Outcome*, and
// how long its answer took.
func (m *Metrics) TUNSETIFF(outcome string, took time.Duration) {
	if m != nil {
		m.tunsetiff.WithLabelValues(outcome).Inc()
		m.tunsetiffSeconds.WithLabelValues(outcome).Observe(took.Seconds())
	}
}

// PlainQueue counts one queue that ended without NAPI, for reason (one of
// PlainReasons).
func (m *Metrics) PlainQueue(reason string) {
	if m != nil {
		m.plainQueues.WithLabelValues(reason).Inc()
	}
}

// PlainQueues is what napitapd_plain_queues_total holds for reason: for
// tests, which see what a scrape would.
func (m *Metrics) PlainQueues(reason string) float64 {
	var out dto.Metric
	if m == nil || m.plainQueues.WithLabelValues(reason).Write(&out) != nil {
		return 0
	}
	return out.GetCounter().GetValue()
}

// Request counts one hand-off request.
func (m *Metrics) Request(op, result string) {
	if m != nil {
		m.requests.WithLabelValues(op, result).Inc()
	}
}

// TookOver records this process's takeover, which took d.
func (m *Metrics) TookOver(d time.Duration) {
	if m != nil {
		m.takeovers.Inc()
		m.takeoverSeconds.Observe(d.Seconds())
	}
}

// Recovered records a start from what the fd holder kept.
func (m *Metrics) Recovered() {
	if m != nil {
		m.recoveries.Inc()
	}
}

// Serve serves /metrics on addr (host:port) until Stop. The port is
// shared (SO_REUSEPORT): during a takeover the old napitapd serves until it
// hands over (and stops), the new one from its start.
func (m *Metrics) Serve(addr string, log *slog.Logger) error {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1) }); cerr != nil {
			return cerr
		}
		return err
	}}
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	m.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func(srv *http.Server) {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics: serve", "address", addr, "err", err)
		}
	}(m.srv)
	log.Info("metrics: serving /metrics", "address", l.Addr().String())
	return nil
}

// Stop stops serving /metrics: a napitapd that handed everything over
// has nothing to report.
func (m *Metrics) Stop() {
	if m == nil || m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = m.srv.Shutdown(ctx)
}
