package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/napitap/napitap/pkg/handoff"
)

// listUsage is what --help and help list print (main.go's verbs).
const listUsage = `  napitapctl [--socket PATH] list
      What napitapd holds: MODE is intercept (the VMM opens the tap by name)
      or fds (napitapd holds the queues), MAC is the guest's, HELD the queue
      fds napitapd holds now (0 after a fetch, until the next fetch reopens
      them).
`

func list(client *handoff.Client, args []string) error {
	fs := clientFlags("list", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("list takes no arguments, got %q", fs.Args())
	}
	atts, err := client.List()
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONTAINER\tIFNAME\tTAP\tMODE\tQUEUES\tHELD\tNAPI\tMAC\tNETNS")
	for _, a := range atts {
		// intercept: the VMM opens the tap by name and the agent adds NAPI;
		// fds: napitapd holds the queues until a fetch.
		mode := "fds"
		if a.Intercept {
			mode = "intercept"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%v\t%s\t%s\n", a.ContainerID, a.IfName, a.TapName, mode, a.Queues, a.Held, a.NAPI, a.MAC, a.Netns)
	}
	return w.Flush()
}
