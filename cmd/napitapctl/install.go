package main

import (
	"fmt"
	"path/filepath"

	"github.com/napitap/napitap/pkg/install"
)

// installPluginUsage is what --help and help install-plugin print (main.go's verbs).
const installPluginUsage = `  napitapctl install-plugin [--from PATH] --dir DIR [--name NAME]
      Install the plugin binary (default /opt/napitap/bin/napitap) into the
      CNI bin dir DIR under its own name (or NAME), atomically: a temporary file in
      DIR, synced, then renamed over the old one, so that a runtime exec'ing
      the plugin meanwhile runs the old or the new one. A symlink there is
      refused. Says what it replaced.
`

// installPlugin installs the plugin binary into a CNI bin dir without a
// shell (the image has none): the DaemonSet's install-cni init container.
func installPlugin(args []string) error {
	fs := subFlags("install-plugin")
	from := fs.String("from", "/opt/napitap/bin/napitap", "the plugin binary to install")
	dir := fs.String("dir", "", "the CNI bin dir to install it into, as its base name")
	name := fs.String("name", "", "the name to install it under; the base name of --from if empty")
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("install-plugin takes no arguments, got %q", fs.Args())
	}
	if *dir == "" {
		usageError("install-plugin: --dir names the CNI bin dir to install into")
	}
	if *name == "" {
		*name = filepath.Base(*from)
	}
	if *name != filepath.Base(*name) || *name == "." || *name == ".." {
		usageError("install-plugin: --name %q is not a file name", *name)
	}
	res, err := install.Executable(*from, *dir, *name)
	if err != nil {
		return err
	}
	fmt.Println(res)
	return nil
}
