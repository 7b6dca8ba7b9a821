package main_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/napitap/napitap/internal/cnitest"
)

// binDir holds napitap and the reference plugins it chains after, built
// by TestMain.
var binDir string

func TestMain(m *testing.M) {
	dir, err := cnitest.Build(append([]string{"."}, cnitest.ReferencePlugins...)...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
