package deploytest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cannot skips a test that cannot run here, or fails it under CI=true,
// where every test must run.
func cannot(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s, and CI=true forbids skipping", why)
	}
	t.Skip(why)
}

// imageFiles are the image's only files, each a static binary that `make
// build` made, by where the image has them.
var imageFiles = map[string]string{
	"opt/napitap/bin/napitap":       "napitap",
	"usr/local/bin/napitapd":        "napitapd",
	"usr/local/bin/napitap-fdstore": "napitap-fdstore",
	"usr/local/bin/napitapctl":      "napitapctl",
	"opt/napitap/bin/napitapctl":    "napitapctl", // for deploy/overlays/kata to install
}

// imageScripts are the image's other files, by the repository file each
// is: what deploy/overlays/kata installs on a node, never run in the image
// (which has no shell).
var imageScripts = map[string]string{
	"opt/napitap/bin/containerd-shim-kata-napitap-v2": "deploy/kata/containerd-shim-kata-napitap-v2",
}

// `make image IMAGE_ARCHIVE=...` builds deploy/Dockerfile with no registry
// from make build's binaries, with whichever builder this machine has, and
// writes an archive that containerd imports: napitapd as the entrypoint,
// the four static binaries where the DaemonSet runs them, and nothing else
// (no shell).
func TestMakeImageBuildsWithNoRegistryAndContainerdImportsIt(t *testing.T) {
	if os.Geteuid() != 0 {
		cannot(t, "building and importing the image needs root")
	}
	builder, err := exec.Command(filepath.Join(repoRoot, "hack", "image.sh"), "builder").Output()
	if err != nil {
		cannot(t, "no image builder here (hack/deps.sh image installs buildah)")
	}
	for _, p := range []string{"containerd", "ctr", "make"} {
		if _, err := exec.LookPath(p); err != nil {
			cannot(t, p+" is not installed (hack/deps.sh test installs it)")
		}
	}
	const ref = "napitap.test/napitap:image-test"
	archive := filepath.Join(t.TempDir(), "napitap.tar")
	start := time.Now()
	out := makeVar(t, "image", "IMAGE="+ref, "IMAGE_ARCHIVE="+archive)
	t.Logf("make image (%s) in %v:\n%s", strings.TrimSpace(string(builder)), time.Since(start).Round(time.Millisecond), lastLines(out, 3))
	t.Cleanup(func() {
		if out, err := exec.Command(filepath.Join(repoRoot, "hack", "image.sh"), "rm", ref).CombinedOutput(); err != nil {
			t.Logf("hack/image.sh rm %s: %v: %s", ref, err, out)
		}
	})

	imgs := readOCIArchive(t, archive)
	if got := slices.Sorted(maps.Keys(imgs)); !slices.Equal(got, imagePlatforms) {
		t.Errorf("the archive's platforms are %q, want %q (make image's PLATFORMS)", got, imagePlatforms)
	}
	for platform, img := range imgs {
		checkImage(t, platform, img)
	}
	t.Logf("image %s: %s, archive %d bytes", ref, imageSizes(imgs), fileSize(t, archive))

	// The node's side: ctr images import, as deploy/README.md says.
	ctd := startContainerd(t)
	start = time.Now()
	const ns = "napitap-image-test"
	if out, err := exec.Command("ctr", "-a", ctd, "-n", ns, "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	} else {
		t.Logf("ctr images import in %v: %s", time.Since(start).Round(time.Millisecond), bytes.TrimSpace(out))
	}
	ls, err := exec.Command("ctr", "-a", ctd, "-n", ns, "images", "ls").CombinedOutput()
	if err != nil {
		t.Fatalf("ctr images ls: %v\n%s", err, ls)
	}
	if !slices.ContainsFunc(strings.Split(string(ls), "\n"), func(l string) bool { return strings.HasPrefix(l, ref+" ") }) {
		t.Errorf("containerd does not list %s after the import:\n%s", ref, ls)
	}
	t.Logf("containerd's view:\n%s", bytes.TrimSpace(ls))
}

// imagePlatforms are the platforms make image builds by default
// (the Makefile's PLATFORMS), sorted.
var imagePlatforms = []string{"linux/amd64", "linux/arm64"}

