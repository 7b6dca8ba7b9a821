package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/internal/nstest"
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

// TestKataGoRuntimeTapsGetNAPIThroughTheShimWrapper: Kata's Go runtime
// (kata-deploy's kata-qemu, kata-clh) refuses a host-tap DAN file and
// makes its own tap in the pod netns, whose queues its shim opens and
// hands to the VMM (DESIGN.md fact 23): napitap's tap is never opened. A
// shim started through the shipped wrapper runs under napitapctl launch,
// whose listener gives the taps the tree creates NAPI as well. The fake
// shim makes its 2-queue tap as the Go runtime does and probes GRO on each
// queue: merged under the wrapper, nothing without it.
func TestKataGoRuntimeTapsGetNAPIThroughTheShimWrapper(t *testing.T) {
	nstest.RequireRoot(t)
	node := nstest.New(t, "katago-node")
	d := startNapitapd(t, node.Path())
	wrapper, err := filepath.Abs("../../deploy/kata/containerd-shim-kata-napitap-v2")
	if err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(binDir, "fake-kata-shim")
	cases := []struct {
		name    string
		wrapped bool
	}{
		{"the tap a shim under the wrapper makes gets NAPI on every queue", true},
		{"the same shim without the wrapper gets plain queues", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "katago-pod")
			before := d.ReadLog()
			argv := []string{"nsenter", "--net=" + pod.Path(), "--"}
			if tc.wrapped {
				argv = append(argv, "env", "KATA_SHIM="+shim, "NAPITAPCTL="+filepath.Join(binDir, "napitapctl"),
					"NAPITAP_SECCOMP_SOCKET="+d.SeccompSocket, wrapper)
			} else {
				argv = append(argv, shim)
			}
			cmd := exec.Command(argv[0], append(argv[1:], "-namespace", "k8s.io", "-id", "katago", "start")...)
			cmd.Dir = t.TempDir() // no config.json: a sandbox's start
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v\n%s", argv, err, out)
			}
			t.Logf("%s", out)
			want := fmt.Sprintf("merged=%v", tc.wrapped)
			if n := strings.Count(string(out), want); n != 2 {
				t.Errorf("%d of the 2 queues probed %s", n, want)
			}
			log := strings.TrimPrefix(d.ReadLog(), before)
			created, attached := strings.Count(log, "the caller created a tap, with NAPI on its queue"), strings.Count(log, "attached the caller's queue with NAPI")
			if want := map[bool]int{true: 1, false: 0}[tc.wrapped]; created != want || attached != 2*want {
				t.Errorf("napitapd logged %d taps created and %d queues attached with NAPI, want %d and %d:\n%s", created, attached, want, 2*want, log)
			}
		})
	}
}
