package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/napitap/napitap/pkg/safefile"
	"github.com/napitap/napitap/pkg/seccompprofile"
)

// defaultListener is where napitapd's seccomp agent listens.
const defaultListener = "/run/napitap/seccomp.sock"

// seccompProfileUsage is what --help and help seccomp-profile print (main.go's verbs).
const seccompProfileUsage = `  napitapctl seccomp-profile [--listener PATH] vmm|virt-launcher
  napitapctl seccomp-profile [--listener PATH] --install DIR
      Print a Localhost seccomp profile that sends the VMM's TUNSETIFF to
      napitapd's seccomp agent, or install every kind into DIR (a kubelet
      seccomp dir, e.g. /var/lib/kubelet/seccomp/napitap).
`

// seccompProfile prints one profile, or installs them all into a kubelet
// seccomp dir (the DaemonSet's init container does this on every node).
func seccompProfile(args []string) error {
	fs := subFlags("seccomp-profile")
	listener := fs.String("listener", defaultListener, "napitapd's --seccomp-socket, as runc will dial it")
	install := fs.String("install", "", "write every profile as DIR/<kind>.json instead of printing one")
	fs.Parse(args)
	if *install != "" {
		if fs.NArg() != 0 {
			usage()
		}
		if err := safefile.TrustedDir(*install, 0o755); err != nil {
			return err
		}
		for _, kind := range seccompprofile.Kinds {
			b, err := renderProfile(kind, *listener)
			if err != nil {
				return err
			}
			path := filepath.Join(*install, kind+".json")
			if err := safefile.WriteAtomic(path, b, 0o644); err != nil {
				return err
			}
			fmt.Println("installed", path)
		}
		return nil
	}
	if fs.NArg() != 1 {
		usage()
	}
	b, err := renderProfile(fs.Arg(0), *listener)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(b)
	return err
}

func renderProfile(kind, listener string) ([]byte, error) {
	p, err := seccompprofile.Render(kind, listener)
	if err != nil {
		return nil, err
	}
	return seccompprofile.Marshal(p)
}
