package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapqueues"
)

// nodeUsage is what --help and help node print (main.go's verbs).
const nodeUsage = `  napitapctl [--socket PATH] node [--plain] [-o table|json]
      Every open queue of every napitap tap on the node: which VMs lack
      NAPI, in one command. NAPI is napitapd's word for each queue, since
      the kernel shows no queue's own (docs/DESIGN.md fact 2): napi (its
      agent attached it with IFF_NAPI, or napitap's ADD opened it so in
      fds mode), plain (attached without; WHY says why, REASON is
      napitapd_plain_queues_total's), or unknown (open before napitapd
      last started, or since its last scan, --queue-scan-interval). TAP
      NAPI is the kernel's: TUNGETIFF's flag, the tap's, written by its
      first queue. --plain lists only queues that are not napi. Needs root
      with CAP_SYS_PTRACE, and napitapd's capabilities to see every
      attachment (napitapd's container has both).
`

// nodeQueue is one row of napitapctl node: the attachment, the queue as
// the kernel shows it, and napitapd's record of it.
type nodeQueue struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	TapName     string `json:"tapName"`
	Netns       string `json:"netns"`
	Mode        string `json:"mode"`
	// Kernel is what the kernel shows: the holder and the tap's flags.
	Kernel tapqueues.Queue `json:"kernel"`
	// Napitapd is napitapd's record: NAPI napi, plain or unknown.
	Napitapd handoff.QueueState `json:"napitapd"`
}

func node(client *handoff.Client, args []string) error {
	fs := clientFlags("node", client)
	plainOnly := fs.Bool("plain", false, "only the queues that are not napi")
	output := fs.String("o", "table", "table or json")
	fs.Parse(args)
	switch {
	case fs.NArg() != 0:
		usageError("node takes no arguments, got %q", fs.Args())
	case *output != "table" && *output != "json":
		usageError("node: -o %q: table or json", *output)
	}
	atts, err := client.List()
	if err != nil {
		return err
	}
	taps := map[tapqueues.TapID]bool{}
	for _, a := range atts {
		taps[tapOf(a)] = true
	}
	found, findErr := tapqueues.FindAll(taps)
	if errors.Is(findErr, tapqueues.ErrNotPermitted) {
		findErr = fmt.Errorf("%w: run napitapctl as root on the node, or in napitapd's container (kubectl exec -n napitap-system POD -c napitapd -- napitapctl node)", findErr)
	}
	rows := nodeRows(atts, found)
	if *plainOnly {
		var kept []nodeQueue
		for _, r := range rows {
			if r.Napitapd.NAPI != handoff.QueueNAPI {
				kept = append(kept, r)
			}
		}
		rows = kept
	}
	if *output == "json" {
		if rows == nil {
			rows = []nodeQueue{}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			return err
		}
		return findErr
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONTAINER\tIFNAME\tTAP\tMODE\tPID\tCOMMAND\tFD\tNAPI\tREASON\tTAP NAPI\tWHY")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%v\t%s\n", shortID(r.ContainerID), r.IfName, r.TapName, r.Mode,
			r.Kernel.PID, r.Kernel.Command, r.Kernel.FD, r.Napitapd.NAPI, dash(r.Napitapd.Reason), r.Kernel.Tap.NAPI, r.Napitapd.Why)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(rows) > 0 {
		fmt.Println("NAPI is napitapd's record of each queue; TAP NAPI the kernel's flag for the whole tap (napitapctl help node)")
	}
	return findErr
}

// nodeRows joins the kernel's queues with napitapd's records, by tap,
// process and fd; a queue napitapd has no record of is unknown.
func nodeRows(atts []handoff.Attachment, found []tapqueues.Found) []nodeQueue {
	type key struct {
		tap     tapqueues.TapID
		pid, fd int
	}
	states := map[key]handoff.QueueState{}
	byTap := map[tapqueues.TapID]handoff.Attachment{}
	for _, a := range atts {
		t := tapOf(a)
		byTap[t] = a
		for _, st := range a.QueueStates {
			states[key{t, st.PID, st.FD}] = st
		}
	}
	var rows []nodeQueue
	for _, q := range found {
		a := byTap[q.TapID]
		st, ok := states[key{q.TapID, q.PID, q.FD}]
		if !ok {
			st = handoff.QueueState{PID: q.PID, FD: q.FD, NAPI: handoff.QueueUnknown, Why: "not in napitapd's record yet (its next scan)"}
		}
		mode := "fds"
		if a.Intercept {
			mode = "intercept"
		}
		rows = append(rows, nodeQueue{ContainerID: a.ContainerID, IfName: a.IfName, TapName: a.TapName, Netns: a.Netns, Mode: mode, Kernel: q.Queue, Napitapd: st})
	}
	return rows
}

// tapOf names a's tap on the node, as napitapd's scan does.
func tapOf(a handoff.Attachment) tapqueues.TapID {
	id := a.NetnsID
	if a.NodeTap {
		id = a.TapNetnsID
	}
	return tapqueues.TapID{NetnsID: id, Name: a.TapName}
}

// shortID is a container ID as crictl prints it.
func shortID(id string) string {
	if len(id) > 13 {
		return id[:13]
	}
	return id
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
