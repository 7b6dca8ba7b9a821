package suite

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

// vmmRef is the VM pods' image, built here and loaded into the nodes.
const vmmRef = "napitap.local/vmm:e2e"

// buildVMMImage packs this machine's QEMU (its binary, the libraries ldd
// names, its firmware), busybox, a static napitapctl and the guest's
// kernel and initrd into vmmRef, and loads it into the cluster's nodes
// with kind load image-archive (cluster.sh load), as run.sh loads
// napitap's. The nodes are containers of this machine, so the binaries
// fit their kernel; nothing is fetched.
func (k *kind) buildVMMImage(t *testing.T) {
	t.Helper()
	kernel, initrd, err := vm.Artifacts(filepath.Join(k.repo, ".cache", "vm"))
	if err != nil {
		t.Fatal(err)
	}
	k.kernel, k.initrd = filepath.Base(kernel), filepath.Base(initrd)
	tmp := t.TempDir()
	napitapctl := filepath.Join(tmp, "napitapctl")
	build := exec.Command("go", "build", "-o", napitapctl, "./cmd/napitapctl")
	build.Dir, build.Env = k.repo, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build napitapctl: %v\n%s", err, out)
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{ // name in the image: file here
		"usr/bin/qemu-system-x86_64":     qemu,
		"usr/bin/busybox":                busybox,
		"usr/local/bin/napitapctl":       napitapctl,
		"guest/" + filepath.Base(kernel): kernel,
		"guest/" + filepath.Base(initrd): initrd,
	}
	libs, err := exec.Command("ldd", qemu).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", qemu, err)
	}
	for _, lib := range regexp.MustCompile(`(?m)(/\S+) \(0x`).FindAllStringSubmatch(string(libs), -1) {
		files[inUsr(lib[1])] = lib[1]
	}
	// QEMU's modules: Debian's QEMU loads even TCG as one.
	modules := filepath.Join(libcOf(string(libs)), "qemu")
	for _, dir := range []string{"/usr/share/qemu", "/usr/share/seabios", modules} {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			files[inUsr(path)] = path
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	entries := []crihelp.ImageEntry{
		{Name: "bin", Link: "usr/bin"}, {Name: "lib", Link: "usr/lib"},
		{Name: "lib64", Link: "usr/lib64"}, {Name: "sbin", Link: "usr/sbin"},
		{Name: "usr/bin/sh", Link: "busybox"},
	}
	dirs := map[string]bool{}
	for _, d := range []string{"dev", "proc", "sys", "tmp", "out", "run/napitap", "usr/sbin"} {
		addDirs(dirs, d)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
		addDirs(dirs, filepath.Dir(name))
	}
	sort.Strings(names)
	for _, name := range names {
		data, err := os.ReadFile(files[name]) // through symlinks: the firmware's are
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, crihelp.ImageEntry{Name: name, Data: data, Mode: 0o755})
	}
	var dirEntries []crihelp.ImageEntry
	for d := range dirs {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		dirEntries = append(dirEntries, crihelp.ImageEntry{Name: d, Dir: true, Mode: mode})
	}
	sort.Slice(dirEntries, func(i, j int) bool { return dirEntries[i].Name < dirEntries[j].Name })
	archive := filepath.Join(tmp, "vmm.tar")
	if err := crihelp.WriteImageArchive(archive, vmmRef, nil, append(dirEntries, entries...)); err != nil {
		t.Fatal(err)
	}
	load := exec.Command(filepath.Join(k.repo, "test", "e2e", "kind", "cluster.sh"), "load", archive)
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("cluster.sh load %s: %v\n%s", archive, err, out)
	}
	t.Logf("image %s: QEMU (%s), %d libraries and firmware files, busybox, napitapctl, guest %s and %s; loaded into the nodes",
		vmmRef, qemu, len(files)-5, filepath.Base(kernel), filepath.Base(initrd))
}

// libcOf is where ldd found libc: QEMU's module dir is beside it.
func libcOf(ldd string) string {
	if m := regexp.MustCompile(`(/\S+)/libc\.so\.6 \(0x`).FindStringSubmatch(ldd); m != nil {
		return m[1] + "/"
	}
	return "/usr/lib/x86_64-linux-gnu/"
}

// inUsr is where a library ldd found goes in the image, whose /lib and
// /lib64 are links into /usr.
func inUsr(path string) string {
	return "usr/" + strings.TrimPrefix(strings.TrimPrefix(path, "/"), "usr/")
}

func addDirs(dirs map[string]bool, d string) {
	for ; d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
		dirs[d] = true
	}
}
