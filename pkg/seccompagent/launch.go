package seccompagent

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/unixsock"
)

// ackTimeout bounds the wait for the agent's answer.
const ackTimeout = 10 * time.Second

// launchMetadata marks a listener napitapctl launch sends, whose taps
// the launched processes create get NAPI as well (owntaps.go). A sender
// that claims it falsely gains nothing: IFF_NAPI needs no privilege, and
// the agent acts in the caller's credentials.
const launchMetadata = "napitapctl launch"

// Launch runs argv (argv[0] looked up in PATH) with env under Filter, its
// TUNSETIFFs served by the agent at socket: it installs the filter on this
// thread, hands the listener over, waits for the agent's ack and execs
// from the same thread. It returns only on failure, and then this thread
// (locked for good) may already carry the filter: exit.
func Launch(socket string, argv, env []string) error {
	return launch(socket, argv, env, filterFlags)
}

func launch(socket string, argv, env []string, flags uintptr) error {
	if len(argv) == 0 {
		return fmt.Errorf("launch: no command")
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	// Never unlocked: the filter is on this thread, and exec must come
	// from it.
	runtime.LockOSThread()
	listener, err := installFilter(flags)
	if err != nil {
		return fmt.Errorf("launch %s: %w", argv[0], err)
	}
	pid := os.Getpid()
	st := &specs.ContainerProcessState{
		Version:  specs.Version,
		Fds:      []string{specs.SeccompFdName},
		Pid:      pid,
		Metadata: launchMetadata,
		State: specs.State{
			Version: specs.Version, ID: "launch-" + strconv.Itoa(pid), Status: specs.StateCreating, Pid: pid,
			Annotations: map[string]string{"io.napitap.launch.command": path},
		},
	}
	err = SendListener(socket, listener, st)
	// The agent has its own copy now; this one must not reach argv, which
	// could otherwise answer its own notifications.
	unix.Close(listener)
	if err != nil {
		return fmt.Errorf("launch %s: %w", argv[0], err)
	}
	return fmt.Errorf("launch: exec %s: %w", path, syscall.Exec(path, argv, env))
}

// SendListener hands a seccomp listener fd to the agent at socket, in the
// message runc sends, and waits for the agent's ack. A connection the
// agent closed without reading the message, as it does beyond its bound
// on connections at once, is tried again with a growing, jittered pause
// until ackTimeout: a node's VMMs of one uid started together (KubeVirt
// runs every QEMU as 107) come in bursts larger than that bound, which is
// there against idle connections, not against them.
func SendListener(socket string, listener int, st *specs.ContainerProcessState) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(ackTimeout)
	pause := 2 * time.Millisecond
	for {
		err := sendListenerOnce(socket, listener, b, deadline)
		sleep := pause/2 + rand.N(pause)
		if !errors.Is(err, errUnread) || time.Now().Add(sleep).After(deadline) {
			return err
		}
		time.Sleep(sleep)
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// errUnread: the agent closed the connection with the message unread, so
// sending it again cannot hand it the same listener twice. The kernel
// tells: closing a unix socket with data unread gives its peer
// ECONNRESET (EPIPE when the close came before the write); one that read
// the message and died before the ack gives EOF, and is not tried again.
var errUnread = errors.New("closed unread")

func sendListenerOnce(socket string, listener int, msg []byte, deadline time.Time) error {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		err = unixsock.Bare(err)
		if errors.Is(err, syscall.EAGAIN) {
			// The agent's backlog is full (a flood): nothing was sent.
			err = fmt.Errorf("%w (%w)", err, errUnread)
		}
		return fmt.Errorf("seccomp agent at %s: %w", socket, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)
	unread := func(err error) error {
		if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
			return fmt.Errorf("%w (%w)", err, errUnread)
		}
		return err
	}
	if _, _, err := conn.WriteMsgUnix(msg, unix.UnixRights(listener), nil); err != nil {
		return fmt.Errorf("seccomp agent at %s: send: %w", socket, unread(unixsock.Bare(err)))
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return fmt.Errorf("seccomp agent at %s: no ack: %w", socket, unread(unixsock.Bare(err)))
	}
	if line = strings.TrimSuffix(line, "\n"); line != AckOK {
		return fmt.Errorf("seccomp agent at %s: %s", socket, line)
	}
	return nil
}
