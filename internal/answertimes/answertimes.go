// Package answertimes reads napitapd_tunsetiff_answer_seconds, napitapd's
// histogram of how long its seccomp agent took to answer each TUNSETIFF,
// out of the text of its /metrics: what the e2e suites measure on a node.
package answertimes

import (
	"fmt"
	"io"
	"math"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metric is the histogram's name.
const Metric = "napitapd_tunsetiff_answer_seconds"

// Histogram is one outcome's answers: their count, the sum of their times
// in seconds, and the cumulative count under each bucket's bound, +Inf
// included.
type Histogram struct {
	Count, Sum float64
	Buckets    map[float64]float64
}

// Times is the histogram by outcome (napi, passed_through, ...).
type Times map[string]Histogram

// Parse reads the histogram out of a /metrics body.
func Parse(body io.Reader) (Times, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(body)
	if err != nil {
		return nil, fmt.Errorf("napitapd's /metrics: %w", err)
	}
	family, ok := families[Metric]
	if !ok {
		return nil, fmt.Errorf("napitapd's /metrics has no %s", Metric)
	}
	times := Times{}
	for _, m := range family.GetMetric() {
		h := m.GetHistogram()
		if h == nil {
			continue
		}
		var outcome string
		for _, l := range m.GetLabel() {
			if l.GetName() == "outcome" {
				outcome = l.GetValue()
			}
		}
		hist := Histogram{Count: float64(h.GetSampleCount()), Sum: h.GetSampleSum(),
			Buckets: map[float64]float64{math.Inf(1): float64(h.GetSampleCount())}}
		for _, b := range h.GetBucket() {
			hist.Buckets[b.GetUpperBound()] = float64(b.GetCumulativeCount())
		}
		times[outcome] = hist
	}
	return times, nil
}

// Since is what t gained since before for outcome.
func (t Times) Since(before Times, outcome string) Histogram {
	now, then := t[outcome], before[outcome]
	d := Histogram{Count: now.Count - then.Count, Sum: now.Sum - then.Sum, Buckets: map[float64]float64{}}
	for le, n := range now.Buckets {
		d.Buckets[le] = n - then.Buckets[le]
	}
	return d
}

// Within is the smallest bucket bound that holds frac of the answers: an
// upper bound at the histogram's resolution, +Inf past its last bound.
func (h Histogram) Within(frac float64) float64 {
	best := math.Inf(1)
	for le, n := range h.Buckets {
		if n >= frac*h.Count && le < best {
			best = le
		}
	}
	return best
}

// TopBound is the histogram's last finite bound.
func (h Histogram) TopBound() float64 {
	var top float64
	for le := range h.Buckets {
		if !math.IsInf(le, 1) {
			top = max(top, le)
		}
	}
	return top
}

// String gives the count, the mean and the smallest bounds that hold half
// and all of them.
func (h Histogram) String() string {
	if h.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("%v answered, mean %.0f µs, half within %g s, all within %g s",
		h.Count, h.Sum/h.Count*1e6, h.Within(0.5), h.Within(1))
}
