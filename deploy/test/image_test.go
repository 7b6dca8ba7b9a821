package deploytest

import (
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/napitap/napitap/deploy/test/manifests"
)

// makeVar runs make in the repository root with args and a clean
// environment for make's own variables, so that a `make test IMAGE=x`
// around this test does not hand its IMAGE down.
func makeVar(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	cmd := exec.Command("make", append([]string{"-s", "--no-print-directory", "-C", repoRoot}, args...)...)
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "IMAGE", "MANIFESTS", "VERSION":
		default:
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// images lists the image of every container of ds, init containers first.
func images(ds *appsv1.DaemonSet) map[string]string {
	m := map[string]string{}
	for _, cs := range [][]corev1.Container{ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers} {
		for _, c := range cs {
			m[c.Name] = c.Image
		}
	}
	return m
}

// `make image` by default tags the image that `kubectl apply -k deploy/`
// runs, so a first deploy runs the image built from this tree.
func TestMakeImageIsTheDeployedImage(t *testing.T) {
	built := makeVar(t, "print-image")
	ds, _ := daemonSet(t, "deploy")
	imgs := images(ds)
	if len(imgs) == 0 {
		t.Fatal("the DaemonSet has no containers")
	}
	for name, img := range imgs {
		if img != built {
			t.Errorf("container %s runs %s; make image builds %s", name, img, built)
		}
	}
}

// `make deploy-manifests IMAGE=x` renders deploy/ with x in every
// container and nothing else changed, into MANIFESTS.
func TestDeployManifests(t *testing.T) {
	base, _ := daemonSet(t, "deploy")
	for _, ref := range []string{
		"registry.example:5000/me/napitap:v1",
		"registry.example/napitap@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"localhost/napitap:dev",
	} {
		out := filepath.Join(t.TempDir(), "napitap.yaml")
		makeVar(t, "deploy-manifests", "IMAGE="+ref, "MANIFESTS="+out)
		y, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		docs, err := splitYAML(y)
		if err != nil {
			t.Fatal(err)
		}
		var objs []object
		for _, d := range docs {
			o, err := decodeStrict(out, d)
			if err != nil {
				t.Fatal(err)
			}
			objs = append(objs, o)
		}
		if len(objs) != len(render(t, filepath.Join(repoRoot, "deploy"))) {
			t.Errorf("%s: %d objects, deploy/ has a different count", ref, len(objs))
		}
		ds := find[*appsv1.DaemonSet](t, objs, "DaemonSet", "napitap")
		for name, img := range images(ds) {
			if img != ref {
				t.Errorf("%s: container %s runs %s", ref, name, img)
			}
		}
		a, b := ds.DeepCopy(), base.DeepCopy()
		for _, d := range []*appsv1.DaemonSet{a, b} {
			for _, cs := range [][]corev1.Container{d.Spec.Template.Spec.InitContainers, d.Spec.Template.Spec.Containers} {
				for i := range cs {
					cs[i].Image = ""
				}
			}
		}
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if string(ja) != string(jb) {
			t.Errorf("%s: the rendered DaemonSet differs from deploy/'s in more than the image", ref)
		}
	}
}

// `make deploy-manifests DEPLOY=dir` renders the overlay or the examples
// with IMAGE too: every container of theirs that runs napitap's image runs
// the one given.
func TestDeployManifestsOfAnOverlayOrTheExamples(t *testing.T) {
	const ref = "registry.example/napitap:v2"
	for _, dir := range []string{"deploy/overlays/nonroot-vmm", "deploy/examples"} {
		t.Run(dir+" runs the image given", func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "napitap.yaml")
			makeVar(t, "deploy-manifests", "IMAGE="+ref, "MANIFESTS="+out, "DEPLOY="+dir)
			y, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(y), "ghcr.io/napitap/napitap") {
				t.Errorf("%s still names ghcr.io/napitap/napitap", dir)
			}
			if n := strings.Count(string(y), "image: "+ref); n == 0 {
				t.Errorf("no container of %s runs %s", dir, ref)
			}
		})
	}
}

func TestImageReference(t *testing.T) {
	tests := []struct{ ref, name, tag, digest string }{
		{"ghcr.io/napitap/napitap:latest", "ghcr.io/napitap/napitap", "latest", ""},
		{"registry.example:5000/napitap:v1", "registry.example:5000/napitap", "v1", ""},
		{"registry.example:5000/napitap", "registry.example:5000/napitap", "latest", ""},
		{"napitap@sha256:abc", "napitap", "", "sha256:abc"},
	}
	for _, tc := range tests {
		img, err := manifests.Image(tc.ref)
		if err != nil || img.Name != manifests.ImageName || img.NewName != tc.name || img.NewTag != tc.tag || img.Digest != tc.digest {
			t.Errorf("Image(%q) = %+v, %v", tc.ref, img, err)
		}
	}
	for _, bad := range []string{"", ":v1", "napitap:", "a b:v1", "napitap@"} {
		if img, err := manifests.Image(bad); err == nil {
			t.Errorf("Image(%q) = %+v, want an error", bad, img)
		}
	}
}

// Every napitap image the manifests name is the release of the VERSION
// file, never latest: what a user applies is what that release built.
func TestTheManifestsNameTheReleasesImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	want := "ghcr.io/napitap/napitap:" + strings.TrimSpace(string(b))
	seen := 0
	walkManifests(t, func(path string, d fs.DirEntry) error {
		// test/e2e/kind tags its own build.
		if d.IsDir() || (filepath.Ext(path) != ".yaml" && filepath.Ext(path) != ".yml") || !strings.HasPrefix(rel(path), "deploy/") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range regexp.MustCompile(`ghcr\.io/napitap/napitap(:[^\s"']*)?`).FindAllString(string(text), -1) {
			seen++
			if m != want && m != "ghcr.io/napitap/napitap" { // a kustomization's images: name
				t.Errorf("%s names %s, want %s", rel(path), m, want)
			}
		}
		return nil
	})
	if seen == 0 {
		t.Error("no manifest names the image")
	}
}
