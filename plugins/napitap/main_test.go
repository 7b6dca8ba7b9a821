package main_test

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/internal/cnitest"
)

// binDir holds napitap and the reference plugins it chains after.
var binDir string

func TestMain(m *testing.M) {
	cnitest.MainWithBinaries(m, &binDir, append([]string{"."}, cnitest.ReferencePlugins...)...)
}

// TestWithoutCNICommandThePluginNamesItsVersion, as the reference plugins
// do ("CNI bridge plugin v1.6.2"): what an operator runs to see which
// napitap a node has.
func TestWithoutCNICommandThePluginNamesItsVersion(t *testing.T) {
	cmd := exec.Command(filepath.Join(binDir, "napitap"))
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "CNI napitap plugin ") {
		t.Errorf("napitap without CNI_COMMAND: %q, %v; want \"CNI napitap plugin <version>\"", out, err)
	}
}
