package seccompprofile_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"

	ccseccomp "github.com/containers/common/pkg/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/napitap/napitap/pkg/seccompprofile"
)

// The virt-launcher profile replaces KubeVirt's own for every VM of the
// cluster, so it may deny nothing that KubeVirt's allows, as either
// runtime reads KubeVirt's: containerd applies every rule, and CRI-O only
// those whose includes and excludes fit the container's capabilities and
// architecture. Compared syscall by syscall, as libseccomp builds the
// filter, not as JSON.
func TestTheVirtLauncherProfileDeniesNothingKubeVirtsAllows(t *testing.T) {
	p, err := seccompprofile.Render(seccompprofile.VirtLauncher, "/run/napitap/seccomp.sock")
	if err != nil {
		t.Fatal(err)
	}
	kv := kubeVirtProfile()
	if string(p.DefaultAction) != string(kv.DefaultAction) || p.DefaultErrnoRet == nil || *p.DefaultErrnoRet != *kv.DefaultErrnoRet {
		t.Errorf("default action %s (errno %v), KubeVirt's %s (errno %d)", p.DefaultAction, p.DefaultErrnoRet, kv.DefaultAction, *kv.DefaultErrnoRet)
	}
	var rendered []rule
	for _, r := range p.Syscalls {
		// The notify rule hands TUNSETIFF to napitapd, which completes it
		// or lets the kernel answer: notified is not denied.
		allow := r.Action == specs.ActAllow || r.Action == specs.ActNotify
		if !allow && len(r.Args) > 0 {
			t.Fatalf("%s on %v with argument checks: this test cannot tell what it takes away", r.Action, r.Names)
		}
		rendered = append(rendered, rule{r.Names, allow, r.Args})
	}
	napitap := verdicts(rendered)

	var named []string // every capability KubeVirt's profile depends on
	for _, r := range kv.Syscalls {
		for _, c := range slices.Concat(r.Includes.Caps, r.Excludes.Caps) {
			if !slices.Contains(named, c) {
				named = append(named, c)
			}
		}
	}
	var subsets [][]string
	for bits := range 1 << len(named) {
		var caps []string
		for i, c := range named {
			if bits&(1<<i) != 0 {
				caps = append(caps, c)
			}
		}
		subsets = append(subsets, caps)
	}
	cases := []struct {
		name     string
		filtered bool       // whether includes and excludes are evaluated
		caps     [][]string // the container capabilities they are evaluated for
	}{
		{"under containerd, which applies every rule of kubevirt.json", false, [][]string{nil}},
		{"under CRI-O, for any capabilities the profile names", true, subsets},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			failed := map[string]bool{}
			for _, caps := range tc.caps {
				for name, want := range verdicts(kubeVirtRules(kv, tc.filtered, caps)) {
					if got := napitap[name]; !failed[name] && !got.allows(want) {
						failed[name] = true
						t.Errorf("%s: napitap's profile allows it %s, KubeVirt's %s (capabilities %v)", name, got, want, caps)
					}
				}
			}
		})
	}
}

// kubeVirtProfile is what KubeVirt's virt-handler installs as
// kubevirt/kubevirt.json (pkg/virt-handler/seccomp, v0.59 to v1.9):
// containers/common's default with userfaultfd taken out of its errno rule
// and allowed, for post-copy migration.
func kubeVirtProfile() *ccseccomp.Seccomp {
	p := ccseccomp.DefaultProfile()
	for _, r := range p.Syscalls {
		if i := slices.Index(r.Names, "userfaultfd"); i >= 0 && r.Action == ccseccomp.ActErrno {
			r.Names = slices.Delete(r.Names, i, i+1)
			break
		}
	}
	p.Syscalls = append(p.Syscalls, &ccseccomp.Syscall{Names: []string{"userfaultfd"}, Action: ccseccomp.ActAllow})
	return p
}

// kubeVirtRules are the rules of KubeVirt's profile that a runtime applies:
// every one (containerd decodes the file as an OCI profile, which has no
// includes or excludes), or, filtered, those CRI-O keeps for a container
// with caps on this machine's architecture.
func kubeVirtRules(p *ccseccomp.Seccomp, filtered bool, caps []string) []rule {
	var rules []rule
	for _, r := range p.Syscalls {
		hasAll := func(want []string) bool {
			return !slices.ContainsFunc(want, func(c string) bool { return !slices.Contains(caps, c) })
		}
		hasAny := func(want []string) bool {
			return slices.ContainsFunc(want, func(c string) bool { return slices.Contains(caps, c) })
		}
		if filtered && (slices.Contains(r.Excludes.Arches, runtime.GOARCH) || hasAny(r.Excludes.Caps) ||
			len(r.Includes.Arches) > 0 && !slices.Contains(r.Includes.Arches, runtime.GOARCH) || !hasAll(r.Includes.Caps)) {
			continue
		}
		var args []specs.LinuxSeccompArg
		for _, a := range r.Args {
			args = append(args, specs.LinuxSeccompArg{Index: a.Index, Value: a.Value, ValueTwo: a.ValueTwo, Op: specs.LinuxSeccompOperator(a.Op)})
		}
		names := r.Names
		if r.Name != "" {
			names = append([]string{r.Name}, names...)
		}
		rules = append(rules, rule{names, r.Action == ccseccomp.ActAllow, args})
	}
	return rules
}

type rule struct {
	names []string
	allow bool
	args  []specs.LinuxSeccompArg
}

// verdict is what a filter does with one syscall: allows it whatever its
// arguments, allows it when all the checks of one of when hold, or denies it.
type verdict struct {
	always bool
	when   [][]specs.LinuxSeccompArg
}

// verdicts reads rules as libseccomp adds them, in order (runc and crun
// do): the first rule without argument checks decides a syscall, and rules
// with checks count only for a syscall no such rule names. A rule with
// checks that denies is read as if absent, which errs towards allowing.
func verdicts(rules []rule) map[string]verdict {
	m := map[string]verdict{}
	decided := map[string]bool{}
	for _, r := range rules {
		for _, name := range r.names {
			if decided[name] {
				continue
			}
			v := m[name]
			if len(r.args) == 0 {
				decided[name] = true
				v = verdict{always: r.allow}
			} else if r.allow {
				v.when = append(v.when, r.args)
			}
			m[name] = v
		}
	}
	return m
}

// allows reports whether v allows whatever w does.
func (v verdict) allows(w verdict) bool {
	if v.always || v.complementary() {
		return true
	}
	if w.always {
		return false
	}
	for _, checks := range w.when {
		if !slices.ContainsFunc(v.when, func(c []specs.LinuxSeccompArg) bool { return slices.Equal(c, checks) }) {
			return false
		}
	}
	return true
}

// complementary reports whether v allows an argument both when it equals
// a value and when it does not, as the ioctl split on TUNSETIFF does.
func (v verdict) complementary() bool {
	for _, a := range v.when {
		for _, b := range v.when {
			if len(a) == 1 && len(b) == 1 && a[0].Op == specs.OpEqualTo && b[0].Op == specs.OpNotEqual &&
				a[0].Index == b[0].Index && a[0].Value == b[0].Value {
				return true
			}
		}
	}
	return false
}

func (v verdict) String() string {
	switch {
	case v.always:
		return "always"
	case len(v.when) > 0:
		return fmt.Sprintf("when %v", v.when)
	}
	return "never"
}
