// napitapd is napitap's node daemon: it holds the NAPI queue fds that the
// CNI plugin opened and hands them to the VM runtime that asks for them,
// and, as a seccomp agent, turns a runtime's own by-name open of a napitap
// tap into a NAPI one.
package main

import (
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"strconv"
	"syscall"
	"time"

	"github.com/napitap/napitap/pkg/metrics"

	"github.com/napitap/napitap/pkg/buildinfo"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/daemon"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/supervise"
)

// options are napitapd's flags.
type options struct {
	socket, socketMode, socketGroup string
	stateDir                        string
	sweep, queueScan                time.Duration
	limits                          handoff.Limits
	seccompSocket                   string
	fdstoreSocket                   string
	waitAfterTakeover               bool
	successorWait                   time.Duration
	supervise                       bool
	metricsAddress                  string
}

func main() {
	var o options
	flag.StringVar(&o.socket, "socket", handoff.DefaultSocket, "unix socket to serve")
	flag.StringVar(&o.socketMode, "socket-mode", "0660", "permission bits of the sockets")
	flag.StringVar(&o.socketGroup, "socket-group", "", "group (name or gid) that owns the sockets; runtimes that are not root need it")
	flag.StringVar(&o.stateDir, "state-dir", handoff.DefaultStateDir, "where each attachment's state file lives")
	flag.DurationVar(&o.sweep, "sweep-interval", time.Minute, "how often to drop attachments whose netns or tap is gone")
	flag.DurationVar(&o.queueScan, "queue-scan-interval", 30*time.Second, "how often to read the open queues of napitap's taps from the kernel, to count those a VMM opened without reaching the seccomp agent (napitapd_plain_queues_total{reason=\"not_intercepted\"}) and show each queue's NAPI in napitapctl node; 0: never")
	flag.IntVar(&o.limits.MaxConns, "max-conns", handoff.DefaultMaxConns, "connections served at once to every tenant (any peer but root with napitapd's capabilities, which is never refused) together; more are closed at once")
	flag.IntVar(&o.limits.MaxConnsPerUID, "max-conns-per-uid", handoff.DefaultMaxConnsPerUID, "connections one tenant uid, root's (a pod's) included, may hold at once")
	flag.StringVar(&o.seccompSocket, "seccomp-socket", seccompagent.DefaultSocket, "unix socket for seccomp listeners from runc, crun and napitapctl launch (same mode and group as --socket); empty disables the agent")
	flag.StringVar(&o.fdstoreSocket, "fdstore-socket", "", "socket of the fd holder (napitap-fdstore) that keeps copies of the seccomp listeners, held queues and listening sockets, so that a napitapd killed by SIGKILL, the OOM killer or a liveness probe loses none; one holder per napitapd (the DaemonSet's pod-local sidecar), never shared; empty: no holder")
	flag.BoolVar(&o.waitAfterTakeover, "wait-after-takeover", false, "once a new napitapd has taken everything over, hold nothing and wait for SIGTERM instead of exiting 0 (in a pod: the kubelet restarts a container that exits, and its napitapd would take everything back)")
	flag.DurationVar(&o.successorWait, "successor-wait", 0, "on SIGTERM, serve on for up to this long for a new napitapd to take everything over before stopping (in a DaemonSet: the deleted pod's replacement, which starts while it terminates; keep it under terminationGracePeriodSeconds); 0: stop at once")
	flag.BoolVar(&o.supervise, "supervise", false, "run napitapd as a child process and start it again at once when a signal kills it (SIGKILL, the OOM killer, a crash), so that the kubelet's restart back-off does not keep it down; a child that exits, or is killed more than 5 times a minute, ends this process with its status")
	flag.StringVar(&o.metricsAddress, "metrics-address", "", "host:port to serve Prometheus metrics on, at /metrics (shared with the next napitapd during a takeover); empty: none")
	showVersion := flag.Bool("version", false, "print the version and exit")
	var level slog.Level
	flag.TextVar(&level, "log-level", slog.LevelInfo, "least level logged: debug, info, warn or error")
	flag.Parse()
	if *showVersion {
		fmt.Println(buildinfo.String("napitapd"))
		return
	}

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if o.supervise {
		os.Exit(superviseSelf(logger))
	}
	if err := run(logger, o); err != nil {
		logger.Error("napitapd", "err", err)
		os.Exit(1)
	}
}

func run(logger *slog.Logger, o options) error {
	// It holds every VM's queues and seccomp listeners: its /proc entries
	// are for CAP_SYS_PTRACE alone, whatever capabilities it runs with.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE, 0): %w", err)
	}
	// Before any socket exists: a SIGTERM during startup still gets the
	// orderly stop that removes them.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	mode, err := strconv.ParseUint(o.socketMode, 8, 32)
	if err != nil {
		return fmt.Errorf("--socket-mode %q: %w", o.socketMode, err)
	}
	if o.limits.MaxConns <= 0 || o.limits.MaxConnsPerUID <= 0 {
		return fmt.Errorf("--max-conns %d, --max-conns-per-uid %d: want positive numbers", o.limits.MaxConns, o.limits.MaxConnsPerUID)
	}
	if o.successorWait < 0 {
		return fmt.Errorf("--successor-wait %v: want 0 or more", o.successorWait)
	}
	if err := o.limits.Validate(); err != nil {
		return fmt.Errorf("--max-conns, --max-conns-per-uid: %w", err)
	}
	gid, err := lookupGroup(o.socketGroup)
	if err != nil {
		return err
	}

	var m *metrics.Metrics
	if o.metricsAddress != "" {
		m = metrics.New()
		if err := m.Serve(o.metricsAddress, logger); err != nil {
			return fmt.Errorf("--metrics-address: %w", err)
		}
	}
	return daemon.Run(logger, daemon.Config{
		Socket: o.socket, SeccompSocket: o.seccompSocket, StateDir: o.stateDir,
		SocketMode: os.FileMode(mode), SocketGID: gid, Sweep: o.sweep, Limits: o.limits,
		FDStore: o.fdstoreSocket, WaitAfterTakeover: o.waitAfterTakeover, SuccessorWait: o.successorWait,
		Metrics: m, QueueScan: o.queueScan,
	}, stop)
}

// superviseSelf runs this napitapd again, with the same flags but
// --supervise, as a supervised child (pkg/supervise).
func superviseSelf(logger *slog.Logger) int {
	// It holds nothing, but is a root process with napitapd's capabilities.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		logger.Error("napitapd: prctl(PR_SET_DUMPABLE, 0)", "err", err)
		return 1
	}
	// Its own path, not /proc/self/exe: the child's name is then
	// napitapd's, for ps, pgrep and the operator.
	self, err := os.Executable()
	if err != nil {
		logger.Error("napitapd: its own path", "err", err)
		return 1
	}
	code, err := supervise.Run(logger, supervise.DefaultPolicy, func() *exec.Cmd {
		cmd := exec.Command(self, append(os.Args[1:], "--supervise=false")...)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		// A panic then kills it with SIGABRT, which the supervisor
		// restarts, where an exit would end the container.
		cmd.Env = append(os.Environ(), "GOTRACEBACK=crash")
		return cmd
	})
	if err != nil {
		logger.Error("napitapd", "err", err)
	}
	return code
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
