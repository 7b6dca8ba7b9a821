package main

import (
	"fmt"

	"github.com/napitap/napitap/pkg/buildinfo"
	"github.com/napitap/napitap/pkg/handoff"
)

// versionUsage is what --help and help version print (main.go's verbs).
const versionUsage = `  napitapctl [--socket PATH] version
      Print napitapctl's version, then that of the napitapd on the socket
      (--version: napitapctl's alone, connecting to nothing).
`

// versions prints napitapctl's version, then that of the napitapd that
// answers on the socket: which one a node runs.
func versions(client *handoff.Client, args []string) error {
	fs := clientFlags("version", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("version takes no arguments, got %q", fs.Args())
	}
	fmt.Println(buildinfo.String("napitapctl"))
	st, err := client.Status()
	if err != nil {
		return err
	}
	v := st.Version
	if v == "" {
		v = "older than versions" // before pkg/buildinfo
	}
	fmt.Printf("napitapd %s (pid %d, at %s)\n", v, st.Pid, client.Socket)
	return nil
}
