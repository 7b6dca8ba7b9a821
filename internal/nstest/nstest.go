// Package nstest gives privileged tests real network namespaces with names
// that say who made them, and removes them even when a test fails.
package nstest

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
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
	name := "napitap-" + role + "-" + RandomSuffix()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	netns, err := ns.GetNS(filepath.Join("/run/netns", name))
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	t.Cleanup(func() { netns.Close() })
	return &NetNS{NetNS: netns, Name: name}
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
