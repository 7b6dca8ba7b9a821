package answertimes

import (
	"math"
	"strings"
	"testing"
)

const before = `# HELP napitapd_tunsetiff_answer_seconds How long the seccomp agent took.
# TYPE napitapd_tunsetiff_answer_seconds histogram
napitapd_tunsetiff_answer_seconds_bucket{outcome="napi",le="0.001"} 1
napitapd_tunsetiff_answer_seconds_bucket{outcome="napi",le="0.01"} 2
napitapd_tunsetiff_answer_seconds_bucket{outcome="napi",le="+Inf"} 2
napitapd_tunsetiff_answer_seconds_sum{outcome="napi"} 0.006
napitapd_tunsetiff_answer_seconds_count{outcome="napi"} 2
napitapd_tunsetiff_answer_seconds_bucket{outcome="passed_through",le="0.001"} 0
napitapd_tunsetiff_answer_seconds_bucket{outcome="passed_through",le="0.01"} 0
napitapd_tunsetiff_answer_seconds_bucket{outcome="passed_through",le="+Inf"} 0
napitapd_tunsetiff_answer_seconds_sum{outcome="passed_through"} 0
napitapd_tunsetiff_answer_seconds_count{outcome="passed_through"} 0
`

const after = `# TYPE napitapd_tunsetiff_answer_seconds histogram
napitapd_tunsetiff_answer_seconds_bucket{outcome="napi",le="0.001"} 3
napitapd_tunsetiff_answer_seconds_bucket{outcome="napi",le="0.01"} 5
napitapd_tunsetiff_answer_seconds_bucket{outcome="napi",le="+Inf"} 6
napitapd_tunsetiff_answer_seconds_sum{outcome="napi"} 2.026
napitapd_tunsetiff_answer_seconds_count{outcome="napi"} 6
`

func TestABurstsAnswersAreWhatTheHistogramGainedOverIt(t *testing.T) {
	b, err := Parse(strings.NewReader(before))
	if err != nil {
		t.Fatal(err)
	}
	a, err := Parse(strings.NewReader(after))
	if err != nil {
		t.Fatal(err)
	}
	d := a.Since(b, "napi")
	if d.Count != 4 || math.Abs(d.Sum-2.02) > 1e-9 {
		t.Errorf("gained %v answers, %v s, want 4 and 2.02", d.Count, d.Sum)
	}
	if got := d.Within(0.5); got != 0.001 {
		t.Errorf("half within %v, want 0.001", got)
	}
	if got := d.Within(0.99); !math.IsInf(got, 1) || d.TopBound() != 0.01 {
		t.Errorf("p99 within %v past %v, want +Inf past 0.01", got, d.TopBound())
	}
	if none := a.Since(b, "passed_through"); none.Count != 0 || none.String() != "none" {
		t.Errorf("an outcome gone from the scrape: %+v", none)
	}
	if _, err := Parse(strings.NewReader("# TYPE other counter\nother 1\n")); err == nil {
		t.Error("a body without the histogram parsed")
	}
}
