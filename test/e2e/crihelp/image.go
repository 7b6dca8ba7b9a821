package crihelp

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"time"
)

// ImageEntry is one entry of an image's only layer: a file (Data), a
// directory (Dir) or a symlink (Link).
type ImageEntry struct {
	Name string // relative, e.g. "pause" or "usr"
	Data []byte
	Mode int64
	Dir  bool
	Link string
}

// WritePauseArchive packs the static pause binary into a one-layer image
// in docker-archive form (what `docker save` writes and `ctr images import`
// reads): layer.tar, the image config named by its digest with the layer's
// diff_id, and manifest.json tagging it ref.
func WritePauseArchive(path, pauseBin, ref string) error {
	bin, err := os.ReadFile(pauseBin)
	if err != nil {
		return err
	}
	return WriteImageArchive(path, ref, []string{"/pause"}, []ImageEntry{{Name: "pause", Data: bin, Mode: 0o755}})
}

// WriteImageArchive packs entries into a one-layer image tagged ref, in
// the docker-archive form WritePauseArchive describes.
func WriteImageArchive(path, ref string, entrypoint []string, entries []ImageEntry) error {
	epoch := time.Unix(0, 0)
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Mode: e.Mode, ModTime: epoch}
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, e.Name+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		}
		if err := lw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := lw.Write(e.Data); err != nil {
			return err
		}
	}
	if err := lw.Close(); err != nil {
		return err
	}
	diffID := sha256.Sum256(layer.Bytes())

	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": entrypoint,
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{"sha256:" + hex.EncodeToString(diffID[:])},
		},
	})
	if err != nil {
		return err
	}
	configDigest := sha256.Sum256(config)
	configName := hex.EncodeToString(configDigest[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{ref},
		"Layers":   []string{"layer.tar"},
	}})
	if err != nil {
		return err
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, file := range []struct {
		name string
		data []byte
	}{{"layer.tar", layer.Bytes()}, {configName, config}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: file.name, Mode: 0o644, Size: int64(len(file.data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(file.data); err != nil {
			return fmt.Errorf("%s: %w", file.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
