package seccompprofile_test

import (
	"encoding/json"
	"runtime"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/seccompprofile"
)

// nativeArches are the seccomp architectures a profile rendered on a node
// of each GOARCH must name, sorted: the native one and its compat ones, as the
// runtime's own default profile lists them (make test-arm64 runs this
// test built for arm64, under qemu-user).
var nativeArches = map[string][]specs.Arch{
	"amd64": {specs.ArchX32, specs.ArchX86, specs.ArchX86_64},
	"arm64": {specs.ArchAARCH64, specs.ArchARM},
}

func TestRenderedProfilesNotifyOnlyTUNSETIFF(t *testing.T) {
	for _, kind := range seccompprofile.Kinds {
		t.Run("the "+kind+" profile", func(t *testing.T) {
			p, err := seccompprofile.Render(kind, "/run/napitap/seccomp.sock")
			if err != nil {
				t.Fatal(err)
			}
			if p.DefaultAction != specs.ActErrno || p.ListenerPath != "/run/napitap/seccomp.sock" || p.ListenerMetadata != kind {
				t.Errorf("default %s, listener %q, metadata %q", p.DefaultAction, p.ListenerPath, p.ListenerMetadata)
			}
			if want, got := nativeArches[runtime.GOARCH], slices.Sorted(slices.Values(p.Architectures)); !slices.Equal(got, want) {
				t.Errorf("built for %s, the profile names the architectures %v, want %v", runtime.GOARCH, got, want)
			}
			var notify, ioctlRules int
			for _, r := range p.Syscalls {
				if r.Action == specs.ActNotify {
					notify++
					if !slices.Equal(r.Names, []string{"ioctl"}) || len(r.Args) != 1 || r.Args[0].Op != specs.OpEqualTo || r.Args[0].Value != unix.TUNSETIFF || r.Args[0].Index != 1 {
						t.Errorf("notify rule %+v, want ioctl with cmd == TUNSETIFF", r)
					}
				}
				if slices.Contains(r.Names, "ioctl") {
					ioctlRules++
					if r.Action == specs.ActAllow && (len(r.Args) != 1 || r.Args[0].Op != specs.OpNotEqual) {
						t.Errorf("ioctl allowed unconditionally by %+v: the notify rule would compete with it", r)
					}
				}
				if slices.Contains(r.Names, "write") && r.Action == specs.ActNotify {
					t.Errorf("write may not be notified (runc refuses it)")
				}
			}
			if notify != 1 || ioctlRules != 2 {
				t.Errorf("%d notify rules and %d ioctl rules, want 1 and 2", notify, ioctlRules)
			}
			hasUFFD := slices.ContainsFunc(p.Syscalls, func(r specs.LinuxSyscall) bool {
				return r.Action == specs.ActAllow && slices.Contains(r.Names, "userfaultfd")
			})
			if hasUFFD != (kind == seccompprofile.VirtLauncher) {
				t.Errorf("userfaultfd allowed: %v", hasUFFD)
			}
			b, err := seccompprofile.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			var back specs.LinuxSeccomp
			if err := json.Unmarshal(b, &back); err != nil || back.ListenerPath != p.ListenerPath {
				t.Errorf("the file does not read back as an OCI seccomp section: %v", err)
			}
		})
	}
}

func TestAddNotify(t *testing.T) {
	allowAll := func() *specs.LinuxSeccomp { return &specs.LinuxSeccomp{DefaultAction: specs.ActAllow} }
	cases := []struct {
		name    string
		base    *specs.LinuxSeccomp
		wantErr bool
		want    int // rules after
	}{
		{"a default-allow profile gets only the notify rule", allowAll(), false, 1},
		{"ioctl leaves an allow list and comes back for every other command", &specs.LinuxSeccomp{DefaultAction: specs.ActErrno,
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read", "ioctl"}, Action: specs.ActAllow}}}, false, 3},
		{"a profile that denies ioctl is refused", &specs.LinuxSeccomp{DefaultAction: specs.ActErrno,
			Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}}}, true, 0},
		{"an ioctl rule with argument checks is refused rather than merged wrong", &specs.LinuxSeccomp{DefaultAction: specs.ActErrno,
			Syscalls: []specs.LinuxSyscall{{Names: []string{"ioctl"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 1, Value: 1, Op: specs.OpEqualTo}}}}}, true, 0},
		{"a notify default action is refused", &specs.LinuxSeccomp{DefaultAction: specs.ActNotify}, true, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := seccompprofile.AddNotify(tc.base, "/run/napitap/seccomp.sock", "")
			if (err != nil) != tc.wantErr {
				t.Fatalf("AddNotify: %v, want error %v", err, tc.wantErr)
			}
			if err == nil && len(tc.base.Syscalls) != tc.want {
				t.Errorf("%d rules, want %d: %+v", len(tc.base.Syscalls), tc.want, tc.base.Syscalls)
			}
		})
	}
}
