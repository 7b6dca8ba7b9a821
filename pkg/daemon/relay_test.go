package daemon

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// A SIGTERM that ends the wait for the state dir's lock must still reach
// the select that stops the napitapd serving afterwards.
func TestASignalThatEndsTheLockWaitStillStopsNapitapd(t *testing.T) {
	stop := make(chan os.Signal, 1)
	done := make(chan struct{})
	defer close(done)
	called := make(chan struct{})
	out := relay(stop, func() { close(called) }, done)

	stop <- syscall.SIGTERM
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("the signal did not end the lock wait")
	}
	select {
	case s := <-out:
		if s != syscall.SIGTERM {
			t.Fatalf("relayed %v, want SIGTERM", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the signal was taken and not passed on")
	}
}
