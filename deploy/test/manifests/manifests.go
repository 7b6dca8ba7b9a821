// Package manifests renders deploy/ for one image, as `make
// deploy-manifests IMAGE=...` does, without editing a tracked file.
package manifests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	sigsyaml "sigs.k8s.io/yaml"
)

// ImageName is the image deploy/base/kustomization.yaml sets the tag of.
const ImageName = "ghcr.io/napitap/napitap"

// Image splits an image reference into kustomize's image override of
// ImageName: name:tag, name@digest, or a bare name (tag latest, as a
// container runtime reads it).
func Image(ref string) (types.Image, error) {
	img := types.Image{Name: ImageName}
	name := ref
	if i := strings.Index(ref, "@"); i >= 0 {
		name, img.Digest = ref[:i], ref[i+1:]
	} else if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		name, img.NewTag = ref[:i], ref[i+1:]
	} else {
		img.NewTag = "latest"
	}
	if name == "" || strings.ContainsAny(name, " \t\n@") {
		return types.Image{}, fmt.Errorf("image %q: not an image reference", ref)
	}
	if img.NewTag == "" && img.Digest == "" {
		return types.Image{}, fmt.Errorf("image %q: empty tag or digest", ref)
	}
	img.NewName = name
	return img, nil
}

// Render renders the kustomization in dir (deploy/) with every napitap
// image replaced by ref, as a multi-document YAML stream. It writes only
// a temporary kustomization that names dir as its resource.
func Render(dir, ref string) ([]byte, error) {
	img, err := Image(ref)
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "napitap-manifests-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	// kustomize takes no absolute path as a resource.
	res, err := filepath.Rel(tmp, abs)
	if err != nil {
		return nil, err
	}
	k, err := sigsyaml.Marshal(types.Kustomization{
		TypeMeta:  types.TypeMeta{APIVersion: types.KustomizationVersion, Kind: types.KustomizationKind},
		Resources: []string{res},
		Images:    []types.Image{img},
	})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), k, 0o644); err != nil {
		return nil, err
	}
	opts := krusty.MakeDefaultOptions()
	opts.LoadRestrictions = types.LoadRestrictionsRootOnly
	resMap, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), tmp)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s with image %s: %w", dir, ref, err)
	}
	y, err := resMap.AsYaml()
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	fmt.Fprintf(&out, "# napitap's deploy/ with image %s (make deploy-manifests IMAGE=%s): kubectl apply -f this file\n", ref, ref)
	out.Write(y)
	return out.Bytes(), nil
}
