// napitap-bench measures napitap side by side with a baseline in one run:
//
//	napitap-bench cni      ADD/DEL latency, RSS and bursts against the reference tap plugin
//	napitap-bench datapath what NAPI, threaded NAPI, gro_flush_timeout and the root qdisc do
//	                       to a VMM's traffic both ways, its round trips, and threaded NAPI at scale
//	napitap-bench capacity N VM pods at once (ADD, VMs opening their queues, napitapd's memory and fds,
//	                       a takeover and a SIGKILL with all N running, DEL) against the reference tap plugin
//
// Each writes a markdown table (and plots) under --out, docs/bench by default.
package main

import (
	"fmt"
	"os"

	"github.com/napitap/napitap/internal/bench/cnibench"
	"github.com/napitap/napitap/internal/bench/datapath"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "cni":
		err = cnibench.Main(os.Args[2:])
	case "datapath":
		err = datapath.Main(os.Args[2:])
	case "capacity":
		err = cnibench.CapacityMain(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "napitap-bench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: napitap-bench cni|datapath|capacity [flags]  (-h for the flags of each)")
	os.Exit(2)
}
