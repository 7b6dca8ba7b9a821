package main

import (
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/daemon"
	"github.com/napitap/napitap/pkg/takeover"
)

// TestOneSIGTERMStopsNapitapdWithinItsBoundWhateverAPeerDoes: a peer that
// holds a connection open (a sender that never sends, a takeover that
// never says ready, a client that never reads) delays napitapd's stop by
// at most daemon.StopGrace; so does a process under its seccomp filter
// that stalls the agent's read of its memory.
func TestOneSIGTERMStopsNapitapdWithinItsBoundWhateverAPeerDoes(t *testing.T) {
	nstest.RequireRoot(t)
	cases := []struct {
		name string
		// hold connects to napitapd at p and returns once the connection
		// is in the state the case names; it stays open until the test ends.
		hold func(t *testing.T, p paths, d *napitapd)
	}{
		{"a root sender that connects to the seccomp socket and says nothing", func(t *testing.T, p paths, d *napitapd) {
			dial(t, "unix", p.seccomp)
		}},
		{"a napitapd that takes over and never says ready", func(t *testing.T, p paths, d *napitapd) {
			c := dial(t, "unixpacket", takeover.Socket(p.state))
			if _, err := c.Write([]byte(`{"version":1,"op":"hello","versions":[1]}`)); err != nil {
				t.Fatal(err)
			}
			waitLog(t, d, "a new napitapd takes over; stopping")
		}},
		{"a client that sends requests and never reads the answers", func(t *testing.T, p paths, d *napitapd) {
			c := dial(t, "unixpacket", p.socket)
			for range 64 {
				_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
				if _, err := c.Write([]byte(`{"version":1,"op":"status"}`)); err != nil {
					break // its buffer is full
				}
			}
		}},
		{"a launched process whose TUNSETIFF has its ifreq on a userfaultfd page nobody fills", func(t *testing.T, p paths, d *napitapd) {
			startStalledCaller(t, p.seccomp, d.cmd.Process.Pid)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			p := paths{socket: filepath.Join(dir, "napitapd.sock"), seccomp: filepath.Join(dir, "seccomp.sock"), state: filepath.Join(dir, "state")}
			d := startNapitapdProc(t, p)
			waitLog(t, d, "msg=serving")
			tc.hold(t, p, d)
			start := time.Now()
			if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			// The bound, and a second for a loaded machine.
			d.waitExit(t, daemon.StopGrace+time.Second, "napitapd after one SIGTERM")
			t.Logf("stopped %v after SIGTERM", time.Since(start).Round(time.Millisecond))
		})
	}
}

func dial(t *testing.T, network, path string) *net.UnixConn {
	t.Helper()
	c, err := net.DialUnix(network, nil, &net.UnixAddr{Name: path, Net: network})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func waitLog(t *testing.T, d *napitapd, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.log.String(), line) {
		if time.Now().After(deadline) {
			t.Fatalf("napitapd never logged %q:\n%s", line, d.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
