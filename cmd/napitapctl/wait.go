package main

import (
	"os"
	"os/signal"
	"syscall"
)

// waitUsage is what --help and help wait print (main.go's verbs).
const waitUsage = `  napitapctl wait
      Do nothing until SIGTERM or SIGINT, then exit 0: the container of a
      pod that keeps its network while a VMM is started in it by hand
      (kubectl exec POD -- napitapctl exec -- qemu-system-x86_64 ...).
`

// wait blocks until the container runtime stops the container. napitap's
// image has no shell and no sleep (FROM scratch).
func wait(args []string) error {
	fs := subFlags("wait")
	_ = fs.Parse(args)
	if fs.NArg() > 0 {
		usageError("wait takes no arguments, got %q", fs.Args())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}
