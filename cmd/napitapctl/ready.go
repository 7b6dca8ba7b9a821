package main

import (
	"fmt"

	"github.com/napitap/napitap/pkg/handoff"
)

// readyUsage is what --help and help ready print (main.go's verbs).
const readyUsage = `  napitapctl [--socket PATH] ready
      Exit 0 only if the napitapd answering on the socket runs in this
      process's container (the same mount namespace): the DaemonSet's
      readiness probe, which a pod whose napitapd has not taken over from
      the old pod's must fail, however well the old one answers.
`

// ready: the napitapd that answers is this container's own.
func ready(client *handoff.Client, args []string) error {
	fs := clientFlags("ready", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("ready takes no arguments, got %q", fs.Args())
	}
	theirs, err := client.Status()
	if err != nil {
		return err
	}
	ours, err := handoff.OwnStatus()
	if err != nil {
		return err
	}
	if theirs.MountNS != ours.MountNS {
		return fmt.Errorf("not ready: %s is served by napitapd pid %d of another container (mount namespace %d, this one's is %d): this container's napitapd has not taken over", client.Socket, theirs.Pid, theirs.MountNS, ours.MountNS)
	}
	fmt.Printf("ready: napitapd pid %d, of this container, serves %s\n", theirs.Pid, client.Socket)
	return nil
}
