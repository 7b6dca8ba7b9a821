// Command pause is the sandbox ("pause") container of the CRI and node e2e
// suites: PID 1 of each pod sandbox (and the node suite's one container
// image). It waits for SIGTERM or SIGINT and reaps any child
// re-parented to it meanwhile, as Kubernetes' pause does. Built static
// (CGO_ENABLED=0) and packed into a docker-archive image by the test.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
