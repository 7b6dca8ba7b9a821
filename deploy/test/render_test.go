package deploytest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// repoRoot is the napitap checkout this module sits in (deploy/test).
var repoRoot = func() string {
	abs, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		panic(err)
	}
	return abs
}()

// manifestDirs hold every YAML file this suite decodes.
var manifestDirs = []string{"deploy", filepath.Join("test", "e2e", "kind")}

// object is one Kubernetes object, decoded into its type.
type object struct {
	source     string // where it came from, for messages
	apiVersion string
	kind       string
	name       string
	obj        any
}

func (o object) String() string {
	return fmt.Sprintf("%s %s/%s (%s)", o.apiVersion, o.kind, o.name, o.source)
}

// kinds are the types decodeStrict decodes, by "<apiVersion> <kind>".
var kinds = map[string]func() any{
	"monitoring.coreos.com/v1 PrometheusRule": func() any { return &PrometheusRule{} },
	"v1 Namespace":                func() any { return &corev1.Namespace{} },
	"v1 ServiceAccount":           func() any { return &corev1.ServiceAccount{} },
	"v1 Pod":                      func() any { return &corev1.Pod{} },
	"v1 ConfigMap":                func() any { return &corev1.ConfigMap{} },
	"node.k8s.io/v1 RuntimeClass": func() any { return &nodev1.RuntimeClass{} },
	"apps/v1 DaemonSet":           func() any { return &appsv1.DaemonSet{} },
	"rbac.authorization.k8s.io/v1 ClusterRole":        func() any { return &rbacv1.ClusterRole{} },
	"rbac.authorization.k8s.io/v1 ClusterRoleBinding": func() any { return &rbacv1.ClusterRoleBinding{} },
	"rbac.authorization.k8s.io/v1 Role":               func() any { return &rbacv1.Role{} },
	"rbac.authorization.k8s.io/v1 RoleBinding":        func() any { return &rbacv1.RoleBinding{} },
	"k8s.cni.cncf.io/v1 NetworkAttachmentDefinition":  func() any { return &NetworkAttachmentDefinition{} },
}

// decodeStrict decodes one YAML document into the type of its kind; unknown
// or duplicate fields fail, as does a kind this suite does not know. A
// kubevirt.io object is left undecoded (obj nil): ./kubevirt, a module of its
// own, decodes those into kubevirt.io/api's types at two versions.
func decodeStrict(source string, doc []byte) (object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	if err := sigsyaml.Unmarshal(doc, &head); err != nil {
		return object{}, fmt.Errorf("%s: %w", source, err)
	}
	o := object{source: source, apiVersion: head.APIVersion, kind: head.Kind, name: head.Metadata.Name}
	if strings.HasPrefix(head.APIVersion, "kubevirt.io/") {
		return o, nil
	}
	newObj, ok := kinds[head.APIVersion+" "+head.Kind]
	if !ok {
		return o, fmt.Errorf("%s: %q %q is a kind this suite cannot decode: add its type to kinds", source, head.APIVersion, head.Kind)
	}
	o.obj = newObj()
	if o.name == "" {
		return o, fmt.Errorf("%s: %s has no metadata.name", source, head.Kind)
	}
	if err := unmarshalStrict(doc, o.obj); err != nil {
		return o, fmt.Errorf("%s: %w", o, err)
	}
	return o, nil
}

// unmarshalStrict decodes YAML (or JSON) as the API server's strict field
// validation does: field names match case-sensitively (encoding/json alone
// would take "hostPid" for hostPID), and unknown or duplicate fields fail.
func unmarshalStrict(doc []byte, v any) error {
	j, err := sigsyaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// splitYAML splits a multi-document YAML file, dropping empty documents.
func splitYAML(b []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
	var docs [][]byte
	for {
		d, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := sigsyaml.Unmarshal(d, &v); err == nil && v == nil {
			continue // only comments
		}
		docs = append(docs, d)
	}
}

func isKustomization(name string) bool {
	return name == "kustomization.yaml" || name == "kustomization.yml" || name == "Kustomization"
}

// walkManifests calls fn for every file and directory under manifestDirs,
// this suite's own directory aside, and fails the test on an error.
func walkManifests(t *testing.T, fn func(path string, d fs.DirEntry) error) {
	t.Helper()
	for _, dir := range manifestDirs {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && path == filepath.Join(repoRoot, "deploy", "test") {
				return filepath.SkipDir
			}
			return fn(path, d)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// kustomizations lists every directory under manifestDirs with a
// kustomization.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	walkManifests(t, func(path string, d fs.DirEntry) error {
		if !d.IsDir() && isKustomization(d.Name()) && !isComponent(t, path) {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	return dirs
}

// isComponent: a kustomize component renders only through a
// kustomization that uses it (deploy/kata through deploy/overlays/kata).
func isComponent(t *testing.T, path string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var head struct{ Kind string }
	return sigsyaml.Unmarshal(b, &head) == nil && head.Kind == "Component"
}

// render runs kustomize on dir and decodes every object it yields.
func render(t *testing.T, dir string) []object {
	t.Helper()
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsRootOnly
	resMap, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", rel(dir), err)
	}
	var objs []object
	for _, res := range resMap.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatalf("kustomize %s: %s: %v", rel(dir), res.CurId(), err)
		}
		o, err := decodeStrict("kustomize "+rel(dir), y)
		if err != nil {
			t.Error(err)
			continue
		}
		objs = append(objs, o)
	}
	return objs
}

