package nice

import (
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/napitap/napitap/internal/nstest"
)

func TestSetAllReachesEveryThreadAndThoseStartedLater(t *testing.T) {
	nstest.RequireRoot(t) // to go back below the value set
	t.Cleanup(func() {
		if err := SetAll(0); err != nil {
			t.Errorf("back to nice 0: %v", err)
		}
	})
	// Busy threads first, so that there are several to set.
	var wg sync.WaitGroup
	hold := make(chan struct{})
	for range 4 {
		wg.Go(func() { runtime.LockOSThread(); <-hold })
	}
	if err := SetAll(5); err != nil {
		t.Fatal(err)
	}
	// Threads the runtime starts now take a creator's value.
	for range 4 {
		wg.Go(func() { runtime.LockOSThread(); <-hold })
	}
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if n, err := Of(tid); err != nil {
			t.Error(err)
		} else if n != 5 {
			t.Errorf("thread %d has nice %d, want 5", tid, n)
		}
	}
	close(hold)
	wg.Wait()
}

func TestSetAllRefusesWhatIsNotANiceValue(t *testing.T) {
	for _, n := range []int{Min - 1, Max + 1} {
		if err := SetAll(n); err == nil || !strings.Contains(err.Error(), "want -20..19") {
			t.Errorf("SetAll(%d) = %v, want a range error", n, err)
		}
	}
}
