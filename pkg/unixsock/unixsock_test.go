package unixsock

import (
	"testing"
	"time"
)

func TestEveryLetsOneLinePerIntervalThrough(t *testing.T) {
	e := Every{Interval: 10 * time.Second}
	if ok, n := e.Allow(); !ok || n != 0 {
		t.Fatalf("first event: Allow() = %v, %d; want true, 0", ok, n)
	}
	for range 99 {
		if ok, _ := e.Allow(); ok {
			t.Fatal("a second event within the interval was let through")
		}
	}
	e.next = time.Now() // the interval has passed
	if ok, n := e.Allow(); !ok || n != 99 {
		t.Errorf("after the interval: Allow() = %v, %d; want true and the 99 held back", ok, n)
	}
}

func TestAcceptBackoffGrowsToOneSecond(t *testing.T) {
	var d time.Duration
	var got []time.Duration
	for range 10 {
		d = AcceptBackoff(d)
		got = append(got, d)
	}
	if got[0] != 5*time.Millisecond || got[1] != 10*time.Millisecond || got[len(got)-1] != time.Second {
		t.Errorf("backoff %v: want 5ms, 10ms, ... up to 1s", got)
	}
}
