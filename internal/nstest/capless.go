package nstest

import (
	"os/exec"
	"testing"
)

// CaplessRoot is a command that runs name as uid 0 with every capability
// dropped from every set: the root of a pod with drop: ALL, the attacker
// of docs/threat-model.md.
func CaplessRoot(t testing.TB, name string, args ...string) *exec.Cmd {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux): %v", err)
	}
	return exec.Command(setpriv, append([]string{"--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--", name}, args...)...)
}
