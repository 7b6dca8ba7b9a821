// Package kernel runs napitap's kernel-facing package tests on another
// kernel than the host's: Debian 12's (Linux 6.1), booted under QEMU TCG
// with a Debian 12 root filesystem built here (rootfs.sh). The test
// binaries are built on the host (go test -c), packed into a second cpio
// appended to the guest's initramfs, and run in the guest as root with
// CI=true by init.sh, which reports each package on the serial console.
// See README.md; make test-kernel runs it.
package kernel

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/test/e2e/vm"
)

const (
	// enableEnv=1 runs TestKernel (make test-kernel sets it): it takes
	// tens of minutes, so a plain go test ./... leaves it out.
	enableEnv = "NAPITAP_TEST_KERNEL"
	// pkgsEnv: the packages to run, space-separated (default
	// defaultPkgs).
	pkgsEnv = "NAPITAP_KERNEL_PKGS"
	// runEnv: a -test.run pattern given to every package.
	runEnv = "NAPITAP_KERNEL_RUN"
	// timeoutEnv: the whole guest's limit, a Go duration (default 100m).
	timeoutEnv = "NAPITAP_KERNEL_TIMEOUT"
	// pkgTimeoutEnv: each package's -test.timeout (default 25m).
	pkgTimeoutEnv = "NAPITAP_KERNEL_PKG_TIMEOUT"
)

// defaultPkgs are the packages whose tests touch the kernel, in the order
// they run: the peer credentials and tap permission first.
var defaultPkgs = []string{
	"pkg/peer", "pkg/tunperm", "pkg/threadcred", "pkg/tapsetup",
	"pkg/handoff", "pkg/seccompagent", "pkg/fdstore", "pkg/takeover",
	"plugins/napitap", "cmd/napitapd", demo,
}

// demo is hack/demo.sh, the README's main job, run in the guest from a
// copy of the tree's hack/, examples/ and the binaries make build and
// make tools put in bin/.
const demo = "demo"

// prebuilt are the binaries some tests build with go build on the host
// (internal/cnitest.Build); the guest has no Go toolchain, so they are
// built here and found through cnitest.PrebuiltEnv (init.sh sets it).
var prebuilt = append([]string{"./cmd/napitapd", "./plugins/napitap"}, cnitest.ReferencePlugins...)

// demoBinaries are what hack/demo.sh runs from bin/: the Makefile's
// BINARIES and TOOLS.
var demoBinaries = []string{"./plugins/napitap", "./cmd/napitapd", "./cmd/napitap-fdstore", "./cmd/napitapctl",
	"github.com/containernetworking/plugins/plugins/main/bridge", "github.com/containernetworking/plugins/plugins/main/ptp",
	"github.com/containernetworking/plugins/plugins/ipam/host-local", "github.com/containernetworking/cni/cnitool"}

const module = "github.com/napitap/napitap"

