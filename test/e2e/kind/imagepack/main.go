// Command imagepack packs a directory into a one-layer image in
// docker-archive form (what `docker save` writes and `ctr images import`
// reads), with every timestamp at the epoch so that the same directory
// always gives the same digests. test/e2e/kind/nodeimage.sh makes the
// kind node's preloaded images with it (pause and the control plane's
// components, each a static binary):
//
//	imagepack -o OUT.tar -ref REF [-entrypoint /bin/x,arg] DIR
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
	flag.Parse()
	if *out == "" || *ref == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: imagepack -o OUT.tar -ref REF [-entrypoint /bin/x,arg] DIR")
		os.Exit(2)
	}
	var ep []string
	if *entrypoint != "" {
		ep = strings.Split(*entrypoint, ",")
	}
	if err := pack(*out, *ref, ep, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "imagepack:", err)
		os.Exit(1)
	}
}

func pack(out, ref string, entrypoint []string, dir string) error {
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
	return crihelp.WriteImageArchive(out, ref, entrypoint, entries)
}
