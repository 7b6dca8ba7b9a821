package main

import (
	"os"

	"github.com/napitap/napitap/pkg/seccompagent"
)

// launchUsage is what --help and help launch print (main.go's verbs).
const launchUsage = `  napitapctl launch [--seccomp-socket PATH] -- CMD [ARGS...]
      Exec CMD under a seccomp filter whose TUNSETIFF calls napitapd serves:
      opening a napitap tap by name gives NAPI queues. CMD and everything
      it starts stay under the filter; without napitapd their TUNSETIFF
      fails with ENOSYS.
`

func launch(args []string) error {
	fs := subFlags("launch")
	socket := fs.String("seccomp-socket", seccompagent.DefaultSocket, "napitapd's seccomp socket")
	fs.Parse(args)
	if fs.NArg() == 0 {
		usage()
	}
	return seccompagent.Launch(*socket, fs.Args(), os.Environ())
}