func TestKernel(t *testing.T) {
	if os.Getenv(enableEnv) != "1" {
		t.Skipf("boots a Debian 12 guest under TCG for tens of minutes: make test-kernel (%s=1)", enableEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatal("rootfs.sh needs root (debootstrap, device nodes in the guest's cpio)")
	}
	root := repoRoot(t)
	cache := filepath.Join(root, ".cache", "kernel")
	pkgs := defaultPkgs
	if s := os.Getenv(pkgsEnv); s != "" {
		pkgs = strings.Fields(s)
	}
	total := durationEnv(t, timeoutEnv, 100*time.Minute)
	pkgTimeout := durationEnv(t, pkgTimeoutEnv, 25*time.Minute)

	// The guest: kernel and root filesystem, cached.
	start := time.Now()
	rootfs := exec.Command(filepath.Join(root, "test", "e2e", "kernel", "rootfs.sh"), cache)
	rootfs.Stderr = os.Stderr
	out, err := rootfs.Output()
	if err != nil {
		t.Fatalf("rootfs.sh: %v", err)
	}
	guest := strings.TrimSpace(string(out))
	info, _ := os.ReadFile(filepath.Join(guest, "INFO"))
	t.Logf("guest %s (%v):\n%s", guest, time.Since(start).Round(time.Second), info)
	guestGlibc := field(string(info), "glibc")

	// The test binaries, built here.
	start = time.Now()
	stage := t.TempDir()
	bin := filepath.Join(stage, "tests", "bin")
	pre := filepath.Join(stage, "tests", "prebuilt")
	for _, d := range []string{bin, pre} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	flags := []string{"-test.v", "-test.count=1", "-test.timeout=" + pkgTimeout.String()}
	if r := os.Getenv(runEnv); r != "" {
		flags = append(flags, "-test.run="+r)
	}
	var list strings.Builder
	var cgoPkgs []string
	for _, p := range pkgs {
		if p == demo {
			stageDemo(t, root, stage)
			fmt.Fprintf(&list, "%s\t%s\t\n", p, demo)
			continue
		}
		cgo := needsCgo(t, root, p)
		name := strings.ReplaceAll(p, "/", "_") + ".test"
		goCmd(t, root, cgo, "test", "-c", "-o", filepath.Join(bin, name), "./"+p)
		if cgo {
			cgoPkgs = append(cgoPkgs, p)
		}
		fmt.Fprintf(&list, "%s\t%s\t%s\n", p, name, strings.Join(flags, " "))
	}
	for _, p := range prebuilt {
		goCmd(t, root, false, "build", "-o", pre+"/", p)
	}
	if len(cgoPkgs) > 0 {
		host := hostGlibc(t)
		t.Logf("built with cgo, dynamically linked against the host's glibc %s (the guest's: %s): %s", host, guestGlibc, strings.Join(cgoPkgs, " "))
		if host != guestGlibc {
			t.Fatalf("the host's glibc (%s) is not the guest root filesystem's (%s): cgo test binaries may not run there", host, guestGlibc)
		}
	}
	if err := os.WriteFile(filepath.Join(stage, "tests", "list"), []byte(list.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	// What the tests read from the tree, beside their working directory
	// (/src/PKG): docs/, examples/, and a package's testdata.
	src := []string{"docs", "examples"}
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(root, p, "testdata")); err == nil {
			src = append(src, filepath.Join(p, "testdata"))
		}
	}
	for _, d := range src {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(stage, "src", d)), 0o755); err != nil {
			t.Fatal(err)
		}
		if o, err := exec.Command("cp", "-a", filepath.Join(root, d), filepath.Join(stage, "src", d)).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", d, err, o)
		}
	}
	initSh, err := os.ReadFile(filepath.Join(root, "test", "e2e", "kernel", "init.sh"))
	if err == nil {
		err = os.WriteFile(filepath.Join(stage, "init"), initSh, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(stage, "initrd.cpio")
	packInitrd(t, filepath.Join(guest, "rootfs.cpio"), stage, initrd)
	t.Logf("built %d test binaries in %v", len(pkgs), time.Since(start).Round(time.Second))

	// The guest's run.
	serial := filepath.Join(cache, "serial.log")
	argv := []string{
		"qemu-system-x86_64",
		"-machine", "q35,accel=tcg",
		"-smp", "2",
		"-m", "3072",
		"-nodefaults", "-no-user-config",
		"-display", "none",
		"-no-reboot",
		"-serial", "file:" + serial,
		"-kernel", filepath.Join(guest, "vmlinuz"),
		"-initrd", initrd,
		"-append", "console=ttyS0 loglevel=4 panic=-1 rdinit=/init no_timer_check",
	}
	start = time.Now()
	g, err := vm.Start(argv, nil, serial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Stop() })
	t.Logf("guest booting; its console: %s", serial)
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- g.Wait(ctx) }()
	follow(t, serial, done)
	waitErr := <-done
	elapsed := time.Since(start)

	res := parse(g.Serial())
	t.Logf("guest ran %v; kernel %s\n%s", elapsed.Round(time.Second), res.uname, res.table(pkgs))
	if waitErr != nil {
		t.Errorf("guest: %v", waitErr)
	}
	if res.uname == "" {
		t.Errorf("the guest never printed its uname -r; console: %s", serial)
	}
	if res.setupErr != "" {
		t.Errorf("guest setup failed: %s", res.setupErr)
	}
	if !res.done {
		t.Errorf("the guest did not finish; console: %s", serial)
	}
	for _, p := range pkgs {
		r := res.pkgs[p]
		switch {
		case r == nil:
			t.Errorf("%s: never started", p)
		case !r.ended:
			t.Errorf("%s: no result (the guest stopped or timed out inside it)", p)
		case r.rc != 0:
			t.Errorf("%s: exit status %d, failed: %s", p, r.rc, strings.Join(r.failed, " "))
		}
	}
}