// manifestFiles decodes every YAML document in the files under
// manifestDirs, kustomizations aside.
func manifestFiles(t *testing.T) []object {
	t.Helper()
	var objs []object
	walkManifests(t, func(path string, d fs.DirEntry) error {
		ext := filepath.Ext(path)
		if d.IsDir() || (ext != ".yaml" && ext != ".yml") || isKustomization(d.Name()) {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		docs, err := splitYAML(b)
		if err != nil {
			return fmt.Errorf("%s: %w", rel(path), err)
		}
		for i, doc := range docs {
			o, err := decodeStrict(fmt.Sprintf("%s#%d", rel(path), i), doc)
			if err != nil {
				t.Error(err)
				continue
			}
			objs = append(objs, o)
		}
		return nil
	})
	return objs
}

func rel(path string) string {
	if r, err := filepath.Rel(repoRoot, path); err == nil {
		return r
	}
	return path
}

func find[T any](t *testing.T, objs []object, kind, name string) T {
	t.Helper()
	for _, o := range objs {
		if o.kind == kind && o.name == name {
			return o.obj.(T)
		}
	}
	t.Fatalf("no %s %q", kind, name)
	panic("unreachable")
}

func TestEveryKustomizationRendersStrictly(t *testing.T) {
	dirs := kustomizations(t)
	for _, want := range []string{"deploy", "deploy/base", "deploy/examples", "deploy/overlays/nonroot-vmm", "deploy/overlays/kata", "test/e2e/kind"} {
		if !slices.Contains(dirs, filepath.Join(repoRoot, want)) {
			t.Errorf("no kustomization in %s", want)
		}
	}
	for _, dir := range dirs {
		t.Run(rel(dir), func(t *testing.T) {
			objs := render(t, dir)
			if len(objs) == 0 {
				t.Fatal("renders nothing")
			}
			seen := map[string]bool{}
			for _, o := range objs {
				t.Logf("%s", o)
				if key := o.kind + "/" + o.name; seen[key] {
					t.Errorf("%s twice", key)
				} else {
					seen[key] = true
				}
			}
		})
	}
}

func TestEveryManifestFileDecodesStrictly(t *testing.T) {
	objs := manifestFiles(t)
	if len(objs) < 10 {
		t.Fatalf("only %d objects in %v", len(objs), manifestDirs)
	}
	for _, o := range objs {
		t.Logf("%s", o)
	}
}

// The strict decoding is what the other tests rely on: prove it bites.
func TestStrictDecodingRejectsMisspeltFields(t *testing.T) {
	for name, doc := range map[string]string{
		"DaemonSet": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      hostPid: true\n",
		"Pod":       "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers: [{name: c, image: i, securityContext: {readOnlyRootFileSystem: true}}]\n",
		"NAD":       "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: x}\nspec: {conifg: '{}'}\n",
		"duplicate": "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: x}\nmetadata: {name: y}\n",
		"unknown":   "apiVersion: v1\nkind: Secret\nmetadata: {name: x}\n",
	} {
		if _, err := decodeStrict(name, []byte(doc)); err == nil {
			t.Errorf("%s: a misspelt field, a duplicate or an unknown kind decoded", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

// deploy/ is the base, whole.
func TestDeployIsTheBase(t *testing.T) {
	top, base := render(t, filepath.Join(repoRoot, "deploy")), render(t, filepath.Join(repoRoot, "deploy", "base"))
	// Each object without its source.
	names := func(objs []object) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.String()[:strings.LastIndex(o.String(), " (")])
		}
		return out
	}
	if a, b := names(top), names(base); !slices.Equal(a, b) {
		t.Errorf("deploy/ renders %v, deploy/base %v", a, b)
	}
	for _, kind := range []string{"Namespace", "ServiceAccount", "DaemonSet"} {
		if !slices.ContainsFunc(top, func(o object) bool { return o.kind == kind }) {
			t.Errorf("deploy/ has no %s", kind)
		}
	}
}
