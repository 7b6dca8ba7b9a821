package oneproc

import (
	"runtime"
	"testing"
)

func TestImportingThePackageLeavesOneP(t *testing.T) {
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Errorf("GOMAXPROCS = %d, want 1", n)
	}
}
