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
)

func main() {
	socket := flag.String("socket", handoff.DefaultSocket, "unix socket to serve")
	mode := flag.String("socket-mode", "0660", "permission bits of the socket")
	group := flag.String("socket-group", "", "group (name or gid) that owns the socket; runtimes that are not root need it")
	stateDir := flag.String("state-dir", handoff.DefaultStateDir, "where each attachment's state file lives")
	sweep := flag.Duration("sweep-interval", time.Minute, "how often to drop attachments whose netns or tap is gone")
	var limits handoff.Limits
	flag.IntVar(&limits.MaxConns, "max-conns", handoff.DefaultMaxConns, "connections served at once; more are closed at once")
	flag.IntVar(&limits.MaxConnsPerUID, "max-conns-per-uid", handoff.DefaultMaxConnsPerUID, "connections one uid other than root may hold at once")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(logger, *socket, *mode, *group, *stateDir, *sweep, limits); err != nil {
		logger.Error("napitapd", "err", err)
		os.Exit(1)
	}
}

func run(logger *slog.Logger, socket, modeText, group, stateDir string, sweep time.Duration, limits handoff.Limits) error {
	mode, err := strconv.ParseUint(modeText, 8, 32)
	if err != nil {
		return fmt.Errorf("--socket-mode %q: %w", modeText, err)
	}
	if limits.MaxConns <= 0 || limits.MaxConnsPerUID <= 0 {
		return fmt.Errorf("--max-conns %d, --max-conns-per-uid %d: want positive numbers", limits.MaxConns, limits.MaxConnsPerUID)
	}
	if err := limits.Validate(); err != nil {
		return fmt.Errorf("--max-conns, --max-conns-per-uid: %w", err)
	}
	gid, err := lookupGroup(group)
	if err != nil {
		return err
	}
	srv, err := handoff.NewServer(stateDir, logger)
	if err != nil {
		return err
	}
	srv.Limits = limits
	l, err := handoff.Listen(socket, os.FileMode(mode), gid)
	if err != nil {
		return err
	}
	logger.Info("serving", "socket", socket, "state", stateDir, "maxConns", limits.MaxConns, "maxConnsPerUID", limits.MaxConnsPerUID)

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
