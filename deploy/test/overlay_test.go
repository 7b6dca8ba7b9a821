package deploytest

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
)

// The non-root VMM overlay opens the socket to group 107 through a
// supplemental group, not through a new capability.
func TestNonrootVMMOverlay(t *testing.T) {
	base, _ := daemonSet(t, "deploy")
	ds, _ := daemonSet(t, filepath.Join("deploy", "overlays", "nonroot-vmm"))
	c := container(t, ds.Spec.Template.Spec.Containers, "napitapd")
	if g, ok := flagValue(c.Args, "socket-group"); !ok || g != "107" {
		t.Errorf("--socket-group %q, want 107", g)
	}
	sc := ds.Spec.Template.Spec.SecurityContext
	if sc == nil || !slices.Contains(sc.SupplementalGroups, 107) {
		t.Error("napitapd must be in group 107 to chown its socket to it without CAP_CHOWN")
	}
	baseC := container(t, base.Spec.Template.Spec.Containers, "napitapd")
	if !slices.Equal(c.SecurityContext.Capabilities.Add, baseC.SecurityContext.Capabilities.Add) {
		t.Errorf("the overlay changes napitapd's capabilities to %v", c.SecurityContext.Capabilities.Add)
	}
	if len(c.Args) != len(baseC.Args)+1 {
		t.Errorf("args %v: the overlay should add --socket-group and keep the rest", c.Args)
	}
}

