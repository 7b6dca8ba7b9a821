package launch

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/seccompagent"
)

// VMReady is the line a VM opener prints once it holds all its queues,
// each attached with NAPI: what `napitap-bench capacity` times.
type VMReady struct {
	// At is when the last queue was found attached with NAPI, in Unix
	// nanoseconds: the bench reads the clock of the same machine.
	At int64 `json:"at"`
	// TUNSETIFF is how long each queue's TUNSETIFF took, in the order
	// opened (open by name only; under a listener napitapd's agent serves,
	// each is intercepted).
	TUNSETIFF []time.Duration `json:"tunsetiff,omitempty"`
	Queues    int             `json:"queues"`
}

// VM is a VMM's queue handling and nothing else, so that a bench can run
// a hundred of them on two CPUs:
//
//	vm open TAP N          open N queues of TAP by name, as QEMU's ifname=TAP,queues=N does
//	vm runc SOCKET TAP N   the same under a seccomp listener handed to SOCKET first, as runc
//	                       does for a container whose profile names SOCKET as listenerPath
//	vm plain TAP N         the same as open, on a tap no agent serves (the reference plugin's)
//	vm fds N               take N queues as fds 3, 4, ..., as QEMU's fds= does (napitapctl exec)
//
// All but plain check that every queue is attached with IFF_NAPI; each
// prints a VMReady line on stdout, then holds the queues until stdin ends.
func VM(args []string, stdin io.Reader, stdout io.Writer) error {
	var queues []int
	var ready VMReady
	napi := len(args) == 0 || args[0] != "plain"
	if len(args) == 4 && args[0] == "runc" {
		if err := handListenerOver(args[1]); err != nil {
			return err
		}
		args = append([]string{"open"}, args[2:]...)
	}
	switch {
	case len(args) == 3 && (args[0] == "open" || args[0] == "plain"):
		n, err := queueCount(args[2])
		if err != nil {
			return err
		}
		for i := range n {
			fd, took, err := openByName(args[1])
			if err != nil {
				closeFDs(queues)
				return fmt.Errorf("tap %s: queue %d of %d: %w", args[1], i+1, n, err)
			}
			queues = append(queues, fd)
			ready.TUNSETIFF = append(ready.TUNSETIFF, took)
		}
	case len(args) == 2 && args[0] == "fds":
		n, err := queueCount(args[1])
		if err != nil {
			return err
		}
		for i := range n {
			queues = append(queues, 3+i)
		}
	default:
		return errors.New("usage: vm open TAP QUEUES | vm runc SOCKET TAP QUEUES | vm plain TAP QUEUES | vm fds QUEUES")
	}
	defer closeFDs(queues)
	for i, fd := range queues {
		flags, err := queueFlags(fd)
		if err != nil {
			return fmt.Errorf("queue %d (fd %d): %w", i+1, fd, err)
		}
		if napi && flags&unix.IFF_NAPI == 0 {
			return fmt.Errorf("queue %d (fd %d) is attached without IFF_NAPI (flags 0x%x)", i+1, fd, flags)
		}
	}
	ready.At, ready.Queues = time.Now().UnixNano(), len(queues)
	if err := json.NewEncoder(stdout).Encode(&ready); err != nil {
		return err
	}
	// A VM runs until the runtime stops it: here, until the bench closes
	// stdin.
	_, err := io.Copy(io.Discard, stdin)
	return err
}

// handListenerOver does on this thread what runc does for a container
// whose seccomp profile names a listenerPath, in its init before the
// container's process runs: install the filter, send the listener to the
// agent (and, unlike runc, wait for its ack: SendListener). The VM's
// TUNSETIFFs then come from this thread, so on Kubernetes no process
// stands between the VMM and the agent; napitapctl launch is the by-hand
// path and costs a process more.
func handListenerOver(socket string) error {
	// Never unlocked: the filter is on this thread only.
	runtime.LockOSThread()
	listener, err := seccompagent.InstallFilter()
	if err != nil {
		return err
	}
	defer unix.Close(listener)
	pid := os.Getpid()
	id := "napitap-bench-" + strconv.Itoa(pid)
	return seccompagent.SendListener(socket, listener, &specs.ContainerProcessState{
		Version: specs.Version,
		Fds:     []string{specs.SeccompFdName},
		Pid:     pid,
		State:   specs.State{Version: specs.Version, ID: id, Status: specs.StateCreating, Pid: pid},
	})
}

func queueCount(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 256 {
		return 0, fmt.Errorf("queue count %q: want 1..256", s)
	}
	return n, nil
}

// openByName opens one queue as QEMU does for ifname=TAP,queues=N: no
// IFF_NAPI asked for, which napitapd's agent adds to an intercepted call.
func openByName(tap string) (int, time.Duration, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(tap)
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	start := time.Now()
	err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	took := time.Since(start)
	if err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("TUNSETIFF: %w", err)
	}
	return fd, took, nil
}

func queueFlags(fd int) (uint16, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return 0, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return 0, fmt.Errorf("TUNGETIFF: %w", err)
	}
	return ifr.Uint16(), nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Main is napitap-bench-launcher's: `vm ...` runs a VM opener, no
// arguments serves batches on stdin.
func Main(args []string) error {
	if len(args) > 0 && args[0] == "vm" {
		return VM(args[1:], os.Stdin, os.Stdout)
	}
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q: want none (serve batches on stdin) or vm ...", args)
	}
	return Serve(os.Stdin, os.Stdout)
}