// checkImage checks one platform's image of the archive: napitapd as the
// entrypoint, the binaries make build or make build-ARCH made for that
// platform where the DaemonSet runs them, and nothing else.
func checkImage(t *testing.T, platform string, img *ociImage) {
	t.Helper()
	cfg := img.config.Config
	if !slices.Equal(cfg.Entrypoint, []string{"/usr/local/bin/napitapd"}) || len(cfg.Cmd) != 0 || cfg.User != "0:0" {
		t.Errorf("%s: config: entrypoint %q, cmd %q, user %q; want napitapd, no cmd, 0:0", platform, cfg.Entrypoint, cfg.Cmd, cfg.User)
	}
	if p := img.config.OS + "/" + img.config.Architecture; p != platform {
		t.Errorf("%s: the image's config says %s", platform, p)
	}
	var files []string
	for name, f := range img.files {
		switch {
		case f.typ == tar.TypeDir:
		case f.typ != tar.TypeReg:
			t.Errorf("/%s: tar type %q: the image should hold only directories and the four binaries", name, f.typ)
		default:
			files = append(files, name)
		}
	}
	slices.Sort(files)
	want := slices.Sorted(maps.Keys(imageFiles))
	want = slices.Sorted(slices.Values(append(want, slices.Collect(maps.Keys(imageScripts))...)))
	if !slices.Equal(files, want) {
		t.Errorf("%s: the image's files are %q, want only %q: no shell, nothing else", platform, files, want)
	}
	for p, src := range imageScripts {
		f, ok := img.files[p]
		local, err := os.ReadFile(filepath.Join(repoRoot, src))
		if err != nil {
			t.Fatal(err)
		}
		if !ok || f.mode&0o7777 != 0o755 || sha256.Sum256(local) != sha256.Sum256(f.data) {
			t.Errorf("/%s: mode %o, or not %s as it is in the repository", p, f.mode&0o7777, src)
		}
	}
	for p, bin := range imageFiles {
		f, ok := img.files[p]
		if !ok {
			continue
		}
		if f.mode&0o111 != 0o111 {
			t.Errorf("/%s: mode %o, not executable", p, f.mode)
		}
		// Execute-only, so that their processes are not dumpable from
		// exec on (docs/threat-model.md); what install-plugin copies out,
		// under /opt/napitap/bin, it must read.
		if execOnly := strings.HasPrefix(p, "usr/local/bin/"); execOnly && f.mode&0o7777 != 0o111 {
			t.Errorf("/%s: mode %o, want 0111 (execute-only: not dumpable from exec on)", p, f.mode&0o7777)
		}
		built := filepath.Join("bin", bin)
		if platform != "linux/"+runtime.GOARCH {
			built = filepath.Join("bin", strings.Replace(platform, "/", "-", 1), bin)
		}
		local, err := os.ReadFile(filepath.Join(repoRoot, built))
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(local) != sha256.Sum256(f.data) {
			t.Errorf("%s: /%s is not %s, which make image built it from", platform, p, built)
		}
		if interp := elfInterpreter(t, p, f.data); interp != "" {
			t.Errorf("/%s is dynamically linked (%s), which an empty image cannot run", p, interp)
		}
		if m := elfMachine(t, f.data); m != elfMachines[platform] {
			t.Errorf("%s: /%s is built for %v", platform, p, m)
		}
	}
}

func imageSizes(imgs map[string]*ociImage) string {
	var s []string
	for _, p := range slices.Sorted(maps.Keys(imgs)) {
		s = append(s, fmt.Sprintf("%s %d bytes of files", p, imgs[p].size))
	}
	return strings.Join(s, ", ")
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

func fileSize(t *testing.T, p string) int64 {
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

// ociImage is the one image of an OCI archive: its config and its files,
// the layers applied in order.
type ociImage struct {
	config struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			Entrypoint []string
			Cmd        []string
			User       string
		} `json:"config"`
	}
	files map[string]imageFile
	size  int64
}

type imageFile struct {
	typ  byte
	mode int64
	data []byte
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Platform  *struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
	} `json:"platform,omitempty"`
}

