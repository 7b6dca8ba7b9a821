package handoff_test

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
)

// TestClientErrorsNameTheSocketOnce: whatever goes wrong, the error says
// which napitapd, once; callers add only what they know more.
func TestClientErrorsNameTheSocketOnce(t *testing.T) {
	dir := t.TempDir()
	hangsUp := filepath.Join(dir, "hangs-up.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: hangsUp, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	d := newDaemon(t)
	key := handoff.Key{ContainerID: "nosuchvm", IfName: "net1"}
	for _, tc := range []struct {
		name, socket, want string
	}{
		{"no napitapd at the socket", filepath.Join(dir, "missing.sock"), "napitapd unreachable"},
		{"a napitapd that hangs up without an answer", hangsUp, "hung up without an answer"},
		{"a napitapd that refuses", d.socket, "not-found: no attachment nosuchvm/net1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Under TCG the dial and its checks alone can outlast 100ms.
			_, _, err := (&handoff.Client{Socket: tc.socket, Timeout: 100 * time.Millisecond * nstest.TimeScale()}).Fetch(&key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Fetch: %v, want an error saying %q", err, tc.want)
			}
			if n := strings.Count(err.Error(), tc.socket); n != 1 {
				t.Errorf("Fetch: %q names the socket %d times, want once", err, n)
			}
		})
	}
}
