package main_test

import (
	"testing"

	"github.com/napitap/napitap/internal/cnitest"
)

// binDir holds napitap and the reference plugins it chains after.
var binDir string

func TestMain(m *testing.M) {
	cnitest.MainWithBinaries(m, &binDir, append([]string{"."}, cnitest.ReferencePlugins...)...)
}
