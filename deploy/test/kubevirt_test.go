package deploytest

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"

	"github.com/napitap/napitap/pkg/config"
)

func TestKataExample(t *testing.T) {
	confs, _ := napitapConfs(t, manifestFiles(t))
	if len(confs["napitap-kata"]) != 1 {
		t.Fatal("no napitap-kata network")
	}
	c := confs["napitap-kata"][0]
	conf := checkNapitapConf(t, c)
	if conf == nil {
		return
	}
	if conf.KataDanDir == "" || conf.HandoffMode != config.HandoffIntercept {
		t.Errorf("napitap-kata: DAN dir %q, handoff mode %q: want kataDan on and intercept", conf.KataDanDir, conf.HandoffMode)
	}
}

// The Kata README's pod runs under a RuntimeClass of deploy/kata's, whose
// handler is the containerd runtime of containerd-config.toml, whose shim is
// the wrapper (containerd derives the binary's name from runtime_type), and
// the wrapper execs runtime-rs, the runtime that reads DAN files. A break
// anywhere in that chain leaves the pod running with plain queues.
func TestKataPodRunsRuntimeRsUnderTheAgent(t *testing.T) {
	dir := filepath.Join(repoRoot, "deploy", "kata")
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := regexp.MustCompile("(?s)```yaml\n(.*?)```").FindSubmatch(readme)
	if block == nil {
		t.Fatal("deploy/kata/README.md has no yaml block")
	}
	var pod *corev1.Pod
	o, err := decodeStrict("deploy/kata/README.md", block[1])
	if err != nil {
		t.Fatal(err)
	}
	if pod, _ = o.obj.(*corev1.Pod); pod == nil {
		t.Fatal("the README's yaml block is not the pod")
	}
	rcs, err := os.ReadFile(filepath.Join(dir, "runtimeclass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := splitYAML(rcs)
	if err != nil {
		t.Fatal(err)
	}
	var rc *nodev1.RuntimeClass
	for i, doc := range docs {
		o, err := decodeStrict(fmt.Sprintf("deploy/kata/runtimeclass.yaml#%d", i), doc)
		if err != nil {
			t.Fatal(err)
		}
		if v, ok := o.obj.(*nodev1.RuntimeClass); ok && pod.Spec.RuntimeClassName != nil && v.Name == *pod.Spec.RuntimeClassName {
			rc = v
		}
	}
	if rc == nil {
		t.Fatalf("the pod's runtimeClassName %v is none of deploy/kata/runtimeclass.yaml's", pod.Spec.RuntimeClassName)
	}
	toml, err := os.ReadFile(filepath.Join(dir, "containerd-config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	runtimeType := regexp.MustCompile(`(?m)^\[plugins\."io\.containerd\.grpc\.v1\.cri"\.containerd\.runtimes\.` +
		regexp.QuoteMeta(rc.Handler) + `\]\n\s*runtime_type = "io\.containerd\.([a-z0-9-]+)\.v2"`).FindSubmatch(toml)
	if runtimeType == nil {
		t.Fatalf("containerd-config.toml has no runtime %q with a runtime_type", rc.Handler)
	}
	wrapper, err := os.ReadFile(filepath.Join(dir, "containerd-shim-"+string(runtimeType[1])+"-v2"))
	if err != nil {
		t.Fatalf("runtime_type io.containerd.%s.v2 needs a shim of that name: %v", runtimeType[1], err)
	}
	// When it goes through napitapctl launch is TestKataShimWrapperLaunchesOnlyASandboxStart's;
	// how containerd reads the snippets, deploy/test/containerd's.
	if !strings.Contains(string(wrapper), "/opt/kata/runtime-rs/bin/containerd-shim-kata-v2") {
		t.Error("the shim wrapper does not exec runtime-rs's shim")
	}
	if !strings.Contains(string(toml), "runtime-rs/configuration-") {
		t.Error("containerd-config.toml does not point ConfigPath at a runtime-rs configuration")
	}
}
