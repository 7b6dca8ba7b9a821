// napitap-bench-launcher forks and times plugin execs for napitap-bench cni
// (see package launch); it reads batches on stdin and answers on stdout.
package main

import (
	"fmt"
	"os"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
)

func main() {
	if err := launch.Serve(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "napitap-bench-launcher:", err)
		os.Exit(1)
	}
}
