// Package hack_test checks the scripts the Makefile runs before a target.
package hack_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDepsChecksProgramsBeforeAPackageManager runs deps.sh with a PATH of
// its own, so that it sees exactly the programs each case names.
func TestDepsChecksProgramsBeforeAPackageManager(t *testing.T) {
	tests := []struct {
		name     string
		target   string
		programs []string
		wantCode int
		wantErr  []string
	}{
		{
			name:     "the demo needs nothing more where ip and tc exist, even without apt-get",
			target:   "demo",
			programs: []string{"go", "ip", "tc"},
		},
		{
			name:     "the demo without tc or apt-get names the program and its Debian package",
			target:   "demo",
			programs: []string{"go", "ip"},
			wantCode: 1,
			wantErr:  []string{"make demo needs", "tc (iproute2)", "install its equivalent"},
		},
		{
			name:     "the tests without apt-get name the missing programs and their packages",
			target:   "test",
			programs: []string{"go", "ip", "tc"},
			wantCode: 1,
			wantErr:  []string{"qemu-system-x86_64 (qemu-system-x86)", "containerd (containerd)", "runc (runc)", "crun (crun)"},
		},
		{
			name:     "without Go nothing is installed and the message says where Go goes",
			target:   "demo",
			programs: []string{"ip", "tc"},
			wantCode: 1,
			wantErr:  []string{"Go 1.26.8+ (go.mod's) must be on PATH"},
		},
		{
			name:     "an unknown target is a usage error",
			target:   "bench",
			programs: []string{"go", "ip", "tc"},
			wantCode: 2,
			wantErr:  []string{"usage:"},
		},
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bin := t.TempDir()
			// The script's own plumbing, plus the programs of this case.
			for _, p := range append([]string{"dpkg-query", "grep", "id"}, tt.programs...) {
				path, err := exec.LookPath(p)
				if err != nil && p == "go" {
					path = "/usr/local/go/bin/go"
				} else if err != nil {
					t.Fatalf("%s: %v", p, err)
				}
				if err := os.Symlink(path, filepath.Join(bin, p)); err != nil {
					t.Fatal(err)
				}
			}
			cmd := exec.Command(bash, "deps.sh", tt.target)
			cmd.Env = []string{"PATH=" + bin}
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d; stderr:\n%s", code, tt.wantCode, stderr.String())
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if tt.wantCode == 0 && stderr.Len() > 0 {
				t.Errorf("nothing missing, yet stderr:\n%s", stderr.String())
			}
		})
	}
}
