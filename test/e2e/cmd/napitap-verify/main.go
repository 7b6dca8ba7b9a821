// napitap-verify runs the shared node assertions (test/e2e/nodecheck) on a
// node the test cannot reach from Go directly, such as a kind node:
//
//	napitap-verify present|gone --netns PATH --container ID --ifname IF --tap NAME \
//	    --queues N --wiring tc-redirect [--bridge NAME] [--socket PATH --held N]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/napitap/napitap/test/e2e/nodecheck"
)

func main() {
	if len(os.Args) < 2 || (os.Args[1] != "present" && os.Args[1] != "gone") {
		fmt.Fprintln(os.Stderr, "usage: napitap-verify present|gone [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var want nodecheck.Expect
	netns := fs.String("netns", "", "pod netns path")
	fs.StringVar(&want.ContainerID, "container", "", "sandbox (container) ID")
	fs.StringVar(&want.IfName, "ifname", "eth0", "CNI_IFNAME")
	fs.StringVar(&want.TapName, "tap", "tap0", "tap name")
	fs.IntVar(&want.Queues, "queues", 1, "configured queues")
	napi := fs.Bool("napi", true, "queues opened with IFF_NAPI")
	fs.StringVar(&want.Wiring, "wiring", "tc-redirect", "tc-redirect, bridge or none")
	fs.StringVar(&want.Bridge, "bridge", "", "bridge name (bridge wiring)")
	fs.StringVar(&want.Socket, "socket", "", "napitapd socket; empty skips the hand-off checks")
	fs.IntVar(&want.Held, "held", -1, "queue fds napitapd should hold (default: --queues)")
	_ = fs.Parse(os.Args[2:])
	want.NAPI = *napi
	if want.Held < 0 {
		want.Held = want.Queues
	}

	check := nodecheck.Present
	if os.Args[1] == "gone" {
		check = nodecheck.Gone
	}
	if err := check(*netns, want); err != nil {
		fmt.Fprintf(os.Stderr, "napitap-verify %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
	fmt.Printf("napitap-verify %s: ok (%s/%s in %s)\n", os.Args[1], want.ContainerID, want.IfName, *netns)
}
