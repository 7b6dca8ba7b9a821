package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/napitap/napitap/pkg/napiprobe"
)

// probeUsage is what --help and help probe print (main.go's verbs).
const probeUsage = `  napitapctl probe [FDS]
      Diagnostic, run by exec: napitapctl exec -- napitapctl probe {fds}.
      Write 16 in-order TCP segments into the first queue fd of FDS
      (default 3) and tell whether GRO in the tap's netns merged them,
      which only a NAPI queue does, given the tap's gro_flush_timeout;
      exits 1 if it did not.
`

// probe runs napiprobe on the first of fds ("3:4:..." or "3,4,...", as
// exec's {fds} and {fds,} expand), a queue fd this process inherited.
func probe(args []string) error {
	fs := subFlags("probe")
	fs.Parse(args)
	args = fs.Args()
	if len(args) > 1 {
		usage()
	}
	fds := "3"
	if len(args) == 1 {
		fds = args[0]
	}
	first, _, _ := strings.Cut(strings.ReplaceAll(fds, ",", ":"), ":")
	fd, err := strconv.Atoi(first)
	if err != nil || fd < 3 {
		return fmt.Errorf("probe: %q is no queue fd (3 or more)", first)
	}
	res, err := napiprobe.RunQueue(os.NewFile(uintptr(fd), "fd "+first), 16, 1000)
	if err != nil {
		return err
	}
	fmt.Printf("queue fd %d: %s\n", fd, res)
	if !res.Merged() {
		return fmt.Errorf("probe: no merged skb on fd %d (%v)", fd, res.SKBLens)
	}
	return nil
}
