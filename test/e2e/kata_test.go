package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/test/e2e/vm"
)

// TestKataDanGuestGetsNAPIThroughTheShimWrapper is Kata runtime-rs as far as
// it runs here (no KVM for Kata): the CNI chain of deploy/kata/nad.yaml
// (bridge + napitap with kataDan, intercept) runs in a throwaway node
// netns, and a VMM opens the DAN tap by name there, as runtime-rs's shim
// does (DESIGN.md fact 18), started through the shipped shim wrapper the
// way containerd starts a sandbox's shim. Its guest reaches the bridge's
// gateway with the pod's address, and GRO merges its segments on the tap:
// NAPI. The same VMM started without the wrapper gets plain queues.
func TestKataDanGuestGetsNAPIThroughTheShimWrapper(t *testing.T) {
	cases := []struct {
		name         string
		wrapped      bool
		wantMerged   bool
		wantAttaches int
	}{
		{"a VMM the shim wrapper starts opens the DAN tap in the node's netns by name and its guest sends through NAPI", true, true, 2},
		{"the same VMM started without the wrapper gets no NAPI", false, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGuestTraffic(t, guestNet{handoff: config.HandoffIntercept, kataDan: true}, func(t *testing.T, b bootSpec) guestVM {
				return bootKataShim(t, b, tc.wrapped)
			})
			if r.merged() != tc.wantMerged {
				t.Errorf("GRO merged guest segments: %v (longest frame %d), want %v", r.merged(), r.maxLen, tc.wantMerged)
			}
			if r.agentAttaches != tc.wantAttaches {
				t.Errorf("napitapd's seccomp agent attached %d queues with NAPI, want %d", r.agentAttaches, tc.wantAttaches)
			}
		})
	}
}

// bootKataShim runs QEMU, opening the tap by name in the tap's netns, as
// the "shim" the wrapper deploy/kata/containerd-shim-kata-napitap-v2 execs
// for a sandbox's start (KATA_SHIM), or directly.
func bootKataShim(t *testing.T, b bootSpec, wrapped bool) guestVM {
	t.Helper()
	qemu := vm.QEMUArgs(b.Kernel, b.Initrd, byNameNetdev(b.Tap), 2, b.Guest, b.Serial, true)
	var script strings.Builder
	script.WriteString("#!/bin/sh\nexec")
	for _, arg := range qemu {
		script.WriteString(" '" + strings.ReplaceAll(arg, "'", `'\''`) + "'")
	}
	shim := filepath.Join(t.TempDir(), "containerd-shim-kata-v2")
	if err := os.WriteFile(shim, []byte(script.String()+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	argv := []string{"nsenter", "--net=" + b.TapNetns.Path(), "--"}
	if !wrapped {
		return startVM(t, append(argv, shim), b.Serial)
	}
	wrapper, err := filepath.Abs("../../deploy/kata/containerd-shim-kata-napitap-v2")
	if err != nil {
		t.Fatal(err)
	}
	argv = append(argv, "env", "KATA_SHIM="+shim, "NAPITAPCTL="+filepath.Join(binDir, "napitapctl"),
		"NAPITAP_SECCOMP_SOCKET="+b.Daemon.SeccompSocket,
		wrapper, "-namespace", "k8s.io", "-address", "/run/containerd/containerd.sock", "-id", b.Env.ContainerID, "start")
	return startVM(t, argv, b.Serial)
}
