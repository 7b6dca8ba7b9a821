// Package seccompprofile writes the Kubernetes Localhost seccomp profiles
// that route a VM runtime's TUNSETIFF to napitapd's seccomp agent: the
// container runtime's default rules (Docker's, as containerd and CRI-O
// apply them for RuntimeDefault), rendered for the container's
// capabilities, plus one SCMP_ACT_NOTIFY rule and the agent's socket as
// listenerPath (DESIGN.md fact 13). runc and crun pass listenerPath on;
// containerd 1.6+ and CRI-O 1.25+ load the file into the OCI spec as is.
package seccompprofile

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Kinds of profile napitap ships.
const (
	// VMM is for any pod whose VMM opens a tap by name (QEMU, Cloud
	// Hypervisor, Firecracker): RuntimeDefault plus the notify rule.
	VMM = "vmm"
	// VirtLauncher is KubeVirt's virt-launcher profile (RuntimeDefault plus
	// userfaultfd, for post-copy migration) plus the notify rule.
	VirtLauncher = "virt-launcher"
)

// Kinds lists what Render takes.
var Kinds = []string{VMM, VirtLauncher}

// tunSetIff is TUNSETIFF as an ioctl command; the kernel truncates the
// command to 32 bits, and so does every libc.
const tunSetIff = uint64(unix.TUNSETIFF)

// containerCaps are what containerd and CRI-O give a container by default,
// plus what KubeVirt adds to virt-launcher (NET_BIND_SERVICE is already
// there; SYS_NICE for vCPU pinning). The rules are rendered for these:
// a capability the container lacks only makes the kernel say no later.
var containerCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
	"CAP_SYS_NICE",
}

// Render returns the profile of kind whose notifications go to the agent
// at listenerPath. It uses the running kernel's version, as the runtime's
// own RuntimeDefault does: render it on the node that uses it.
func Render(kind, listenerPath string) (*specs.LinuxSeccomp, error) {
	if !slices.Contains(Kinds, kind) {
		return nil, fmt.Errorf("seccomp profile kind %q: want one of %v", kind, Kinds)
	}
	if listenerPath == "" || listenerPath[0] != '/' {
		return nil, fmt.Errorf("listener path %q is not absolute", listenerPath)
	}
	spec := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{Bounding: containerCaps}}}
	p, err := seccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("render the default profile: %w", err)
	}
	if kind == VirtLauncher {
		p.Syscalls = append(p.Syscalls, specs.LinuxSyscall{Names: []string{"userfaultfd"}, Action: specs.ActAllow})
	}
	if err := AddNotify(p, listenerPath, kind); err != nil {
		return nil, err
	}
	return p, nil
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
