package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/napitap/napitap/pkg/handoff"
)

// usage prints the usage to stderr and exits 2: a command line napitapctl
// cannot run.
func usage() {
	printUsage()
	os.Exit(2)
}

// printUsage is what --help and help print: every verb's usage.
func printUsage() {
	fmt.Fprint(os.Stderr, "usage:\n")
	for _, v := range verbs {
		fmt.Fprint(os.Stderr, v.usage)
	}
	fmt.Fprint(os.Stderr, "  napitapctl help [VERB]\n      This, or one verb's usage (as VERB --help). --socket goes before or after the verb.\n")
}

// printVerbUsage is VERB --help's and help VERB's: that verb's usage alone.
func printVerbUsage(name string) bool {
	for _, v := range verbs {
		if v.name == name {
			fmt.Fprint(os.Stderr, "usage:\n"+v.usage)
			return true
		}
	}
	return false
}

// usageError reports a command line napitapctl cannot run, as usage does,
// but says what is wrong with it.
func usageError(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "napitapctl: "+format+" (napitapctl --help shows the usage)\n", a...)
	os.Exit(2)
}

// subFlags is a subcommand's flag set: --help prints its usage and exits 0,
// before anything connects; a bad flag exits 2.
func subFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	fs.Usage = func() { printVerbUsage(name) }
	return fs
}

// clientFlags is subFlags for a verb that talks to napitapd: --socket, the
// global flag, may come after the verb too, as kubectl's do.
func clientFlags(name string, client *handoff.Client) *flag.FlagSet {
	fs := subFlags(name)
	fs.StringVar(&client.Socket, "socket", client.Socket, "napitapd socket")
	return fs
}
