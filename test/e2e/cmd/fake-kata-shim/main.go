// fake-kata-shim stands in for the shim of Kata's Go runtime, which makes
// its own tap in the pod netns rather than open napitap's (DESIGN.md fact
// 23): it makes tap0_kata with 2 queues exactly as the Go runtime does,
// through the netlink library's tuntap add, which opens one /dev/net/tun
// fd per queue with TUNSETIFF and keeps them for the VMM. It then brings
// the tap up with gro_flush_timeout set and probes GRO on each queue,
// printing one line per queue, "queue N merged=true|false: ...".
//
//	fake-kata-shim [ARGS...]
//
// It ignores its arguments (a shim's -namespace, -id, start), deletes the
// tap and exits 0 once every queue is probed.
package main

import (
	"fmt"
	"os"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/pkg/napiprobe"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func main() {
	if err := run("tap0_kata", 2); err != nil {
		fmt.Fprintln(os.Stderr, "fake-kata-shim:", err)
		os.Exit(1)
	}
}

func run(name string, queues int) error {
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
	for i, q := range link.Fds {
		res, err := napiprobe.RunQueue(q, 16, 1000)
		if err != nil {
			return fmt.Errorf("queue %d: %w", i, err)
		}
		fmt.Printf("queue %d merged=%v: %s\n", i, res.Merged(), res)
	}
	return nil
}
