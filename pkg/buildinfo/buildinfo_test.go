package buildinfo

import (
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	tests := []struct {
		name, linked, wantPrefix string
	}{
		{"a linked-in version is the version", "v0.3.0", "v0.3.0"},
		{"without one, a test binary (no VCS stamp) is dev", "", "dev"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			defer func(v string) { version = v }(version)
			version = tc.linked
			if got := Version(); !strings.HasPrefix(got, tc.wantPrefix) {
				t.Errorf("Version() = %q, want %q...", got, tc.wantPrefix)
			}
			if got := String("napitapd"); got != "napitapd "+Version() {
				t.Errorf("String = %q", got)
			}
		})
	}
}
