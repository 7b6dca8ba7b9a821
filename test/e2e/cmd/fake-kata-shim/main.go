// fake-kata-shim stands in for a Kata shim and its VMM in tests, in one of
// two ways:
//
//   - Without FAKE_KATA_SHIM_OPEN, the Go runtime's shim, which makes its
//     own tap in the pod netns rather than open napitap's (DESIGN.md fact
//     23): tap0_kata with 2 queues, exactly as the Go runtime does, through
//     the netlink library's tuntap add (one /dev/net/tun fd and TUNSETIFF
//     per queue, kept for the VMM). It brings the tap up with
//     gro_flush_timeout set; the tap goes when it exits.
//   - With FAKE_KATA_SHIM_OPEN=TAP,QUEUES,FLAGS, runtime-rs's shim or VMM
//     opening a DAN tap that exists by name (DESIGN.md fact 24): QUEUES
//     fds of /dev/net/tun, O_NONBLOCK, each with TUNSETIFF(TAP, FLAGS), FLAGS
//     in hex.
//
// Either way it probes GRO on each queue and prints one line per queue,
// "queue N merged=true|false: ...", or "queue N errno=NAME" for a
// TUNSETIFF that failed, and exits 0. It ignores its arguments (a shim's
// -namespace, -id, start) up to a "--": what follows is a VMM to run with
// the opened queues instead of the probe, as runtime-rs's shim runs QEMU
// (fds 3, 4, ...; "{fds}" in its arguments becomes "3:4:..."), and the
// shim exits with it.
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func main() {
	var err error
	if open := os.Getenv("FAKE_KATA_SHIM_OPEN"); open != "" {
		err = openByName(open)
	} else {
		err = makeOwn("tap0_kata", 2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake-kata-shim:", err)
		os.Exit(1)
	}
}

func makeOwn(name string, queues int) error {
	// As virtcontainers/network_linux.go createLink makes a TuntapEndpoint.
	link := &netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: name},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Queues:    queues,
		Flags:     netlink.TUNTAP_MULTI_QUEUE_DEFAULTS | netlink.TUNTAP_VNET_HDR,
	}
	if err := netlink.LinkAdd(link); err != nil {
		return fmt.Errorf("tuntap add %s: %w", name, err)
	}
	defer func() {
		for _, f := range link.Fds {
			f.Close()
		}
		_ = netlink.LinkDel(link)
	}()
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("tap %s up: %w", name, err)
	}
	timeout := uint64(200_000) // ns: long enough for the probe's burst to merge
	if err := tapsetup.ApplyNAPIKnobs("/proc/self/ns/net", name, tapsetup.NAPIKnobs{GROFlushTimeout: &timeout}); err != nil {
		return err
	}
	return probe(link.Fds)
}

// openByName parses "TAP,QUEUES,FLAGS" and opens the tap so.
func openByName(spec string) error {
	parts := strings.Split(spec, ",")
	if len(parts) != 3 {
		return fmt.Errorf("FAKE_KATA_SHIM_OPEN=%q: want TAP,QUEUES,FLAGS", spec)
	}
	queues, err := strconv.Atoi(parts[1])
	if err != nil {
		return fmt.Errorf("FAKE_KATA_SHIM_OPEN=%q: queues: %w", spec, err)
	}
	flags, err := strconv.ParseUint(parts[2], 16, 16)
	if err != nil {
		return fmt.Errorf("FAKE_KATA_SHIM_OPEN=%q: flags: %w", spec, err)
	}
	var opened []*os.File
	defer func() {
		for _, f := range opened {
			f.Close()
		}
	}()
	for i := range queues {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), fmt.Sprintf("queue %d", i))
		ifr, err := unix.NewIfreq(parts[0])
		if err != nil {
			f.Close()
			return err
		}
		ifr.SetUint16(uint16(flags))
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			f.Close()
			var errno unix.Errno
			if !errors.As(err, &errno) {
				return err
			}
			fmt.Printf("queue %d errno=%s\n", i, unix.ErrnoName(errno))
			return nil
		}
		opened = append(opened, f)
	}
	if i := slices.Index(os.Args, "--"); i >= 0 && i+1 < len(os.Args) {
		return runVMM(os.Args[i+1:], opened)
	}
	return probe(opened)
}

// runVMM runs argv with queues as its fds 3, 4, ... and exits with it.
func runVMM(argv []string, queues []*os.File) error {
	fds := make([]string, len(queues))
	for i := range queues {
		fds[i] = strconv.Itoa(3 + i)
	}
	args := slices.Clone(argv[1:])
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "{fds}", strings.Join(fds, ":"))
	}
	cmd := exec.Command(argv[0], args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = queues
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		os.Exit(exit.ExitCode())
	}
	return err
}

func probe(queues []*os.File) error {
	for i, q := range queues {
		res, err := napiprobe.RunQueue(q, 16, 1000)
		if err != nil {
			return fmt.Errorf("queue %d: %w", i, err)
		}
		fmt.Printf("queue %d merged=%v: %s\n", i, res.Merged(), res)
	}
	return nil
}