// follow copies the serial console's markers and failures to the test's
// log as they appear, until done has a value (which it puts back).
func follow(t *testing.T, serial string, done chan error) {
	var off int64
	var partial string
	interesting := regexp.MustCompile(`^(NAPITAP-KERNEL-|\s*--- FAIL|FAIL|ok |panic:)`)
	for {
		var fin bool
		var err error
		select {
		case err = <-done:
			fin = true
		case <-time.After(2 * time.Second):
		}
		if f, e := os.Open(serial); e == nil {
			_, _ = f.Seek(off, io.SeekStart)
			b, _ := io.ReadAll(f)
			f.Close()
			off += int64(len(b))
			lines := strings.Split(partial+string(b), "\n")
			partial = lines[len(lines)-1]
			for _, l := range lines[:len(lines)-1] {
				l = strings.TrimRight(l, "\r")
				if interesting.MatchString(l) {
					t.Logf("guest: %s", l)
				}
			}
		}
		if fin {
			done <- err
			return
		}
	}
}

type pkgResult struct {
	ended                bool
	rc, secs             int
	passed, skipped      int
	failed, skippedNames []string
	fallbacks            []string // the lines tests log where a fallback ran: "(... Linux < N.N)"
}

type results struct {
	uname, setupErr string
	done            bool
	pkgs            map[string]*pkgResult
}

