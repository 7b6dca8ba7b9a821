package deploytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// kataShim is the Kata shim wrapper of deploy/kata.
const kataShim = "containerd-shim-kata-napitap-v2"

// The wrapper puts only a sandbox's start under napitapctl launch: that
// start spawns the shim server, which opens the tap and must inherit the
// filter. containerd's other calls reach the shim directly, so they work
// while napitapd is down; all keep their arguments as containerd gave them.
func TestKataShimWrapperLaunchesOnlyASandboxStart(t *testing.T) {
	const (
		sandbox   = `{"annotations":{"io.kubernetes.cri.container-type":"sandbox","io.kubernetes.cri.sandbox-id":"c0ffee"}}`
		container = `{"annotations":{"io.kubernetes.cri.container-type":"container","io.kubernetes.cri.sandbox-id":"c0ffee"}}`
	)
	// What containerd (runtime/v2 binary.go and shim util.go) passes first.
	shimArgs := []string{"-namespace", "k8s.io", "-address", "/run/containerd/containerd.sock", "-publish-binary", "/usr/bin/containerd"}
	tests := []struct {
		name     string
		spec     string // the bundle's config.json, the start's working directory; none if empty
		args     []string
		launched bool
	}{
		{"a sandbox's start goes through napitapctl launch", sandbox, slices.Concat(shimArgs, []string{"-id", "c0ffee", "start"}), true},
		{"a debug start goes through napitapctl launch", sandbox, slices.Concat(shimArgs, []string{"-id", "c0ffee", "-debug", "start"}), true},
		{"a start without CRI annotations goes through napitapctl launch", `{}`, slices.Concat(shimArgs, []string{"-id", "c0ffee", "start"}), true},
		{"a start without a bundle goes through napitapctl launch", "", slices.Concat(shimArgs, []string{"-id", "c0ffee", "start"}), true},
		{"the start of a pod's other container runs the shim directly", container, slices.Concat(shimArgs, []string{"-id", "beef", "start"}), false},
		{"delete runs the shim directly", "", slices.Concat(shimArgs, []string{"-id", "c0ffee", "-bundle", "/run/containerd/io.containerd.runtime.v2.task/k8s.io/c0ffee", "delete"}), false},
		{"containerd 2.x's -info runs the shim directly", "", []string{"-info"}, false},
		{"-version runs the shim directly", "", []string{"-version"}, false},
		{"arguments reach a launched shim unchanged", sandbox, []string{"-namespace", "a b", "-id", "$HOME *", "-address", "", "start"}, true},
		{"arguments reach the shim unchanged", "", []string{"-namespace", "a b", "-id", "$HOME *", "-bundle", "", "delete"}, false},
	}
	wrapper := filepath.Join(repoRoot, "deploy", "kata", kataShim)
	bin := t.TempDir()
	// The fake napitapctl records its arguments and runs what follows "--",
	// as launch does after installing the filter.
	napitapctl := writeScript(t, bin, "napitapctl", `printf '%s\n' "$@" >"$LAUNCH_ARGS"
while [ "$1" != -- ]; do shift; done
shift
exec "$@"`)
	shim := writeScript(t, bin, "shim", `printf '%s\n' "$@" >"$SHIM_ARGS"`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bundle, logs := t.TempDir(), t.TempDir()
			if tt.spec != "" {
				if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(tt.spec), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			launchArgs, gotArgs := filepath.Join(logs, "launch"), filepath.Join(logs, "shim")
			cmd := exec.Command(wrapper, tt.args...)
			cmd.Dir = bundle
			cmd.Env = []string{"PATH=/usr/bin:/bin", "KATA_SHIM=" + shim, "NAPITAPCTL=" + napitapctl,
				"LAUNCH_ARGS=" + launchArgs, "SHIM_ARGS=" + gotArgs}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s %q: %v\n%s", kataShim, tt.args, err, out)
			}
			if got := readLines(t, gotArgs); !slices.Equal(got, tt.args) {
				t.Errorf("the shim got %q, want %q", got, tt.args)
			}
			launch, err := os.ReadFile(launchArgs)
			if launched := err == nil; launched != tt.launched {
				t.Fatalf("went through napitapctl launch: %v, want %v", launched, tt.launched)
			}
			if tt.launched {
				want := append([]string{"launch", "--seccomp-socket", "/run/napitap/seccomp.sock", "--", shim}, tt.args...)
				if got := strings.Split(strings.TrimSuffix(string(launch), "\n"), "\n"); !slices.Equal(got, want) {
					t.Errorf("napitapctl got %q, want %q", got, want)
				}
			}
		})
	}
}

func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readLines(t *testing.T, p string) []string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

// The wrapper runs the shim its installed name asks for: runtime-rs's as
// itself, Kata's Go runtime's as containerd-shim-kata-go-napitap-v2 (the
// Go runtime's own taps get NAPI), where kata-deploy installs each.
func TestKataShimWrapperRunsTheShimItsNameAsksFor(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "kata", kataShim))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, wantShim string }{
		{kataShim, "/opt/kata/runtime-rs/bin/containerd-shim-kata-v2"},
		{"containerd-shim-kata-go-napitap-v2", "/opt/kata/bin/containerd-shim-kata-v2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wrapper := filepath.Join(t.TempDir(), tt.name)
			if err := os.WriteFile(wrapper, src, 0o755); err != nil {
				t.Fatal(err)
			}
			// No Kata on this machine: the exec fails, naming the shim.
			cmd := exec.Command(wrapper, "-version")
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tt.wantShim) {
				t.Errorf("%s -version: %v, %q; want it to exec %s", tt.name, err, out, tt.wantShim)
			}
		})
	}
}

// Kata's Go runtime refuses a host-tap DAN file ("unknown DAN device
// type", docs/DESIGN.md fact 23): where an operator picks a NAD, the Kata
// page and the NAD itself say that kataDan is runtime-rs's alone, and what
// the Go runtime takes instead.
func TestTheKataPagesSayKataDanIsForRuntimeRsOnly(t *testing.T) {
	for file, wants := range map[string][]string{
		"deploy/kata/README.md": {"unknown DAN device type", "not `kataDan`, which the Go runtime refuses", "kata-go-napitap"},
		"deploy/kata/nad.yaml":  {"runtime-rs"},
	} {
		b, err := os.ReadFile(filepath.Join(repoRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range wants {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s does not say %q", file, want)
			}
		}
	}
}
