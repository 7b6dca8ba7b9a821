// napitap-bench-launcher forks and times plugin execs for napitap-bench
// (see package launch): it reads batches on stdin and answers on stdout.
// `napitap-bench-launcher vm open TAP N` and `vm fds N` are the VMs of
// napitap-bench capacity (launch.VM).
package main

import (
	"fmt"
	"os"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
)

func main() {
	if err := launch.Main(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "napitap-bench-launcher:", err)
		os.Exit(1)
	}
}
