// Command tunstorm attaches and closes one queue of a tap by name, again
// and again, while another thread sends its own attaching thread SIGURG
// without pause: a runtime that opens a tap by name, as hard as signals
// can hit it. Run in a container under the vmm profile, its TUNSETIFFs go
// to napitapd's agent through runc's filter, which has no
// WAIT_KILLABLE_RECV. It prints one JSON line: how many attaches got
// which errno, how many had IFF_NAPI, how many signals were sent.
//
//	tunstorm TAP ATTEMPTS
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

type result struct {
	Attempts int            `json:"attempts"`
	Errnos   map[string]int `json:"errnos"` // "0" for success
	NAPI     int            `json:"napi"`
	Signals  int64          `json:"signals"`
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: tunstorm TAP ATTEMPTS")
		os.Exit(2)
	}
	tap := os.Args[1]
	attempts, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	runtime.LockOSThread()
	pid, tid := unix.Getpid(), unix.Gettid()
	var signals atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			// SIGURG: Go's preemption signal, handled with SA_RESTART.
			if unix.Tgkill(pid, tid, unix.SIGURG) != nil {
				return
			}
			signals.Add(1)
			time.Sleep(20 * time.Microsecond)
		}
	}()
	res := result{Attempts: attempts, Errnos: map[string]int{}}
	for range attempts {
		errno, flags := attach(tap)
		res.Errnos[strconv.Itoa(int(errno))]++
		if errno == 0 && flags&unix.IFF_NAPI != 0 {
			res.NAPI++
		}
	}
	close(stop)
	res.Signals = signals.Load()
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

// attach opens one queue as QEMU does, reads its flags back and closes it.
func attach(tap string) (unix.Errno, uint16) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return errnoOf(err), 0
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(tap)
	if err != nil {
		return unix.EINVAL, 0
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return errnoOf(err), 0
	}
	got, _ := unix.NewIfreq("")
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, got); err != nil {
		return errnoOf(err), 0
	}
	return 0, got.Uint16()
}

func errnoOf(err error) unix.Errno {
	if e, ok := err.(unix.Errno); ok {
		return e
	}
	return unix.EIO
}