// ociIndex is the media type of an OCI image index (a manifest list).
const ociIndex = "application/vnd.oci.image.index.v1+json"

// readOCIArchive is an OCI archive of one image index, by platform.
func readOCIArchive(t *testing.T, archive string) map[string]*ociImage {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if h.Typeflag == tar.TypeReg {
			if blobs[path.Clean(h.Name)], err = io.ReadAll(tr); err != nil {
				t.Fatal(err)
			}
		}
	}
	blob := func(d descriptor) []byte {
		t.Helper()
		b, ok := blobs[path.Join("blobs", strings.Replace(d.Digest, ":", "/", 1))]
		if !ok {
			t.Fatalf("%s: no blob %s", archive, d.Digest)
		}
		if sum := sha256.Sum256(b); "sha256:"+hex.EncodeToString(sum[:]) != d.Digest {
			t.Fatalf("%s: blob %s does not match its digest", archive, d.Digest)
		}
		return b
	}
	var index struct{ Manifests []descriptor }
	if err := json.Unmarshal(blobs["index.json"], &index); err != nil || len(index.Manifests) != 1 || index.Manifests[0].MediaType != ociIndex {
		t.Fatalf("%s: index.json: %v, %d manifests, want an OCI archive of one image index", archive, err, len(index.Manifests))
	}
	var list struct{ Manifests []descriptor }
	if err := json.Unmarshal(blob(index.Manifests[0]), &list); err != nil {
		t.Fatalf("%s: image index: %v", archive, err)
	}
	imgs := map[string]*ociImage{}
	for _, m := range list.Manifests {
		if m.Platform == nil {
			t.Fatalf("%s: image %s names no platform", archive, m.Digest)
		}
		imgs[m.Platform.OS+"/"+m.Platform.Architecture] = readOCIImage(t, archive, blob(m), blob)
	}
	return imgs
}

// readOCIImage is one image of an archive, from its manifest.
func readOCIImage(t *testing.T, archive string, manifestBlob []byte, blob func(descriptor) []byte) *ociImage {
	t.Helper()
	var manifest struct {
		Config descriptor
		Layers []descriptor
	}
	if err := json.Unmarshal(manifestBlob, &manifest); err != nil {
		t.Fatalf("%s: manifest: %v", archive, err)
	}
	img := &ociImage{files: map[string]imageFile{}}
	if err := json.Unmarshal(blob(manifest.Config), &img.config); err != nil {
		t.Fatalf("%s: config: %v", archive, err)
	}
	for _, l := range manifest.Layers {
		var r io.Reader = bytes.NewReader(blob(l))
		if strings.HasSuffix(l.MediaType, "gzip") {
			var err error
			if r, err = gzip.NewReader(r); err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
		}
		lr := tar.NewReader(r)
		for {
			h, err := lr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("layer %s: %v", l.Digest, err)
			}
			name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
			if strings.HasPrefix(path.Base(name), ".wh.") {
				t.Errorf("layer %s: whiteout %s in an image built on nothing", l.Digest, name)
				continue
			}
			data, err := io.ReadAll(lr)
			if err != nil {
				t.Fatal(err)
			}
			img.files[name] = imageFile{typ: h.Typeflag, mode: h.Mode, data: data}
			img.size += h.Size
		}
	}
	return img
}

// elfMachines are the ELF machine of each platform's binaries.
var elfMachines = map[string]elf.Machine{"linux/amd64": elf.EM_X86_64, "linux/arm64": elf.EM_AARCH64}

func elfMachine(t *testing.T, b []byte) elf.Machine {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return elf.EM_NONE
	}
	return f.Machine
}

// elfInterpreter is the program interpreter an ELF binary asks for, empty
// for a static one.
func elfInterpreter(t *testing.T, name string, b []byte) string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Errorf("/%s: not an ELF binary: %v", name, err)
		return ""
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			interp, _ := io.ReadAll(p.Open())
			return strings.TrimRight(string(interp), "\x00")
		}
	}
	return ""
}

