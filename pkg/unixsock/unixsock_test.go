package unixsock

import (
	"net"
	"path/filepath"
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

func TestServeHandsEachConnectionOnAndReturnsOnceTheListenerIsClosed(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan *net.UnixConn, 3)
	done := make(chan error, 1)
	go func() {
		done <- Serve(l, func(err error, _ time.Duration) { t.Errorf("accept failed: %v", err) },
			func(c *net.UnixConn) { served <- c })
	}()
	for range 3 {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		(<-served).Close()
	}
	l.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after the listener closed: %v, want nil", err)
	}
}
