package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/crihelp"
)

// crash SIGKILLs d's napitapd, runs during while none serves, then starts
// the next one on d's paths and flags, as the kubelet restarts a killed
// container. It returns the next one's log path once it serves. d's
// process stays unreaped for crihelp's clean-up.
func crash(t *testing.T, d *crihelp.Napitapd, during func()) string {
	t.Helper()
	if err := syscall.Kill(d.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, d.Pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid napitapd %d: %v", d.Pid, err)
	}
	killed := time.Now()
	during()
	logPath := startNext(t, d, "napitapd-restarted.log")
	var recovered string
	err := crihelp.Poll(15*time.Second, func() error {
		b, _ := os.ReadFile(logPath)
		if !strings.Contains(string(b), "msg=serving") {
			return fmt.Errorf("the napitapd started after the SIGKILL does not serve:\n%s", b)
		}
		recovered = regexp.MustCompile(`msg="fd holder: recovered[^\n]*`).FindString(string(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("napitapd SIGKILLed; the next one serves %v later; %s", time.Since(killed).Round(time.Millisecond), recovered)
	return logPath
}

// TestACrashUnderARunningGuestLosesNothing: napitapd, beside an fd
// holder as in the DaemonSet's pod, is SIGKILLed while a guest runs. The
// holder keeps its listener and held queues; the napitapd started next
// takes them back, and the guest's traffic and what its runtime asks
// after go on through NAPI.
func TestACrashUnderARunningGuestLosesNothing(t *testing.T) {
	t.Run("QEMU by name under napitapctl launch keeps its NAPI queues, and a queue opened by name while napitapd is dead waits, then gets NAPI", func(t *testing.T) {
		var nextLog string
		var opened openerResult
		r := runGuestTraffic(t, guestNet{handoff: config.HandoffIntercept, holder: true}, func(t *testing.T, b bootSpec) guestVM {
			v, o := bootQEMUWithOpener(t, b)
			nextLog = crash(t, b.Daemon, func() {
				// The opener's TUNSETIFF goes to a listener nobody serves
				// but the holder keeps: it waits instead of failing.
				o.open(t)
				time.Sleep(time.Second)
				if o.finished() {
					t.Error("the opener finished while no napitapd ran: its TUNSETIFF did not wait")
				}
			})
			opened = o.result(t, "while napitapd was dead")
			return v
		})
		opened.check(t, "while napitapd was dead")
		if !r.merged() {
			t.Errorf("the guest's segments after the crash were not merged (longest frame %d)", r.maxLen)
		}
		b, _ := os.ReadFile(nextLog)
		if n := strings.Count(string(b), "attached the caller's queue with NAPI"); n != 1 {
			t.Errorf("the napitapd started after the crash attached %d queues, want the opener's 1", n)
		}
	})
	t.Run("a guest on held queues fetched after napitapd was SIGKILLed sends through NAPI, on the queues the holder kept", func(t *testing.T) {
		r := runGuestTraffic(t, guestNet{handoff: config.HandoffFDs, holder: true}, func(t *testing.T, b bootSpec) guestVM {
			crash(t, b.Daemon, func() {})
			atts, err := (&handoff.Client{Socket: b.Daemon.Socket}).List()
			if err != nil || len(atts) != 1 || atts[0].Held != 2 {
				t.Errorf("after the crash napitapd lists %+v (%v), want the attachment holding its 2 queues", atts, err)
			}
			return bootQEMUOnFetchedFds(t, b)
		})
		if !r.merged() {
			t.Errorf("GRO merged nothing of the guest on queues fetched after the crash (longest frame %d)", r.maxLen)
		}
	})
}