// startContainerd runs a containerd of the test's own, everything under a
// temp dir (no CRI, no tasks), and returns its socket. It is stopped by its
// PID when the test ends.
func startContainerd(t *testing.T) string {
	t.Helper()
	// Short: it holds unix sockets.
	dir, err := os.MkdirTemp("", "napitap-ctd-")
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "containerd.sock")
	conf := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = [
  "io.containerd.grpc.v1.cri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing",
  "io.containerd.tracing.processor.v1.otlp",
]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"))
	cfgFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(cfgFile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(dir, "containerd.log")
	logF, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", cfgFile)
	cmd.Stdout, cmd.Stderr = logF, logF
	// SIGTERM should the test binary die without its cleanups (a go test
	// timeout). The signal follows the thread that forked, so that thread
	// stays locked until containerd has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	started, exited := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
		}
		close(exited)
	}()
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("containerd (pid %d) ignored SIGTERM for 10s: killing it", cmd.Process.Pid)
			_ = cmd.Process.Kill()
			<-exited
		}
		logF.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("containerd log:\n%s", lastLines(string(b), 40))
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := exec.Command("ctr", "-a", sock, "version").Run()
		if err == nil {
			return sock
		}
		select {
		case <-exited:
			t.Fatal("containerd exited; its log follows")
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd did not answer on %s in 20s: %v", sock, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// `make release` holds, for every platform of the image, a tarball of the
// four static binaries built for it and reporting the release, the image's
// archive, the rendered manifests, and SHA256SUMS over all of them.
func TestMakeReleaseHoldsEveryPlatformAndSumsIt(t *testing.T) {
	if os.Geteuid() != 0 {
		cannot(t, "building the release's image needs root")
	}
	if _, err := exec.Command(filepath.Join(repoRoot, "hack", "image.sh"), "builder").Output(); err != nil {
		cannot(t, "no image builder here (hack/deps.sh image installs buildah)")
	}
	version := strings.TrimSpace(string(must(os.ReadFile(filepath.Join(repoRoot, "VERSION")))))
	image := "ghcr.io/napitap/napitap:" + version
	// The release's image is the product's own name: put back whatever
	// the builder held under it before, by removing only what this made.
	if had, _ := exec.Command("buildah", "images", "-q", image).Output(); len(bytes.TrimSpace(had)) == 0 {
		t.Cleanup(func() { exec.Command(filepath.Join(repoRoot, "hack", "image.sh"), "rm", image).Run() })
	}
	dir, bin := filepath.Join(t.TempDir(), "release"), filepath.Join(t.TempDir(), "bin")
	makeVar(t, "release", "VERSION="+version, "RELEASE_DIR="+dir, "BIN="+bin)

	var files []string
	for _, e := range must(os.ReadDir(dir)) {
		files = append(files, e.Name())
	}
	want := []string{"SHA256SUMS", "napitap-image-" + version + ".tar", "napitap-kata.yaml"}
	for _, p := range imagePlatforms {
		want = append(want, "napitap-"+strings.Replace(p, "/", "-", 1)+"-"+version+".tgz")
	}
	want = slices.Sorted(slices.Values(append(want, "napitap-nonroot-vmm.yaml", "napitap.yaml")))
	if !slices.Equal(files, want) {
		t.Errorf("the release holds %q, want %q", files, want)
	}
	sums := exec.Command("sha256sum", "--check", "--strict", "SHA256SUMS")
	sums.Dir = dir
	if out, err := sums.CombinedOutput(); err != nil || strings.Count(string(out), ": OK\n") != len(want)-1 {
		t.Errorf("sha256sum --check SHA256SUMS: %v\n%s", err, out)
	}
	for _, p := range imagePlatforms {
		name := "napitap-" + strings.Replace(p, "/", "-", 1) + "-" + version + ".tgz"
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			data := must(io.ReadAll(tr))
			got = append(got, h.Name)
			if m := elfMachine(t, data); m != elfMachines[p] || !bytes.Contains(data, []byte(version)) {
				t.Errorf("%s: %s is built for %v, or does not hold the version %s", name, h.Name, m, version)
			}
		}
		if slices.Sort(got); !slices.Equal(got, []string{"napitap", "napitap-fdstore", "napitapctl", "napitapd"}) {
			t.Errorf("%s holds %q, want the four binaries", name, got)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
