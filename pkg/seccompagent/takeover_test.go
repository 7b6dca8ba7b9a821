package seccompagent

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// TestADetachedListenerIsServedByTheAgentThatAdoptsIt: Detach leaves the
// listener open, so the filter lives and a TUNSETIFF waits for whoever
// holds it next; the agent that adopts it answers with NAPI queues.
func TestADetachedListenerIsServedByTheAgentThatAdoptsIt(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccomp")
	const tap = "napisc0"
	newTap(t, pod, tapSpec{name: tap, multiQueue: true})
	target := Target{NAPI: true, MultiQueue: true}

	tests := []struct {
		name string
		// pending: the target's TUNSETIFF is made between Detach and
		// Adopt, when no agent reads the listener.
		pending bool
	}{
		{"a TUNSETIFF made after the hand-over gets NAPI queues from the new agent", false},
		{"a TUNSETIFF made while no agent reads waits and gets NAPI queues from the new agent", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := startAgent(t, slog.LevelInfo)
			old.manage(t, pod, tap, target)
			next := startAgent(t, slog.LevelInfo)
			next.manage(t, pod, tap, target)

			wait := filepath.Join(t.TempDir(), "go")
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := targetCmd(ctx, t, targetSpec{Netns: pod.Path(), Tap: tap, Queues: 2, Flags: qemuFlags, Probe: true, Wait: wait}, old.socket, filterFlags)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); old.agent.Listeners() == 0; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the old agent never got the target's listener")
				}
			}

			ls := old.agent.Detach()
			if len(ls) != 1 || old.agent.Listeners() != 0 {
				t.Fatalf("Detach: %d listeners, %d still served; want 1 and 0", len(ls), old.agent.Listeners())
			}
			if tc.pending {
				if err := os.WriteFile(wait, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				time.Sleep(200 * time.Millisecond) // the TUNSETIFF is queued in the kernel
			}
			for _, l := range ls {
				if err := next.agent.Adopt(l); err != nil {
					t.Fatalf("Adopt: %v", err)
				}
			}
			if !tc.pending {
				if err := os.WriteFile(wait, nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := cmd.Wait()
			res := decodeTarget(t, cmd, stdout.Bytes(), err, stderr.String())
			for i, e := range res.Errnos {
				if e != 0 || res.Flags[i]&unix.IFF_NAPI == 0 {
					t.Errorf("queue %d: TUNSETIFF %v, flags 0x%x; want 0 and IFF_NAPI", i, unix.Errno(e), res.Flags[i])
				}
			}
			if !res.Merged {
				t.Errorf("GRO probe on the last queue merged nothing: frame lengths %v", res.SKBLens)
			}
			// Once idle: the agent logs an attach after its answer.
			next.waitIdle(t)
			if n := bytes.Count([]byte(next.log.String()), []byte("attached the caller's queue with NAPI")); n != 2 {
				t.Errorf("the new agent attached %d queues, want 2", n)
			}
		})
	}
}
