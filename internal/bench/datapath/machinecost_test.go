package datapath

import (
	"math"
	"strings"
	"testing"
)

// Timings depend on the machine: only their being measured is checked.
func TestTheMachinesCostsArePositiveFiniteAndInTheReport(t *testing.T) {
	c := measureCosts(testLog{t}, "start")
	if c == nil {
		t.Fatal("no machine costs")
	}
	for _, v := range []float64{c.SyscallUs, c.WakeupRoundUs} {
		if !(v > 0) || math.IsInf(v, 0) {
			t.Errorf("machine costs %+v: want positive, finite µs", *c)
		}
	}
	res, opts := testResults()
	res.Machine.Costs = c
	if md := newTable(res, opts).markdown(); !strings.Contains(md, "- Machine costs: a system call ") {
		t.Errorf("report lacks the machine's costs:\n%s", md)
	}
}
