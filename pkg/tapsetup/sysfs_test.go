package tapsetup_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestReadSysfsDir plays a tap's sysfs directory from kernels with and
// without the NAPI knobs in a temp dir.
func TestReadSysfsDir(t *testing.T) {
	base := map[string]string{"tun_flags": "0x5912\n", "owner": "-1\n", "group": "107\n"}
	cases := []struct {
		name    string
		extra   map[string]string
		want    tapsetup.SysfsAttrs
		wantErr string
	}{
		{"a 6.x tap reads every knob", map[string]string{"threaded": "1\n", "gro_flush_timeout": "20000\n", "napi_defer_hard_irqs": "2\n"},
			tapsetup.SysfsAttrs{TunFlags: 0x5912, Owner: -1, Group: 107, Threaded: true, GROFlushTimeout: 20000, DeferHardIRQs: 2}, ""},
		{"a kernel without threaded (before 5.12) reads it as off", map[string]string{"gro_flush_timeout": "0\n", "napi_defer_hard_irqs": "0\n"},
			tapsetup.SysfsAttrs{TunFlags: 0x5912, Owner: -1, Group: 107}, ""},
		{"a kernel without napi_defer_hard_irqs (before 5.10) reads it as 0", map[string]string{"gro_flush_timeout": "5\n"},
			tapsetup.SysfsAttrs{TunFlags: 0x5912, Owner: -1, Group: 107, GROFlushTimeout: 5}, ""},
		{"a garbled knob is an error naming it", map[string]string{"threaded": "yes\n"}, tapsetup.SysfsAttrs{}, "read threaded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, files := range []map[string]string{base, tc.extra} {
				for name, v := range files {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			got, err := tapsetup.ReadSysfsDir(dir)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ReadSysfsDir = %+v, %v; want an error with %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || *got != tc.want {
				t.Fatalf("ReadSysfsDir = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	t.Run("a tap without tun_flags is an error naming it", func(t *testing.T) {
		if _, err := tapsetup.ReadSysfsDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "tun_flags") {
			t.Fatalf("ReadSysfsDir of an empty dir = %v, want an error naming tun_flags", err)
		}
	})
}
