// Package vm boots a tiny real Linux guest under QEMU (TCG, no KVM needed)
// whose only NIC is a tap, typically handed over as already-open queue fds
// (-netdev tap,fds=3:4). The guest is a Debian cloud kernel plus a busybox
// initramfs built here; its /init configures eth0, prints markers on the
// serial console, runs a caller's shell script and powers off.
//
// Host requirements (hack/deps.sh installs them): qemu-system-x86_64,
// Debian's busybox-static (/bin/busybox), dpkg-deb, apt-get with package
// lists (to download the kernel package once), xz for compressed modules.
package vm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Markers /init prints on the serial console, each on a line of its own.
const (
	// MarkerUp: modules loaded, lo and eth0 up and addressed; the script
	// starts now.
	MarkerUp = "NAPITAP-GUEST-UP"
	// MarkerDone is followed by the script's exit status ("rc=0"); the guest
	// powers off right after.
	MarkerDone = "NAPITAP-GUEST-DONE rc="
	// MarkerError is followed by what /init could not do; MarkerDone with
	// rc=255 follows it.
	MarkerError = "NAPITAP-GUEST-ERROR"
)

// KernelPackageEnv names a Debian kernel package (concrete or meta) to use
// instead of the default, e.g. linux-image-6.12-cloud-amd64.
const KernelPackageEnv = "NAPITAP_VM_KERNEL_PKG"

// DefaultKernelPackage is the Debian metapackage whose current cloud kernel
// the guest runs.
const DefaultKernelPackage = "linux-image-cloud-amd64"

// guestModules are insmod'ed by /init in this order (no modprobe, no
// depmod: dependencies come first). qemu_fw_cfg carries the script.
var guestModules = []string{
	"virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev",
	"virtio_pci", "failover", "net_failover", "virtio_net", "qemu_fw_cfg",
}

// fwCfgScript is the fw_cfg entry that holds Guest.Script.
const fwCfgScript = "opt/napitap/script"

// busyboxPath is Debian busybox-static's binary.
const busyboxPath = "/bin/busybox"

// initScript is the guest's /init. @MODULES@ becomes the module list.
const initScript = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/sbin:/usr/sbin:/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
exec </dev/console >/dev/console 2>&1

finish() {
	echo
	echo "` + MarkerDone + `$1"
	sync
	usleep 300000
	poweroff -f
	sleep 10
}
fail() {
	echo "` + MarkerError + ` $*"
	finish 255
}

for m in @MODULES@; do
	insmod /lib/modules/$m.ko || fail "insmod $m"
done

IP= GW= MAC=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	napitap.ip=*) IP=${arg#napitap.ip=} ;;
	napitap.gw=*) GW=${arg#napitap.gw=} ;;
	napitap.mac=*) MAC=${arg#napitap.mac=} ;;
	esac
done

# The NIC: the one with napitap.mac, else eth0. Probing is asynchronous.
IF=
i=0
while [ $i -lt 100 ]; do
	if [ -n "$MAC" ]; then
		for d in /sys/class/net/*; do
			[ "$(cat $d/address 2>/dev/null)" = "$MAC" ] && IF=${d##*/}
		done
	elif [ -e /sys/class/net/eth0 ]; then
		IF=eth0
	fi
	[ -n "$IF" ] && break
	i=$((i+1))
	usleep 50000
done
[ -n "$IF" ] || fail "no NIC with MAC '$MAC' appeared: $(ls /sys/class/net)"
[ "$IF" = eth0 ] || ip link set "$IF" name eth0 || fail "rename $IF to eth0"

ip link set lo up || fail "lo up"
ip link set eth0 up || fail "eth0 up"
if [ -n "$IP" ]; then ip addr add "$IP" dev eth0 || fail "ip addr add $IP"; fi
if [ -n "$GW" ]; then ip route add default via "$GW" || fail "default route via $GW"; fi

S=/sys/firmware/qemu_fw_cfg/by_name/` + fwCfgScript + `/raw
if [ -e $S ]; then cat $S > /tmp/script.sh; else : > /tmp/script.sh; fi

