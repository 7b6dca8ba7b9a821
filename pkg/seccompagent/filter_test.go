package seccompagent

import (
	"encoding/binary"
	"runtime"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// bpfInput is struct seccomp_data as the filter's loads see it. The
// kernel's BPF_LD|BPF_W|BPF_ABS reads a native 32-bit word, x/net/bpf's a
// big-endian one: each word is written big-endian at the offset where the
// little-endian kernel keeps it, args[1]'s low word at offArg1Low.
func bpfInput(nr int32, auditArch uint32, arg1 uint64) []byte {
	b := make([]byte, 64) // nr, arch, instruction_pointer, args[6]
	binary.BigEndian.PutUint32(b[offNr:], uint32(nr))
	binary.BigEndian.PutUint32(b[offArch:], auditArch)
	binary.BigEndian.PutUint32(b[offArg1Low:], uint32(arg1))
	binary.BigEndian.PutUint32(b[offArg1Low+4:], uint32(arg1>>32))
	return b
}

// TestTheFilterNotifiesOnlyANativeTUNSETIFFOnEveryArch runs the agent's
// classic BPF program, as built for each arch napitap ships, in x/net/bpf's
// interpreter on synthetic seccomp_data: only a native ioctl(TUNSETIFF)
// goes to the agent; every other call, a 32-bit compat one included, runs.
func TestTheFilterNotifiesOnlyANativeTUNSETIFFOnEveryArch(t *testing.T) {
	const (
		notify = unix.SECCOMP_RET_USER_NOTIF
		allow  = unix.SECCOMP_RET_ALLOW
		// The 32-bit ABIs' ioctl: 54 in arch/x86/entry/syscalls/syscall_32.tbl
		// and arch/arm/tools/syscall.tbl.
		compatIoctl = 54
		// Syscalls numbered 16 and 29 on the other arch: pwrite64 is 16
		// on x86_64 only, and 29 is ioctl on arm64 but shmget on x86_64.
		amd64Shmget = 29
	)
	tunsetiff := uint64(unix.TUNSETIFF)
	cases := []struct {
		goarch string
		name   string
		data   []byte
		want   uint32
	}{
		{"amd64", "ioctl TUNSETIFF notifies the agent", bpfInput(16, unix.AUDIT_ARCH_X86_64, tunsetiff), notify},
		{"amd64", "ioctl TUNSETIFF with high bits set in the command still notifies", bpfInput(16, unix.AUDIT_ARCH_X86_64, 0xdead<<32|tunsetiff), notify},
		{"amd64", "another ioctl runs", bpfInput(16, unix.AUDIT_ARCH_X86_64, unix.TUNGETIFF), allow},
		{"amd64", "arm64's ioctl number is shmget here and runs", bpfInput(amd64Shmget, unix.AUDIT_ARCH_X86_64, tunsetiff), allow},
		{"amd64", "a 32-bit compat ioctl TUNSETIFF runs", bpfInput(compatIoctl, unix.AUDIT_ARCH_I386, tunsetiff), allow},
		{"amd64", "an aarch64 ioctl TUNSETIFF runs", bpfInput(29, unix.AUDIT_ARCH_AARCH64, tunsetiff), allow},
		{"arm64", "ioctl TUNSETIFF notifies the agent", bpfInput(29, unix.AUDIT_ARCH_AARCH64, tunsetiff), notify},
		{"arm64", "ioctl TUNSETIFF with high bits set in the command still notifies", bpfInput(29, unix.AUDIT_ARCH_AARCH64, 0xdead<<32|tunsetiff), notify},
		{"arm64", "another ioctl runs", bpfInput(29, unix.AUDIT_ARCH_AARCH64, unix.TUNGETIFF), allow},
		{"arm64", "x86_64's ioctl number is another syscall here and runs", bpfInput(16, unix.AUDIT_ARCH_AARCH64, tunsetiff), allow},
		{"arm64", "a 32-bit compat ioctl TUNSETIFF runs", bpfInput(compatIoctl, unix.AUDIT_ARCH_ARM, tunsetiff), allow},
		{"arm64", "an x86_64 ioctl TUNSETIFF runs", bpfInput(16, unix.AUDIT_ARCH_X86_64, tunsetiff), allow},
	}
	for _, tc := range cases {
		t.Run(tc.goarch+"/"+tc.name, func(t *testing.T) {
			prog, err := filterFor(tc.goarch)
			if err != nil {
				t.Fatal(err)
			}
			raw := make([]bpf.Instruction, len(prog))
			for i, in := range prog {
				raw[i] = bpf.RawInstruction{Op: in.Code, Jt: in.Jt, Jf: in.Jf, K: in.K}.Disassemble()
			}
			vm, err := bpf.NewVM(raw)
			if err != nil {
				t.Fatalf("the filter is no valid classic BPF program: %v", err)
			}
			got, err := vm.Run(tc.data)
			if err != nil {
				t.Fatal(err)
			}
			if uint32(got) != tc.want {
				t.Errorf("returned 0x%x, want 0x%x", uint32(got), tc.want)
			}
		})
	}
}

// TestTheArchTableAgreesWithThisBuild: the numbers the filter compares for
// the arch this test runs on are the ones x/sys built it with.
func TestTheArchTableAgreesWithThisBuild(t *testing.T) {
	a, ok := arches[runtime.GOARCH]
	if !ok {
		t.Fatalf("no filter for %s", runtime.GOARCH)
	}
	if a.ioctl != unix.SYS_IOCTL {
		t.Errorf("ioctl is %d on %s, the table says %d", unix.SYS_IOCTL, runtime.GOARCH, a.ioctl)
	}
	if got, err := auditArch(); err != nil || got != a.audit {
		t.Errorf("auditArch() = 0x%x, %v", got, err)
	}
}
