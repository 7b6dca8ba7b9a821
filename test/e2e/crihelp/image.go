package crihelp

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
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
	return WriteImage(path, ref, ImageConfig{Entrypoint: entrypoint}, entries)
}

// ImageConfig is what an image's config says of the process it runs:
// User and Env are left out of the config when empty, so an image without
// them keeps the digest it had before they existed.
type ImageConfig struct {
	Entrypoint []string
	User       string   // e.g. "1001" or "107"
	Env        []string // KEY=VALUE
}

// WriteImage is WriteImageArchive with a config of its own.
func WriteImage(path, ref string, cfg ImageConfig, entries []ImageEntry) error {
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
	return WriteLayerImage(path, ref, cfg, bytes.NewReader(layer.Bytes()))
}

// WriteLayerImage writes a one-layer image tagged ref whose layer is the
// tar layer, as it is: a rootfs tarred by GNU tar keeps its owners, setuid
// bits, hard links and file capabilities, which ImageEntry has no room for.
func WriteLayerImage(path, ref string, cfg ImageConfig, layer io.ReadSeeker) error {
	epoch := time.Unix(0, 0)
	h := sha256.New()
	size, err := io.Copy(h, layer)
	if err != nil {
		return err
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return err
	}
	process := map[string]any{
		"Entrypoint": cfg.Entrypoint,
		"WorkingDir": "/",
	}
	if cfg.User != "" {
		process["User"] = cfg.User
	}
	if len(cfg.Env) > 0 {
		process["Env"] = cfg.Env
	}
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch.UTC().Format(time.RFC3339),
		"config":       process,
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{"sha256:" + hex.EncodeToString(h.Sum(nil))},
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
	if err := tw.WriteHeader(&tar.Header{Name: "layer.tar", Mode: 0o644, Size: size, ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := io.Copy(tw, layer); err != nil {
		return fmt.Errorf("layer.tar: %w", err)
	}
	for _, file := range []struct {
		name string
		data []byte
	}{{configName, config}, {"manifest.json", manifest}} {
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