// deploy/README.md's overlay for another CNI bin dir works as written.
func TestCNIBinDirOverlayFromREADME(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	if i := strings.Index(section, "## Another CNI bin dir"); i >= 0 {
		section = section[i:]
	} else {
		t.Fatal(`deploy/README.md has no "## Another CNI bin dir"`)
	}
	m := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindStringSubmatch(section)
	if m == nil {
		t.Fatal("no yaml block in that section")
	}
	dir := t.TempDir()
	relDeploy, err := filepath.Rel(dir, filepath.Join(repoRoot, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	kust := strings.Replace(m[1], "../napitap/deploy", relDeploy, 1)
	if kust == m[1] {
		t.Fatal("the README's overlay no longer names ../napitap/deploy")
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	ds := find[*appsv1.DaemonSet](t, render(t, dir), "DaemonSet", "napitap")
	base, _ := daemonSet(t, "deploy")
	if len(ds.Spec.Template.Spec.Volumes) != len(base.Spec.Template.Spec.Volumes) {
		t.Errorf("the patch changed the number of volumes")
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name != "cni-bin" {
			continue
		}
		if v.HostPath.Path != "/var/lib/cni/bin" || *v.HostPath.Type != corev1.HostPathDirectory {
			t.Errorf("cni-bin: %+v", v.HostPath)
		}
		return
	}
	t.Error("no cni-bin volume")
}

// The kind suite applies deploy/overlays/nonroot-vmm (its VMMs run as
// 107) unchanged but for the image it loads, and its pods run that image
// too.
func TestKindOverlay(t *testing.T) {
	base, _ := daemonSet(t, filepath.Join("deploy", "overlays", "nonroot-vmm"))
	ds, _ := daemonSet(t, filepath.Join("test", "e2e", "kind"))
	const image = "ghcr.io/napitap/napitap:e2e"
	for _, cs := range [][]corev1.Container{ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers} {
		for i := range cs {
			if cs[i].Image != image {
				t.Errorf("%s: image %s, want %s", cs[i].Name, cs[i].Image, image)
			}
			cs[i].Image = ""
		}
	}
	for _, cs := range [][]corev1.Container{base.Spec.Template.Spec.InitContainers, base.Spec.Template.Spec.Containers} {
		for i := range cs {
			cs[i].Image = ""
		}
	}
	a, _ := json.Marshal(base)
	b, _ := json.Marshal(ds)
	if string(a) != string(b) {
		t.Errorf("test/e2e/kind changes more than the image:\n%s\n%s", a, b)
	}
	run, err := os.ReadFile(filepath.Join(repoRoot, "test", "e2e", "kind", "run.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(run), "image="+image) {
		t.Errorf("run.sh does not build %s", image)
	}
	for _, o := range manifestFiles(t) {
		if pod, ok := o.obj.(*corev1.Pod); ok && strings.HasPrefix(o.source, "test/") {
			for _, c := range pod.Spec.Containers {
				if c.Image != image {
					t.Errorf("%s: image %s, want the one run.sh loads, %s", o, c.Image, image)
				}
			}
		}
	}
}

// The Kata overlay adds only what installs the shim wrapper and napitapctl
// on the node, as the plugin is installed, and the RuntimeClass, limited to
// the nodes kata-deploy labels; containerd's snippets name the installed
// wrapper.
func TestKataOverlay(t *testing.T) {
	base, _ := daemonSet(t, "deploy")
	ds, objs := daemonSet(t, filepath.Join("deploy", "overlays", "kata"))
	spec, baseSpec := ds.Spec.Template.Spec, base.Spec.Template.Spec
	if !equalJSON(t, spec.Containers, baseSpec.Containers) {
		t.Error("the overlay changes the DaemonSet's containers")
	}
	if len(spec.InitContainers) != len(baseSpec.InitContainers)+3 || !equalJSON(t, spec.InitContainers[:len(baseSpec.InitContainers)], baseSpec.InitContainers) {
		t.Fatalf("init containers %d, want the base's %d and three more", len(spec.InitContainers), len(baseSpec.InitContainers))
	}
	installCNI := container(t, baseSpec.InitContainers, "install-cni")
	for _, want := range []struct{ name, file, as string }{
		{"install-kata-shim", "containerd-shim-kata-napitap-v2", ""},
		{"install-kata-go-shim", "containerd-shim-kata-napitap-v2", "containerd-shim-kata-go-napitap-v2"},
		{"install-napitapctl", "napitapctl", ""},
	} {
		c := container(t, spec.InitContainers, want.name)
		cmd := []string{"/usr/local/bin/napitapctl", "install-plugin", "--from=/opt/napitap/bin/" + want.file, "--dir=/host/napitap-bin"}
		if want.as != "" {
			cmd = append(cmd, "--name="+want.as)
		}
		if !slices.Equal(c.Command, cmd) {
			t.Errorf("%s: command %q, want %q", want.name, c.Command, cmd)
		}
		if !equalJSON(t, c.SecurityContext, installCNI.SecurityContext) || c.Image != installCNI.Image {
			t.Errorf("%s: image %s, securityContext %+v; want install-cni's", want.name, c.Image, c.SecurityContext)
		}
		if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "napitap-bin" || c.VolumeMounts[0].MountPath != "/host/napitap-bin" {
			t.Errorf("%s: mounts %+v", want.name, c.VolumeMounts)
		}
	}
	var hostDir string
	for _, v := range spec.Volumes {
		if v.Name == "napitap-bin" && v.HostPath != nil {
			hostDir = v.HostPath.Path
		}
	}
	if hostDir != "/opt/napitap/bin" {
		t.Errorf("napitap-bin volume at %q, want hostPath /opt/napitap/bin", hostDir)
	}
	for _, name := range []string{"kata-napitap", "kata-go-napitap"} {
		rc := find[*nodev1.RuntimeClass](t, objs, "RuntimeClass", name)
		if rc.Handler != name || rc.Namespace != "" || rc.Scheduling == nil || rc.Scheduling.NodeSelector["katacontainers.io/kata-runtime"] != "true" {
			t.Errorf("RuntimeClass %+v: want handler %s, no namespace, nodeSelector katacontainers.io/kata-runtime=true", rc, name)
		}
		for _, f := range []string{"containerd-config.toml", "containerd2-config.toml"} {
			b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "kata", f))
			if err != nil {
				t.Fatal(err)
			}
			if want := `runtime_path = "` + hostDir + `/containerd-shim-` + name + `-v2"`; !strings.Contains(string(b), want) {
				t.Errorf("deploy/kata/%s lacks %s", f, want)
			}
		}
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return string(ja) == string(jb)
}
