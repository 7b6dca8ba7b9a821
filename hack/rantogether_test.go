package hack_test

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWhatRanTogetherIsWhatCIRuns checks deploy/README.md's "What ran
// together" table against what CI uses: the versions the build scripts
// pin, the Debian packages installed (major.minor), and the kernel.
func TestWhatRanTogetherIsWhatCIRuns(t *testing.T) {
	b, err := os.ReadFile("../deploy/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(b), "<!-- ran-together -->")
	table, _, ok2 := strings.Cut(table, "<!-- /ran-together -->")
	if !ok || !ok2 {
		t.Fatal("deploy/README.md has no ran-together table")
	}
	box := map[string]string{}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSpace(cells[1]), " ")
		box[strings.TrimSuffix(name, ",")] = strings.TrimSpace(cells[2])
	}

	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Kubernetes": scriptVar(t, "../test/e2e/node/build.sh", "version"),
		"Multus":     scriptVar(t, "../test/e2e/node/multus.sh", "version"),
		"kind":       scriptVar(t, "../test/e2e/kind/nodeimage.sh", "kind_version"),
		"KubeVirt":   scriptVar(t, "../test/e2e/kind/kubevirt/images.sh", "version"),
		"Linux":      majorMinor(unix.ByteSliceToString(uts.Release[:])),
	}
	// make test-kernel's guest: the kernel package rootfs.sh downloads
	// by default, as apt resolves it today.
	out, err := exec.Command("apt-cache", "depends", "linux-image-cloud-amd64").Output()
	if err != nil && os.Getenv("CI") != "" {
		t.Fatalf("apt-cache depends linux-image-cloud-amd64: %v (hack/deps.sh test fetches the package lists)", err)
	}
	if m := regexp.MustCompile(`Depends: linux-image-(\d+\.\d+)`).FindSubmatch(out); m != nil {
		want["Guest"] = string(m[1])
	} else if os.Getenv("CI") != "" {
		t.Fatalf("apt-cache depends linux-image-cloud-amd64 names no kernel:\n%s", out)
	}
	for name, pkg := range map[string]string{"containerd": "containerd", "runc": "runc", "crun": "crun", "libvirt": "libvirt-daemon", "QEMU": "qemu-system-x86"} {
		out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", pkg).Output()
		if err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("dpkg-query %s: %v (hack/deps.sh test installs it)", pkg, err)
			}
			t.Skipf("dpkg-query %s: %v", pkg, err)
		}
		v := string(out)
		if _, after, ok := strings.Cut(v, ":"); ok {
			v = after // the epoch
		}
		want[name] = majorMinor(v)
	}
	for name, w := range want {
		if got := box[name]; got != w {
			t.Errorf("What ran together says %s %q; CI runs %q", name, got, w)
		}
	}
}

// scriptVar is the value a shell script assigns name at the start of a
// line (name=value).
func scriptVar(t *testing.T, path, name string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `=(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s assigns no %s", path, name)
	}
	return string(m[1])
}

// majorMinor is "1.6" of "1.6.20~ds1-1+deb12u3".
func majorMinor(v string) string {
	return regexp.MustCompile(`^\d+\.\d+`).FindString(v)
}
