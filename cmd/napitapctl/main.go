// napitapctl fetches a tap's NAPI queue fds from napitapd and runs a VMM
// with them, runs a runtime whose by-name tap opens napitapd turns into
// NAPI queues, or lists what napitapd holds.
//
//	napitapctl exec --container ID --ifname net1 -- qemu-system-x86_64 ... -netdev tap,id=n0,fds={fds},vhost=off
//	napitapctl launch -- qemu-system-x86_64 ... -netdev tap,id=n0,ifname=tap1,queues=4
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/napitap/napitap/pkg/buildinfo"
	"github.com/napitap/napitap/pkg/handoff"
)

// verbs is every verb's usage, in the order --help lists them; each is
// written beside its flags, in the verb's own file.
var verbs = []struct{ name, usage string }{
	{"exec", execUsage},
	{"launch", launchUsage},
	{"list", listUsage},
	{"queues", queuesUsage},
	{"node", nodeUsage},
	{"filtered", filteredUsage},
	{"ready", readyUsage},
	{"probe", probeUsage},
	{"seccomp-profile", seccompProfileUsage},
	{"install-plugin", installPluginUsage},
	{"version", versionUsage},
	{"wait", waitUsage},
}

func main() {
	socket := flag.String("socket", handoff.DefaultSocket, "napitapd socket")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Usage = printUsage
	flag.Parse()
	client := &handoff.Client{Socket: *socket}
	if *showVersion {
		fmt.Println(buildinfo.String("napitapctl"))
		return
	}
	if flag.NArg() == 0 {
		usage()
	}
	switch flag.Arg(0) {
	case "install-plugin", "seccomp-profile":
		// They write into host dirs (the CNI bin dir, the kubelet's
		// seccomp dir): a uid-0 process without CAP_SYS_PTRACE must not
		// reach them through /proc/PID/root (docs/threat-model.md).
		notDumpable()
	}
	var err error
	switch flag.Arg(0) {
	case "help":
		switch args := flag.Args()[1:]; {
		case len(args) == 0:
			printUsage()
		case len(args) > 1 || !printVerbUsage(args[0]):
			usageError("help: no verb %q", strings.Join(args, " "))
		}
	case "exec":
		err = execCmd(client, flag.Args()[1:])
	case "launch":
		err = launch(flag.Args()[1:])
	case "list":
		err = list(client, flag.Args()[1:])
	case "queues":
		err = queues(client, flag.Args()[1:])
	case "node":
		err = node(client, flag.Args()[1:])
	case "filtered":
		err = filtered(client, flag.Args()[1:])
	case "probe":
		err = probe(flag.Args()[1:])
	case "ready":
		err = ready(client, flag.Args()[1:])
	case "seccomp-profile":
		err = seccompProfile(flag.Args()[1:])
	case "install-plugin":
		err = installPlugin(flag.Args()[1:])
	case "wait":
		err = wait(flag.Args()[1:])
	case "version":
		err = versions(client, flag.Args()[1:])
	default:
		usageError("unknown command %q", flag.Arg(0))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "napitapctl:", explain(err, client.Socket))
		os.Exit(1)
	}
}
