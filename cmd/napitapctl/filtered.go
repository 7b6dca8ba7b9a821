package main

import (
	"errors"
	"fmt"

	"github.com/napitap/napitap/pkg/handoff"
)

// filteredUsage is what --help and help filtered print (main.go's verbs).
const filteredUsage = `  napitapctl [--socket PATH] filtered
      List the containers on this node whose processes are under napitap's
      seccomp filter (napitap/vmm.json, napitap/virt-launcher.json,
      napitapctl launch): napitapd serves one listener for each. Once
      napitap is removed from the node, every TUNSETIFF of theirs (a NIC
      hot-plug) gets ENOSYS for the rest of their lives: remove napitap
      from a node only when this lists none (deploy/README.md, "Removal").
      Needs root with napitapd's capabilities (the pods' names); exits 0.
`

// filtered: the seccomp listeners napitapd serves, by origin.
func filtered(client *handoff.Client, args []string) error {
	fs := clientFlags("filtered", client)
	fs.Parse(args)
	if fs.NArg() != 0 {
		usageError("filtered takes no arguments, got %q", fs.Args())
	}
	st, err := client.Status()
	if err != nil {
		return err
	}
	if st.Filter == nil {
		return errors.New("napitapd said nothing of its seccomp listeners: run napitapctl as root on the node or in napitapd's container (kubectl exec -n napitap-system POD -c napitapd -- napitapctl filtered), against a napitapd of this version or later")
	}
	fmt.Printf("%d container(s) under napitap's seccomp filter, served by napitapd pid %d\n", len(st.Filter.Listeners), st.Pid)
	for _, origin := range st.Filter.Listeners {
		fmt.Println(origin)
	}
	return nil
}
