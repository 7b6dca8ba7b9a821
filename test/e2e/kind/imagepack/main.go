// Command imagepack packs a directory into a one-layer image in
// docker-archive form (what `docker save` writes and `ctr images import`
// reads), with every timestamp at the epoch so that the same directory
// always gives the same digests. test/e2e/kind/nodeimage.sh makes the
// kind node's preloaded images with it (pause and the control plane's
// components, each a static binary). With -layer it packs a ready tar
// instead of DIR, as it is: test/e2e/kind/kubevirt/images.sh packs a
// Debian rootfs tarred by GNU tar that way (owners, setuid bits, hard
// links and file capabilities, which a directory walk here would lose):
//
//	imagepack -o OUT.tar -ref REF [-entrypoint /bin/x,arg] [-user UID] [-env K=V,...] DIR
//	imagepack -o OUT.tar -ref REF [-entrypoint /bin/x,arg] [-user UID] [-env K=V,...] -layer LAYER.tar
package main

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/napitap/napitap/test/e2e/crihelp"
)

func main() {
	out := flag.String("o", "", "the docker-archive to write")
	ref := flag.String("ref", "", "the image's tag, e.g. registry.k8s.io/pause:3.10.1")
	entrypoint := flag.String("entrypoint", "", "the entrypoint, comma-separated")
	user := flag.String("user", "", "the user the image runs as, e.g. 1001")
	env := flag.String("env", "", "the environment, comma-separated KEY=VALUE")
	layer := flag.String("layer", "", "a tar to take as the image's layer, as it is, instead of DIR")
	flag.Parse()
	if *out == "" || *ref == "" || (*layer == "") != (flag.NArg() == 1) || flag.NArg() > 1 {
		fmt.Fprintln(os.Stderr, "usage: imagepack -o OUT.tar -ref REF [-entrypoint /bin/x,arg] [-user UID] [-env K=V,...] DIR|-layer LAYER.tar")
		os.Exit(2)
	}
	cfg := crihelp.ImageConfig{User: *user}
	if *entrypoint != "" {
		cfg.Entrypoint = strings.Split(*entrypoint, ",")
	}
	if *env != "" {
		cfg.Env = strings.Split(*env, ",")
	}
	var err error
	if *layer != "" {
		err = packLayer(*out, *ref, cfg, *layer)
	} else {
		err = pack(*out, *ref, cfg, flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagepack:", err)
		os.Exit(1)
	}
}

func packLayer(out, ref string, cfg crihelp.ImageConfig, layer string) error {
	f, err := os.Open(layer)
	if err != nil {
		return err
	}
	defer f.Close()
	return crihelp.WriteLayerImage(out, ref, cfg, f)
}

func pack(out, ref string, cfg crihelp.ImageConfig, dir string) error {
	var entries []crihelp.ImageEntry
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		name, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := crihelp.ImageEntry{Name: filepath.ToSlash(name), Mode: int64(info.Mode().Perm())}
		switch {
		case d.IsDir():
			e.Dir = true
		case info.Mode()&fs.ModeSymlink != 0:
			if e.Link, err = os.Readlink(path); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			if e.Data, err = os.ReadFile(path); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: not a file, directory or symlink", path)
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return err
	}
	return crihelp.WriteImage(out, ref, cfg, entries)
}
