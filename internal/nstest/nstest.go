// Package nstest gives privileged tests real network namespaces with names
// that say who made them, and removes them even when a test fails.
package nstest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RequireRoot skips a test that needs root and network namespaces, except
// under CI=true, where not being able to run it is a failure.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		if _, err := os.Stat("/dev/net/tun"); err == nil {
			return
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("this test needs root and /dev/net/tun, and CI=true forbids skipping it")
	}
	t.Skip("needs root and /dev/net/tun")
}

// NetNS is a named network namespace under /run/netns.
type NetNS struct {
	ns.NetNS
	Name string
}

// New creates the netns "napitap-<role>-<random>" and deletes it when the
// test ends, whatever the outcome.
func New(t testing.TB, role string) *NetNS {
	t.Helper()
	n, err := Add("napitap-" + role + "-" + RandomSuffix())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Delete(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// Add creates the netns name under /run/netns and opens it, for callers
// that are not tests (the benches); Delete removes it.
func Add(name string) (*NetNS, error) {
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ip netns add %s: %v: %s", name, err, bytes.TrimSpace(out))
	}
	h, err := ns.GetNS(filepath.Join("/run/netns", name))
	if err != nil {
		n := &NetNS{Name: name}
		return nil, errors.Join(fmt.Errorf("open netns %s: %w", name, err), n.Delete())
	}
	return &NetNS{NetNS: h, Name: name}, nil
}

// Delete closes the netns and removes it from /run/netns.
func (n *NetNS) Delete() error {
	if n.NetNS != nil {
		_ = n.Close()
	}
	if out, err := exec.Command("ip", "netns", "del", n.Name).CombinedOutput(); err != nil {
		return fmt.Errorf("ip netns del %s: %v: %s", n.Name, err, bytes.TrimSpace(out))
	}
	return nil
}

// RandomSuffix is 6 hex digits, short enough for interface names.
func RandomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Run runs fn inside the netns and fails the test on error.
func (n *NetNS) Run(t testing.TB, fn func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatalf("in netns %s: %v", n.Name, err)
	}
}

// WatchLinkNames records the name in every RTM_NEWLINK the kernel sends in
// the netns (a link made, changed or renamed) from now on. The function it
// returns stops watching and gives the names in the kernel's order,
// repeated as often as they were announced.
func (n *NetNS) WatchLinkNames(t testing.TB) func() []string {
	t.Helper()
	updates, done := make(chan netlink.LinkUpdate, 4096), make(chan struct{})
	// The socket belongs to the netns it is made in.
	n.Run(t, func() error { return netlink.LinkSubscribe(updates, done) })
	var once sync.Once
	stop := func() { once.Do(func() { close(done) }) }
	t.Cleanup(stop)
	return func() []string {
		t.Helper()
		// Announcements arrive in order: once this bridge's has, every
		// earlier one has too.
		end := "napiwatch" + RandomSuffix()
		n.Run(t, func() error {
			br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: end}}
			if err := netlink.LinkAdd(br); err != nil {
				return err
			}
			return netlink.LinkDel(br)
		})
		defer stop()
		var names []string
		timeout := time.After(10 * time.Second)
		for {
			select {
			case u, ok := <-updates:
				if !ok {
					t.Fatalf("netns %s: link announcements ended before %s's", n.Name, end)
				}
				if u.Attrs().Name == end {
					return names
				}
				if u.Header.Type == unix.RTM_NEWLINK {
					names = append(names, u.Attrs().Name)
				}
			case <-timeout:
				t.Fatalf("netns %s: no announcement of %s within 10 s", n.Name, end)
			}
		}
	}
}

// TimeScaleEnv multiplies the time limits of tests that measure how long
// napitap takes (not those that wait for something to happen): a guest
// under QEMU TCG (make test-kernel sets it) runs code 10 to 50 times
// slower than the machine it emulates.
const TimeScaleEnv = "NAPITAP_TEST_TIME_SCALE"

// TimeScale is TimeScaleEnv's factor, 1 unless it is set.
func TimeScale() time.Duration {
	if n, err := strconv.Atoi(os.Getenv(TimeScaleEnv)); err == nil && n > 1 {
		return time.Duration(n)
	}
	return 1
}
