package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapqueues"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// queuesUsage is what --help and help queues print (main.go's verbs).
const queuesUsage = `  napitapctl queues --netns PATH --tap NAME [-o table|json]
  napitapctl [--socket PATH] queues --container ID --ifname IF [-o table|json]
      Every open queue of the tap on the node, read from the kernel: the
      process holding it (pid, command), its fd, and the TAP's flags,
      NAPI among them. The kernel decides NAPI per queue but shows no
      queue's own: TUNGETIFF gives one set of flags per tap, those of the
      attach that took it from no queue to one (docs/DESIGN.md fact 2).
      They are each queue's only where all were opened alike, as a VMM
      opens them. Detached queues are not listed. Needs root with
      CAP_SYS_PTRACE (napitapd's container has it).
`

// queues lists the open queues of a tap, named by its netns and name or
// by the attachment napitapd records.
func queues(client *handoff.Client, args []string) error {
	fs := clientFlags("queues", client)
	netns := fs.String("netns", "", "the tap's network namespace (a path)")
	tap := fs.String("tap", "", "the tap's name")
	container := fs.String("container", "", "container ID of the attachment (instead of --netns and --tap)")
	ifName := fs.String("ifname", "", "CNI_IFNAME of the attachment")
	output := fs.String("o", "table", "table or json")
	fs.Parse(args)
	switch {
	case fs.NArg() != 0:
		usageError("queues takes no arguments, got %q", fs.Args())
	case *output != "table" && *output != "json":
		usageError("queues: -o %q: table or json", *output)
	case (*container == "") != (*ifName == ""):
		usageError("queues: --container and --ifname name an attachment together: give both")
	case *container != "" && (*netns != "" || *tap != ""):
		usageError("queues: an attachment (--container, --ifname) or a tap (--netns, --tap), not both")
	case *container == "" && (*netns == "" || *tap == ""):
		usageError("queues: name the tap (--netns PATH --tap NAME) or its attachment (--container ID --ifname IF)")
	}
	if *container != "" {
		att, err := attachment(client, handoff.Key{ContainerID: *container, IfName: *ifName})
		if err != nil {
			return err
		}
		*netns, *tap = att.Netns, att.TapName
		if att.NodeTap {
			*netns = "/proc/self/ns/net" // a Kata DAN tap: the node's netns, where napitapctl runs
		}
	}
	id, err := tapsetup.NetnsID(*netns)
	if err != nil {
		return fmt.Errorf("netns %s: %w", *netns, err)
	}
	found, err := tapqueues.Find(id, *tap)
	if errors.Is(err, tapqueues.ErrNotPermitted) {
		err = fmt.Errorf("%w: run napitapctl as root on the node, or in napitapd's container (kubectl exec -n napitap-system POD -c napitapd -- napitapctl queues ...)", err)
	}
	if *output == "json" {
		if found == nil {
			found = []tapqueues.Queue{}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if encErr := enc.Encode(found); encErr != nil {
			return encErr
		}
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PID\tCOMMAND\tFD\tTAP FLAGS\tTAP NAPI\tTAP FRAGS\tTAP MULTIQUEUE")
	for _, q := range found {
		fmt.Fprintf(w, "%d\t%s\t%d\t%#x\t%v\t%v\t%v\n", q.PID, q.Command, q.FD, q.Tap.Flags, q.Tap.NAPI, q.Tap.Frags, q.Tap.MultiQueue)
	}
	if flushErr := w.Flush(); flushErr != nil {
		return flushErr
	}
	if len(found) > 0 {
		fmt.Println("TAP flags are the tap's, written by its first attached queue: the kernel shows no queue's own (napitapctl help queues)")
	}
	if len(found) == 0 && err == nil {
		fmt.Fprintf(os.Stderr, "napitapctl: no process holds a queue of tap %q in %s\n", *tap, *netns)
	}
	return err
}

// attachment is the attachment key names, from napitapd's list.
func attachment(client *handoff.Client, key handoff.Key) (*handoff.Attachment, error) {
	atts, err := client.List()
	if err != nil {
		return nil, err
	}
	for i := range atts {
		if atts[i].Key == key {
			return &atts[i], nil
		}
	}
	return nil, fmt.Errorf("napitapd records no attachment %s (napitapctl list shows those it does)", key)
}
