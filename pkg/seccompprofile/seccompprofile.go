// Package seccompprofile writes the Kubernetes Localhost seccomp profiles
// that route a VM runtime's TUNSETIFF to napitapd's seccomp agent: a base
// profile plus one SCMP_ACT_NOTIFY rule and the agent's socket as
// listenerPath (DESIGN.md fact 13). runc and crun pass listenerPath on;
// containerd 1.6+ and CRI-O 1.25+ load the file into the OCI spec as is.
//
// The base depends on whose profile napitap's replaces.
//
// virt-launcher.json replaces KubeVirt's kubevirt/kubevirt.json for every
// VM of the cluster, napitap user or not, so it must take nothing away
// from it (DESIGN.md fact 19). Its base is what KubeVirt's virt-handler
// installs: containers/common's DefaultProfile plus userfaultfd. KubeVirt
// writes that profile with its includes and excludes, which containerd
// drops (it applies every rule) and CRI-O evaluates for the container's
// capabilities; so the base allows every syscall some allow rule names,
// with that rule's argument checks, whatever its includes and excludes.
// containers/common is imported rather than copied, at the version
// KubeVirt pins, so that the two cannot drift apart. Built without the
// seccomp tag, as napitap is, its pkg/seccomp needs only runtime-spec and
// x/sys, and only napitapctl links this package: the plugin does not grow.
//
// vmm.json is chosen pod by pod, in place of RuntimeDefault, by whoever
// runs the VMM and wants NAPI: no one else's profile is replaced, so it
// stays RuntimeDefault plus the notify rule. Its base is containerd's
// RuntimeDefault, moby's default rendered for the container's
// capabilities. CRI-O's RuntimeDefault is containers/common's, which allows
// more: there a VMM that needs more than moby's allows needs a profile of
// its own.
package seccompprofile

import (
	"encoding/json"
	"fmt"
	"runtime"
	"slices"

	ccseccomp "github.com/containers/common/pkg/seccomp"
	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Kinds of profile napitap ships.
const (
	// VMM is for any pod whose VMM opens a tap by name (QEMU, Cloud
	// Hypervisor, Firecracker): RuntimeDefault plus the notify rule.
	VMM = "vmm"
	// VirtLauncher is KubeVirt's own virt-launcher profile (containers/common's
	// default plus userfaultfd, for post-copy migration) plus the notify rule.
	VirtLauncher = "virt-launcher"
)

// Kinds lists what Render takes.
var Kinds = []string{VMM, VirtLauncher}

// tunSetIff is TUNSETIFF as an ioctl command; the kernel truncates the
// command to 32 bits, and so does every libc.
const tunSetIff = uint64(unix.TUNSETIFF)

// containerCaps are what containerd and CRI-O give a container by default,
// plus SYS_NICE (for vCPU pinning, as KubeVirt gives virt-launcher).
// vmm.json's rules are rendered for these: a capability the container
// lacks only makes the kernel say no later.
var containerCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	"CAP_SYS_NICE",
}

// Render returns the profile of kind whose notifications go to the agent
// at listenerPath. It uses the running kernel's version and architecture,
// as the runtime's own RuntimeDefault does: render it on the node that
// uses it.
func Render(kind, listenerPath string) (*specs.LinuxSeccomp, error) {
	if !slices.Contains(Kinds, kind) {
		return nil, fmt.Errorf("seccomp profile kind %q: want one of %v", kind, Kinds)
	}
	if listenerPath == "" || listenerPath[0] != '/' {
		return nil, fmt.Errorf("listener path %q is not absolute", listenerPath)
	}
	var p *specs.LinuxSeccomp
	if kind == VirtLauncher {
		p = kubeVirtProfile()
	} else {
		spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: containerCaps}}}
		var err error
		if p, err = seccomp.GetDefaultProfile(spec); err != nil {
			return nil, fmt.Errorf("render the default profile: %w", err)
		}
	}
	if err := AddNotify(p, listenerPath, kind); err != nil {
		return nil, err
	}
	return p, nil
}

