package seccompagent

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/internal/syncbuf"
)

// TestTheTapsALaunchedTreeCreatesGetNAPIInTheCallersCredentials: on a
// listener napitapctl launch sent, a tap the tree makes itself (Kata's Go
// runtime's tapN_kata) gets NAPI on every queue; the kernel still judges
// the caller, so one without CAP_NET_ADMIN gets EPERM and no tap; a tap
// nobody here made stays the kernel's, and so does every tap a listener
// of runc's creates.
func TestTheTapsALaunchedTreeCreatesGetNAPIInTheCallersCredentials(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "seccompown")
	const other = "napiown9"
	newTap(t, pod, tapSpec{name: other, multiQueue: true})
	ta := startAgent(t, slog.LevelInfo)
	nobody := 65534

	tests := []struct {
		name      string
		spec      targetSpec
		wantErrno unix.Errno
		wantNAPI  bool
		wantLog   string
	}{
		{"a tap the launched tree creates gets NAPI on both its queues",
			targetSpec{Tap: "napiown0", Queues: 2, Flags: qemuFlags}, 0, true, "the caller created a tap, with NAPI on its queue"},
		{"a caller without CAP_NET_ADMIN gets the kernel's EPERM, and no tap",
			targetSpec{Tap: "napiown1", Queues: 1, Flags: qemuFlags, UID: &nobody, GID: &nobody}, unix.EPERM, false, "caller may not attach: EPERM"},
		{"a tap that exists and that neither napitap nor the tree made stays the kernel's",
			targetSpec{Tap: other, Queues: 1, Flags: qemuFlags}, 0, false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := len(ta.log.String())
			tc.spec.Netns = pod.Path()
			res := runTargetProc(t, tc.spec, ta.socket)
			for i, e := range res.Errnos {
				if unix.Errno(e) != tc.wantErrno {
					t.Fatalf("queue %d: TUNSETIFF: %v, want %v", i, unix.Errno(e), tc.wantErrno)
				}
				if got := res.Flags[i]&unix.IFF_NAPI != 0; e == 0 && got != tc.wantNAPI {
					t.Errorf("queue %d: TUNGETIFF flags 0x%x, IFF_NAPI %v, want %v", i, res.Flags[i], got, tc.wantNAPI)
				}
			}
			if log := ta.log.String()[before:]; tc.wantLog != "" && !strings.Contains(log, tc.wantLog) {
				t.Errorf("the agent did not log %q:\n%s", tc.wantLog, log)
			}
			if tc.spec.Tap != other {
				pod.Run(t, func() error {
					if _, err := netlink.LinkByName(tc.spec.Tap); err == nil {
						t.Errorf("tap %s is left after its caller exited", tc.spec.Tap)
					}
					return nil
				})
			}
			ta.waitIdle(t)
		})
	}

	t.Run("a tap a caller under runc's listener creates is the kernel's", func(t *testing.T) {
		listener, res := callerUnderFilter(t, pod.Path(), "napiown2")
		agent := newSlotTestAgent(t, &MapRegistry{}, &syncbuf.Buffer{}, nil)
		if err := agent.Adopt(Listener{File: listener, Origin: "runc"}); err != nil {
			t.Fatal(err)
		}
		if r := awaitCaller(t, res); r.errno != 0 || r.flags&unix.IFF_NAPI != 0 {
			t.Errorf("the caller's TUNSETIFF: %v, flags 0x%x; want 0 and no IFF_NAPI", r.errno, r.flags)
		}
		waitServed(t, agent, 0)
	})
}
