package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/tapsetup"
)

// fakeDevDir is a temp dir standing in for /sys/class/net/<dev> with only
// attrs in it, so a kernel without a knob can be played on any kernel.
func fakeDevDir(t *testing.T, attrs ...string) string {
	t.Helper()
	dir := t.TempDir()
	for _, a := range attrs {
		if err := os.WriteFile(filepath.Join(dir, a), []byte("0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestKernelNeeds(t *testing.T) {
	const allTun = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_ONE_QUEUE | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE | unix.IFF_NAPI | unix.IFF_NAPI_FRAGS
	linux512 := []string{"threaded", "gro_flush_timeout", "napi_defer_hard_irqs"}
	linux510 := []string{"gro_flush_timeout", "napi_defer_hard_irqs"}
	linux419 := []string{"gro_flush_timeout"}
	cases := []struct {
		name      string
		extra     string
		features  uint32
		attrs     []string
		noDevDir  bool
		wantField string // "" for no error
		wantIn    string
	}{
		{"the defaults are served where threaded exists", "", allTun, linux512, false, "", ""},
		{"the defaults need threaded NAPI, so a 5.10 kernel cannot serve them", "", allTun, linux510, false, "threadedNapi", `has no threaded; set "threadedNapi": false`},
		{"threaded NAPI off is served without threaded", `"threadedNapi":false`, allTun, linux419, false, "", ""},
		{"napi off needs no threaded either", `"napi":false`, allTun, linux419, false, "", ""},
		{"a kernel without IFF_NAPI cannot serve napi", `"threadedNapi":false`, allTun &^ unix.IFF_NAPI, linux419, false, "napi", "IFF_NAPI (Linux 4.15+)"},
		{"napiDeferHardIrqs needs napi_defer_hard_irqs", `"threadedNapi":false,"napiDeferHardIrqs":2`, allTun, linux419, false, "napiDeferHardIrqs", "Linux 5.10+"},
		{"napiDeferHardIrqs unset is never looked for", `"threadedNapi":false`, allTun, nil, false, "", ""},
		{"groFlushTimeout needs gro_flush_timeout", `"threadedNapi":false,"groFlushTimeout":20000`, allTun, nil, false, "groFlushTimeout", "has no gro_flush_timeout"},
		{"groFlushTimeout from args.cni needs it too", `"threadedNapi":false,"args":{"cni":{"groFlushTimeout":20000}}`, allTun, nil, false, "groFlushTimeout", "gro_flush_timeout"},
		{"more than one queue needs IFF_MULTI_QUEUE", `"queues":2`, allTun &^ unix.IFF_MULTI_QUEUE, linux512, false, "queues", "IFF_MULTI_QUEUE"},
		{"one queue does not", `"queues":1`, allTun &^ unix.IFF_MULTI_QUEUE, linux512, false, "", ""},
		{"without sysfs the knobs cannot be told and are left to ADD's write", "", allTun, nil, true, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := mustLoad(t, conf(tc.extra), att("tap0"))
			dir := fakeDevDir(t, tc.attrs...)
			if tc.noDevDir {
				dir = filepath.Join(dir, "none")
			}
			err := tapsetup.RequireKernel(c.KernelNeeds(), tc.features, dir)
			if tc.wantField == "" {
				if err != nil {
					t.Fatalf("RequireKernel = %v, want no error", err)
				}
				return
			}
			var unmet *tapsetup.UnmetNeedError
			if !errors.As(err, &unmet) || unmet.Need.Field != tc.wantField {
				t.Fatalf("RequireKernel = %v, want an unmet need of %s", err, tc.wantField)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tc.wantField+": ") || !strings.Contains(msg, tc.wantIn) {
				t.Errorf("message %q: want it to start with %q and contain %q", msg, tc.wantField+": ", tc.wantIn)
			}
		})
	}
}

func TestKernelProbeOnlyReads(t *testing.T) {
	dir := fakeDevDir(t, "threaded", "gro_flush_timeout", "napi_defer_hard_irqs")
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	for _, a := range []string{"threaded", "gro_flush_timeout", "napi_defer_hard_irqs"} {
		_ = os.Chmod(filepath.Join(dir, a), 0o444)
	}
	c := mustLoad(t, conf(`"groFlushTimeout":1,"napiDeferHardIrqs":1`), att("tap0"))
	if err := tapsetup.RequireKernel(c.KernelNeeds(), unix.IFF_TAP|unix.IFF_VNET_HDR|unix.IFF_NAPI, dir); err != nil {
		t.Fatalf("RequireKernel on read-only knobs = %v", err)
	}
	for _, a := range []string{"threaded", "gro_flush_timeout", "napi_defer_hard_irqs"} {
		if raw, _ := os.ReadFile(filepath.Join(dir, a)); string(raw) != "0\n" {
			t.Errorf("%s is %q after the probe, want it untouched", a, raw)
		}
	}
}
