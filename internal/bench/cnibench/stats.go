package cnibench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Percentile is the nearest-rank percentile of samples (0 < p <= 100): the
// smallest sample with at least p% of the samples at or below it. It is
// always one of the samples, so p99 of 50 samples is the largest. Zero for
// no samples.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// Series is what the runs of one plugin exec (or one whole chain) gave.
type Series struct {
	Wall   []time.Duration
	CPU    []time.Duration // user+sys of the process and the children it reaped
	MaxRSS int64           // bytes, the largest ru_maxrss seen
	// SysTotal sums the system part of CPU, where it is recorded (bursts).
	SysTotal time.Duration
}

// Add records one run.
func (s *Series) Add(wall, cpu time.Duration, maxRSS int64) {
	s.Wall = append(s.Wall, wall)
	s.CPU = append(s.CPU, cpu)
	s.MaxRSS = max(s.MaxRSS, maxRSS)
}

// Ratio is a/b, NaN when b is zero.
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// fmtDur prints a latency in milliseconds.
func fmtDur(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case d == 0:
		return "-"
	case ms < 1:
		return fmt.Sprintf("%.2f ms", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f ms", ms)
	default:
		return fmt.Sprintf("%.0f ms", ms)
	}
}

func fmtRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "-"
	}
	return fmt.Sprintf("%.2fx", r)
}

const mib = 1 << 20

func fmtMiB(bytes int64) string {
	if bytes == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f MiB", float64(bytes)/mib)
}

// fmtSlab prints a per-pod amount of kernel memory, which may come out
// negative when the machine freed more meanwhile.
func fmtSlab(bytes int64) string {
	return fmt.Sprintf("%.2f MiB", float64(bytes)/mib)
}
