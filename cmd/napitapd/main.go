// napitapd is napitap's node daemon: it holds the NAPI queue fds that the
// CNI plugin opened, and hands them to the VM runtime that asks for them.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
)

func main() {
	socket := flag.String("socket", handoff.DefaultSocket, "unix socket to serve")
	mode := flag.String("socket-mode", "0660", "permission bits of the socket")
	group := flag.String("socket-group", "", "group (name or gid) that owns the socket; runtimes that are not root need it")
	stateDir := flag.String("state-dir", handoff.DefaultStateDir, "where each attachment's state file lives")
	sweep := flag.Duration("sweep-interval", time.Minute, "how often to drop attachments whose netns or tap is gone")
	seccompSocket := flag.String("seccomp-socket", seccompagent.DefaultSocket, "unix socket for seccomp listeners from runc, crun and napitapctl launch (same mode and group as --socket); empty disables the agent")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(logger, *socket, *mode, *group, *stateDir, *sweep, *seccompSocket); err != nil {
		logger.Error("napitapd", "err", err)
		os.Exit(1)
	}
}

func run(logger *slog.Logger, socket, modeText, group, stateDir string, sweep time.Duration, seccompSocket string) error {
	mode, err := strconv.ParseUint(modeText, 8, 32)
	if err != nil {
		return fmt.Errorf("--socket-mode %q: %w", modeText, err)
	}
	gid, err := lookupGroup(group)
	if err != nil {
		return err
	}
	srv, err := handoff.NewServer(stateDir, logger)
	if err != nil {
		return err
	}
	l, err := handoff.Listen(socket, os.FileMode(mode), gid)
	if err != nil {
		return err
	}
	if seccompSocket != "" {
		stopAgent, err := seccompagent.Start(seccompSocket, os.FileMode(mode), gid, agentRegistry(srv), logger)
		if err != nil {
			l.Close()
			return err
		}
		defer stopAgent()
	}
	logger.Info("serving", "socket", socket, "state", stateDir, "seccomp-socket", seccompSocket)

	go func() {
		for range time.Tick(sweep) {
			if n := srv.Sweep(); n > 0 {
				logger.Info("swept attachments whose pod is gone", "count", n)
			}
		}
	}()
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		l.Close()
	}()
	err = srv.Serve(l)
	srv.Close()
	os.Remove(socket)
	return err
}

func lookupGroup(group string) (int, error) {
	if group == "" {
		return -1, nil
	}
	if gid, err := strconv.Atoi(group); err == nil {
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("--socket-group %q: %w", group, err)
	}
	return strconv.Atoi(g.Gid)
}
