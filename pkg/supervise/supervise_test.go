package supervise

import (
	"io"
	"log/slog"
	"os/exec"
	"testing"
	"time"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		policy     Policy
		wantCode   int
		wantStarts int
	}{
		{"a child that exits by itself ends it with its status", "exit 3", DefaultPolicy, 3, 1},
		{"a child that exits 0 ends it with 0", "exit 0", DefaultPolicy, 0, 1},
		{"a child killed by a signal is started again until the policy's restarts are spent", "kill -9 $$", Policy{MaxRestarts: 2, Window: time.Minute}, 128 + 9, 3},
		{"a child killed by SIGABRT (a Go panic under GOTRACEBACK=crash) is started again too", "kill -ABRT $$", Policy{MaxRestarts: 1, Window: time.Minute}, 128 + 6, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			starts := 0
			code, err := Run(slog.New(slog.NewTextHandler(io.Discard, nil)), tc.policy, func() *exec.Cmd {
				starts++
				return exec.Command("sh", "-c", tc.script)
			})
			if err != nil || code != tc.wantCode || starts != tc.wantStarts {
				t.Errorf("Run: code %d, %v, %d starts; want code %d, %d starts", code, err, starts, tc.wantCode, tc.wantStarts)
			}
		})
	}
}
