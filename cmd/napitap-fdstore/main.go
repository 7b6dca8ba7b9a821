// napitap-fdstore holds the fds napitapd gives it, so that a napitapd that
// crashes and restarts gets them back (see package fdstore). It runs as a
// native sidecar in napitapd's pod, the socket in an emptyDir they share.
//
//	napitap-fdstore [--socket PATH] [--max-files N] [--plain-queue-after D]
//
// After D with no napitapd connected, a VMM's TUNSETIFF waiting under
// napitap's filter goes on in the kernel (package plainqueue). SIGTERM or SIGINT closes every fd it holds and exits 0. Go raises the
// soft RLIMIT_NOFILE to the hard one at start, which the fds need.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/napitap/napitap/pkg/buildinfo"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/fdstore"
	"github.com/napitap/napitap/pkg/plainqueue"
)

func main() {
	// First: it holds every listener and queue of napitapd's, and runs
	// with no capability, so a dumpable holder would be open to any uid-0
	// process through /proc/PID/fd and /proc/PID/root (docs/threat-model.md).
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		slog.Error("napitap-fdstore: prctl(PR_SET_DUMPABLE, 0)", "err", err)
		os.Exit(1)
	}
	socket := flag.String("socket", fdstore.DefaultSocket, "the unix socket napitapd connects to")
	maxFiles := flag.Int("max-files", fdstore.DefaultMaxFiles, "the most fds held, in all entries")
	plainAfter := flag.Duration("plain-queue-after", plainqueue.DefaultAfter,
		"with no napitapd for this long, a VMM's waiting TUNSETIFF opens a queue without NAPI; 0: it waits for napitapd")
	showVersion := flag.Bool("version", false, "print the version and exit")
	var level slog.Level
	flag.TextVar(&level, "log-level", slog.LevelInfo, "least level logged: debug, info, warn or error")
	flag.Parse()
	if *showVersion {
		fmt.Println(buildinfo.String("napitap-fdstore"))
		return
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if flag.NArg() > 0 || *maxFiles < 1 || *plainAfter < 0 {
		flag.Usage()
		os.Exit(2)
	}

	l, err := fdstore.Listen(*socket)
	if err != nil {
		log.Error("napitap-fdstore: cannot listen", "err", err)
		os.Exit(1)
	}
	h := fdstore.NewHolder(log)
	h.MaxFiles = *maxFiles
	if *plainAfter > 0 {
		ctx, stop := context.WithCancel(context.Background())
		defer stop()
		go plainqueue.Run(ctx, h, *plainAfter, log)
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		log.Info("napitap-fdstore: stopping: closing every fd held", "signal", (<-sigs).String())
		l.Close()
	}()

	log.Info("napitap-fdstore: holding fds", "version", buildinfo.Version(), "socket", *socket, "max_files", *maxFiles, "plain_queue_after", *plainAfter)
	if err := h.Serve(l); err != nil {
		log.Error("napitap-fdstore: serve", "err", err)
		h.Close()
		os.Exit(1)
	}
	h.Close()
}