echo "` + MarkerUp + `"
cd /tmp
sh /tmp/script.sh
finish $?
`

// builderVersion changes whenever the artifacts' content would change in a
// way the inputs below do not capture.
const builderVersion = "1"

// Artifacts returns a guest kernel and initramfs, building them once into
// cacheDir (e.g. <repo>/.cache/vm, gitignored) and reusing them afterwards.
// A build downloads the kernel package with `apt-get download` and takes
// busybox from the host; it happens in a temporary directory renamed into
// place at the end, so a killed build never leaves a half cache. Concurrent
// callers (other test binaries) serialise on a lock file in cacheDir.
func Artifacts(cacheDir string) (kernel, initrd string, err error) {
	kernelPkg := os.Getenv(KernelPackageEnv)
	if kernelPkg == "" {
		kernelPkg = DefaultKernelPackage
	}
	initSh := strings.ReplaceAll(initScript, "@MODULES@", strings.Join(guestModules, " "))
	h := sha256.Sum256([]byte(builderVersion + "\x00" + kernelPkg + "\x00" + initSh))
	dir := filepath.Join(cacheDir, "guest-"+hex.EncodeToString(h[:6]))
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.gz")
	if complete(dir) {
		return kernel, initrd, nil
	}

	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", "", fmt.Errorf("vm artifacts: create cache dir %s: %w", cacheDir, err)
	}
	lockPath := filepath.Join(cacheDir, ".lock")
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", "", fmt.Errorf("vm artifacts: open lock %s: %w", lockPath, err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", "", fmt.Errorf("vm artifacts: lock %s: %w", lockPath, err)
	}
	defer unix.Flock(int(lock.Fd()), unix.LOCK_UN) //nolint:errcheck
	// Whoever held the lock before us may have built it.
	if complete(dir) {
		return kernel, initrd, nil
	}
	// We hold the lock: any .build-* left is from a killed build.
	if stale, _ := filepath.Glob(filepath.Join(cacheDir, ".build-*")); len(stale) > 0 {
		for _, s := range stale {
			os.RemoveAll(s)
		}
	}
	if err := os.RemoveAll(dir); err != nil { // incomplete leftovers
		return "", "", fmt.Errorf("vm artifacts: remove incomplete %s: %w", dir, err)
	}
	tmp, err := os.MkdirTemp(cacheDir, ".build-")
	if err != nil {
		return "", "", fmt.Errorf("vm artifacts: %w", err)
	}
	defer os.RemoveAll(tmp) // after a successful rename there is nothing left
	if err := build(tmp, kernelPkg, initSh); err != nil {
		return "", "", fmt.Errorf("vm artifacts: build into %s: %w", cacheDir, err)
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return "", "", fmt.Errorf("vm artifacts: %w", err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", "", fmt.Errorf("vm artifacts: move %s to %s: %w", tmp, dir, err)
	}
	return kernel, initrd, nil
}

// complete reports whether dir holds a finished build. The rename is the
// commit point, but check the files too.
func complete(dir string) bool {
	for _, f := range []string{"vmlinuz", "initrd.gz", "INFO"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			return false
		}
	}
	return true
}

// build fills out (an empty directory) with vmlinuz, initrd.gz and INFO.
func build(out, kernelPkg, initSh string) error {
	start := time.Now()
	work := filepath.Join(out, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		return err
	}
	defer os.RemoveAll(work)

	pkg, err := resolveKernelPackage(kernelPkg)
	if err != nil {
		return err
	}
	dl := exec.Command("apt-get", "download", "-o", "APT::Sandbox::User=root", pkg)
	dl.Dir = work
	if o, err := dl.CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get download %s (run hack/deps.sh for apt package lists): %v: %s", pkg, err, bytes.TrimSpace(o))
	}
	debs, _ := filepath.Glob(filepath.Join(work, "*.deb"))
	if len(debs) != 1 {
		return fmt.Errorf("apt-get download %s: want one .deb in %s, found %d", pkg, work, len(debs))
	}
	root := filepath.Join(work, "root")
	if o, err := exec.Command("dpkg-deb", "-x", debs[0], root).CombinedOutput(); err != nil {
		return fmt.Errorf("dpkg-deb -x %s: %v: %s", debs[0], err, bytes.TrimSpace(o))
	}
	vmlinuz, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return fmt.Errorf("%s: want one boot/vmlinuz-*, found %d", filepath.Base(debs[0]), len(vmlinuz))
	}
	kver := strings.TrimPrefix(filepath.Base(vmlinuz[0]), "vmlinuz-")
	if err := copyFile(vmlinuz[0], filepath.Join(out, "vmlinuz"), 0o644); err != nil {
		return err
	}

	modDir := filepath.Join(root, "lib", "modules", kver, "kernel")
	if _, err := os.Stat(modDir); err != nil { // merged-/usr packages
		modDir = filepath.Join(root, "usr", "lib", "modules", kver, "kernel")
	}
	found := map[string]string{}
	want := map[string]bool{}
	for _, m := range guestModules {
		want[m] = true
	}
	err = filepath.WalkDir(modDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := d.Name()
		if i := strings.Index(name, ".ko"); i > 0 && want[name[:i]] {
			found[name[:i]] = p
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("walk modules of %s: %w", pkg, err)
	}

	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return fmt.Errorf("read %s (install busybox-static: hack/deps.sh): %w", busyboxPath, err)
	}
	if !isStaticELF(bb) {
		return fmt.Errorf("%s is not a static binary; install busybox-static (hack/deps.sh)", busyboxPath)
	}

	f, err := os.Create(filepath.Join(out, "initrd.gz"))
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	gz, _ := gzip.NewWriterLevel(bw, gzip.BestSpeed)
	cw := newCpioWriter(gz)
	for _, d := range []string{"bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp", "run", "etc", "root", "lib", "lib/modules"} {
		cw.dir(d)
	}
	cw.node("dev/console", unix.S_IFCHR|0o600, 5, 1)
	cw.node("dev/null", unix.S_IFCHR|0o666, 1, 3)
	cw.file("init", 0o755, []byte(initSh))
	cw.file("bin/busybox", 0o755, bb)
	cw.symlink("bin/sh", "busybox")
	cw.file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\n"))
	cw.file("etc/group", 0o644, []byte("root:x:0:\n"))
	for _, m := range guestModules {
		p, ok := found[m]
		if !ok {
			return fmt.Errorf("module %s not found under %s in %s", m, modDir, filepath.Base(debs[0]))
		}
		data, err := readModule(p)
		if err != nil {
			return err
		}
		cw.file("lib/modules/"+m+".ko", 0o644, data)
	}
	if err := cw.close(); err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	if err := gz.Close(); err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write initramfs: %w", err)
	}
	info := fmt.Sprintf("kernel-package: %s\nkernel-deb: %s\nkernel-release: %s\nbusybox: %s\nmodules: %s\nbuilt: %s in %s\n",
		pkg, filepath.Base(debs[0]), kver, busyboxPath, strings.Join(guestModules, " "),
		time.Now().UTC().Format(time.RFC3339), time.Since(start).Round(time.Millisecond))
	return os.WriteFile(filepath.Join(out, "INFO"), []byte(info), 0o644)
}

var dependsImage = regexp.MustCompile(`(?m)^\s*Depends:\s*(linux-image-\S+)`)

// resolveKernelPackage follows metapackages (linux-image-cloud-amd64 ->
// linux-image-6.1.0-NN-cloud-amd64) to the package that ships a vmlinuz.
func resolveKernelPackage(name string) (string, error) {
	for range 5 {
		o, err := exec.Command("apt-cache", "depends", name).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("apt-cache depends %s (run hack/deps.sh for apt package lists): %v: %s", name, err, bytes.TrimSpace(o))
		}
		m := dependsImage.FindSubmatch(o)
		if m == nil {
			return name, nil
		}
		name = string(m[1])
	}
	return "", fmt.Errorf("apt-cache depends: metapackage chain too long at %s", name)
}

// readModule returns a module uncompressed (busybox insmod takes plain .ko).
func readModule(p string) ([]byte, error) {
	var dec []string
	switch {
	case strings.HasSuffix(p, ".ko"):
		return os.ReadFile(p)
	case strings.HasSuffix(p, ".ko.xz"):
		dec = []string{"xz", "-dc", p}
	case strings.HasSuffix(p, ".ko.zst"):
		dec = []string{"zstd", "-dcq", p}
	case strings.HasSuffix(p, ".ko.gz"):
		dec = []string{"gzip", "-dc", p}
	default:
		return nil, fmt.Errorf("module %s: unknown compression", p)
	}
	var stderr bytes.Buffer
	c := exec.Command(dec[0], dec[1:]...)
	c.Stderr = &stderr
	o, err := c.Output()
	if err != nil {
		return nil, fmt.Errorf("decompress module %s with %s: %v: %s", p, dec[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return o, nil
}

// isStaticELF reports whether b is an ELF without a PT_INTERP header.
func isStaticELF(b []byte) bool {
	if len(b) < 64 || string(b[:4]) != "\x7fELF" || b[4] != 2 /* 64-bit */ || b[5] != 1 /* LE */ {
		return false
	}
	le := func(o, n int) uint64 {
		var v uint64
		for i := n - 1; i >= 0; i-- {
			v = v<<8 | uint64(b[o+i])
		}
		return v
	}
	phoff, phentsize, phnum := int(le(32, 8)), int(le(54, 2)), int(le(56, 2))
	for i := range phnum {
		o := phoff + i*phentsize
		if o+4 > len(b) {
			return false
		}
		if le(o, 4) == 3 { // PT_INTERP
			return false
		}
	}
	return true
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return out.Close()
}

// cpioWriter writes the "newc" (SVR4, no CRC) format the kernel unpacks
// into its initramfs. Errors are sticky and reported by close.
type cpioWriter struct {
	w   io.Writer
	ino uint32
	n   int64
	err error
}

func newCpioWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: w, ino: 1} }

func (c *cpioWriter) write(b []byte) {
	if c.err != nil {
		return
	}
	var n int
	n, c.err = c.w.Write(b)
	c.n += int64(n)
}

func (c *cpioWriter) pad() {
	if r := c.n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) entry(name string, mode uint32, rmaj, rmin uint32, data []byte) {
	nlink := uint32(1)
	if mode&unix.S_IFMT == unix.S_IFDIR {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmaj, rmin, len(name)+1, 0)
	c.ino++
	c.write([]byte(hdr))
	c.write([]byte(name + "\x00"))
	c.pad()
	c.write(data)
	c.pad()
}

func (c *cpioWriter) dir(name string) { c.entry(name, unix.S_IFDIR|0o755, 0, 0, nil) }

func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, unix.S_IFREG|perm, 0, 0, data)
}

func (c *cpioWriter) symlink(name, target string) {
	c.entry(name, unix.S_IFLNK|0o777, 0, 0, []byte(target))
}

func (c *cpioWriter) node(name string, mode, major, minor uint32) {
	c.entry(name, mode, major, minor, nil)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, 0, 0, nil)
	if c.err != nil {
		return c.err
	}
	if c.n > 0 && c.n%512 != 0 { // conventional block padding
		c.write(make([]byte, 512-c.n%512))
	}
	return c.err
}

// InitrdFile is a file AppendToInitrd adds.
type InitrdFile struct {
	Name string // relative to the guest's root, e.g. "kubevirt/script"
	Mode uint32 // permission bits
	Data []byte
}

// AppendToInitrd returns the initramfs at initrd followed by a second
// archive (newc, gzip'd) holding files and the directories they need.
// The kernel unpacks both into the same rootfs, in order: a runtime that
// boots the guest's kernel but gives it no fw_cfg entry (KubeVirt's
// kernel boot) can carry the guest's script and its own /init this way.
func AppendToInitrd(initrd string, files []InitrdFile) ([]byte, error) {
	first, err := os.ReadFile(initrd)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Write(first)
	if r := b.Len() % 4; r != 0 { // each archive starts on a 4-byte boundary
		b.Write(make([]byte, 4-r))
	}
	gz, _ := gzip.NewWriterLevel(&b, gzip.BestSpeed)
	cw := newCpioWriter(gz)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := filepath.Dir(f.Name); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			parents = append([]string{d}, parents...)
			dirs[d] = true
		}
		for _, d := range parents {
			cw.dir(d)
		}
		cw.file(f.Name, f.Mode, f.Data)
	}
	if err := cw.close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