var (
	reEnd    = regexp.MustCompile(`^NAPITAP-KERNEL-PKG-END (\S+) rc=(\d+) secs=(\d+)`)
	reResult = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (\S+)`)
	// A test's log line that says a fallback ran: "no X (ENOTTY, Linux <
	// 6.13): ...", after the file:line prefix.
	reFallback = regexp.MustCompile(`^\s+\S+_test\.go:\d+: (.*Linux < \d+\.\d+.*)$`)
)

// parse reads the console: the markers of init.sh and go test -v's
// top-level results between a package's START and END.
func parse(console string) results {
	r := results{pkgs: map[string]*pkgResult{}}
	var cur *pkgResult
	sc := bufio.NewScanner(strings.NewReader(console))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.HasPrefix(l, "NAPITAP-KERNEL-UNAME "):
			r.uname = strings.TrimPrefix(l, "NAPITAP-KERNEL-UNAME ")
		case strings.HasPrefix(l, "NAPITAP-KERNEL-ERROR "):
			r.setupErr = strings.TrimPrefix(l, "NAPITAP-KERNEL-ERROR ")
		case l == "NAPITAP-KERNEL-DONE":
			r.done = true
		case strings.HasPrefix(l, "NAPITAP-KERNEL-PKG-START "):
			cur = &pkgResult{}
			r.pkgs[strings.TrimPrefix(l, "NAPITAP-KERNEL-PKG-START ")] = cur
		case reEnd.MatchString(l):
			m := reEnd.FindStringSubmatch(l)
			if p := r.pkgs[m[1]]; p != nil {
				p.ended = true
				p.rc, _ = strconv.Atoi(m[2])
				p.secs, _ = strconv.Atoi(m[3])
			}
			cur = nil
		case cur != nil && reFallback.MatchString(l):
			f := reFallback.FindStringSubmatch(l)[1]
			if !slices.Contains(cur.fallbacks, f) {
				cur.fallbacks = append(cur.fallbacks, f)
			}
		case cur != nil && reResult.MatchString(l):
			m := reResult.FindStringSubmatch(l)
			switch m[1] {
			case "PASS":
				cur.passed++
			case "FAIL":
				cur.failed = append(cur.failed, m[2])
			case "SKIP":
				cur.skipped++
				cur.skippedNames = append(cur.skippedNames, m[2])
			}
		}
	}
	return r
}

// table is one line per package: its result, time in the guest and the
// counts of its top-level tests.
func (r results) table(pkgs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-20s %-8s %6s %5s %5s %5s  %s\n", "package", "result", "secs", "pass", "fail", "skip", "failed / skipped")
	for _, p := range pkgs {
		x := r.pkgs[p]
		switch {
		case x == nil:
			fmt.Fprintf(&b, "%-20s %-8s\n", p, "not run")
		case !x.ended:
			fmt.Fprintf(&b, "%-20s %-8s %6s %5d %5d %5d  %s\n", p, "no end", "-", x.passed, len(x.failed), x.skipped, strings.Join(x.failed, " "))
		default:
			res := "ok"
			if x.rc != 0 {
				res = "FAIL"
			}
			notes := strings.Join(x.failed, " ")
			if len(x.skippedNames) > 0 {
				notes += " skipped: " + strings.Join(x.skippedNames, " ")
			}
			fmt.Fprintf(&b, "%-20s %-8s %6d %5d %5d %5d  %s\n", p, res, x.secs, x.passed, len(x.failed), x.skipped, strings.TrimSpace(notes))
		}
	}
	b.WriteString("fallbacks the tests saw run:\n")
	for _, p := range pkgs {
		if x := r.pkgs[p]; x != nil {
			for _, f := range x.fallbacks {
				fmt.Fprintf(&b, "  %s: %s\n", p, f)
			}
		}
	}
	return b.String()
}

// needsCgo: pkg's test binary links a package of this module that uses cgo
// (internal/ownuserns: the attacker unshares before Go's runtime starts).
func needsCgo(t *testing.T, root, pkg string) bool {
	cmd := exec.Command("go", "list", "-deps", "-test", "-f", "{{if .CgoFiles}}{{.ImportPath}}{{end}}", "./"+pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s: %v", pkg, err)
	}
	for _, l := range strings.Fields(string(out)) {
		if strings.HasPrefix(l, module+"/") {
			return true
		}
	}
	return false
}

// stageDemo puts hack/demo.sh, examples/ and the binaries it runs under
// the guest's /src/demo, and /tests/bin/demo, which runs it there.
func stageDemo(t *testing.T, root, stage string) {
	dir := filepath.Join(stage, "src", demo)
	if err := os.MkdirAll(filepath.Join(dir, "hack"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"hack/demo.sh", "examples"} {
		if o, err := exec.Command("cp", "-a", filepath.Join(root, f), filepath.Join(dir, f)).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v: %s", f, err, o)
		}
	}
	goCmd(t, root, false, append([]string{"build", "-o", filepath.Join(dir, "bin") + "/"}, demoBinaries...)...)
	run := "#!/bin/sh\nexec /src/" + demo + "/hack/demo.sh\n"
	if err := os.WriteFile(filepath.Join(stage, "tests", "bin", demo), []byte(run), 0o755); err != nil {
		t.Fatal(err)
	}
}

func goCmd(t *testing.T, root string, cgo bool, args ...string) {
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if cgo {
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// hostGlibc is the version of the host's libc6 package, as the guest's
// INFO gives its own.
func hostGlibc(t *testing.T) string {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "libc6").Output()
	if err != nil {
		t.Fatalf("dpkg-query libc6 (cgo test binaries need the guest's glibc): %v", err)
	}
	return strings.TrimSpace(string(out))
}

// packInitrd writes the guest's root cpio followed by a cpio of dir's
// init, tests and src: the kernel unpacks one archive after the other.
func packInitrd(t *testing.T, rootfs, dir, out string) {
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	in, err := os.Open(rootfs)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if _, err := io.Copy(f, in); err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd := exec.Command("sh", "-c", "find init tests src | LC_ALL=C sort | busybox cpio -o -H newc")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("cpio of %s: %v: %s", dir, err, stderr.String())
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

func field(info, key string) string {
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(l, key+": "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func durationEnv(t *testing.T, env string, def time.Duration) time.Duration {
	s := os.Getenv(env)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", env, s, err)
	}
	return d
}

func repoRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