// kubeVirtProfile is kubevirt/kubevirt.json as an OCI profile that allows
// whatever KubeVirt's allows under containerd or CRI-O, for any
// capabilities: every syscall that an allow rule names, unconditionally if
// one rule allows it without argument checks, else with the checks of the
// rules that name it. An errno rule stays only for what no rule allows.
func kubeVirtProfile() *specs.LinuxSeccomp {
	cc := ccseccomp.DefaultProfile()
	rules := append(cc.Syscalls, &ccseccomp.Syscall{Names: []string{"userfaultfd"}, Action: ccseccomp.ActAllow})
	allowed, always := map[string]bool{}, map[string]bool{}
	for _, r := range rules {
		for _, name := range ruleNames(r) {
			if r.Action == ccseccomp.ActAllow {
				allowed[name] = true
				always[name] = always[name] || len(r.Args) == 0
			}
		}
	}
	p := &specs.LinuxSeccomp{
		DefaultAction:   specs.LinuxSeccompAction(cc.DefaultAction),
		DefaultErrnoRet: cc.DefaultErrnoRet,
	}
	// The runtime's architectures, as CRI-O takes them from the archMap:
	// containerd, which does not read archMap, would allow only the native one.
	if arch, err := ccseccomp.GoArchToSeccompArch(runtime.GOARCH); err == nil {
		for _, a := range cc.ArchMap {
			if a.Arch == arch {
				p.Architectures = append(p.Architectures, specs.Arch(a.Arch))
				for _, sub := range a.SubArches {
					p.Architectures = append(p.Architectures, specs.Arch(sub))
				}
			}
		}
	}
	seen := map[string]bool{}
	for _, r := range rules {
		var names []string
		for _, name := range ruleNames(r) {
			var keep bool
			switch {
			case r.Action != ccseccomp.ActAllow:
				keep = !allowed[name]
			case len(r.Args) > 0:
				keep = !always[name]
			default:
				keep, seen[name] = !seen[name], true
			}
			if keep {
				names = append(names, name)
			}
		}
		if len(names) == 0 {
			continue
		}
		s := specs.LinuxSyscall{Names: names, Action: specs.LinuxSeccompAction(r.Action), ErrnoRet: r.ErrnoRet}
		for _, a := range r.Args {
			s.Args = append(s.Args, specs.LinuxSeccompArg{Index: a.Index, Value: a.Value, ValueTwo: a.ValueTwo, Op: specs.LinuxSeccompOperator(a.Op)})
		}
		p.Syscalls = append(p.Syscalls, s)
	}
	return p
}

func ruleNames(r *ccseccomp.Syscall) []string {
	if r.Name != "" {
		return append([]string{r.Name}, r.Names...)
	}
	return r.Names
}

// AddNotify routes TUNSETIFF to the agent and keeps every other ioctl as
// p had it. The notify rule and the rules that allow the other ioctls
// match disjoint commands: no filter compiler has to settle which of two
// actions wins.
func AddNotify(p *specs.LinuxSeccomp, listenerPath, metadata string) error {
	if p.DefaultAction == specs.ActNotify {
		return fmt.Errorf("the default action cannot be %s", specs.ActNotify)
	}
	ioctlAllowed := p.DefaultAction == specs.ActAllow
	var rules []specs.LinuxSyscall
	for _, r := range p.Syscalls {
		i := slices.Index(r.Names, "ioctl")
		if i < 0 {
			rules = append(rules, r)
			continue
		}
		if len(r.Args) > 0 || r.Action != specs.ActAllow {
			return fmt.Errorf("the base profile has its own ioctl rule (%s with %d argument checks): merge by hand", r.Action, len(r.Args))
		}
		ioctlAllowed = true
		if r.Names = slices.Delete(slices.Clone(r.Names), i, i+1); len(r.Names) > 0 {
			rules = append(rules, r)
		}
	}
	if !ioctlAllowed {
		return fmt.Errorf("the base profile does not allow ioctl: a VMM cannot run under it")
	}
	if p.DefaultAction != specs.ActAllow {
		rules = append(rules, specs.LinuxSyscall{
			Names: []string{"ioctl"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: tunSetIff, Op: specs.OpNotEqual}},
		})
	}
	rules = append(rules, specs.LinuxSyscall{
		Names: []string{"ioctl"}, Action: specs.ActNotify,
		Args: []specs.LinuxSeccompArg{{Index: 1, Value: tunSetIff, Op: specs.OpEqualTo}},
	})
	p.Syscalls = rules
	p.ListenerPath = listenerPath
	p.ListenerMetadata = metadata
	return nil
}

// Marshal is the profile as kubelet reads it from its seccomp dir.
func Marshal(p *specs.LinuxSeccomp) ([]byte, error) {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
