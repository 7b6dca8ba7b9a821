package datapath

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/utils/sysctl"
	"github.com/prometheus/procfs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// podNetns is the pod network namespace of a benchmark: a named netns
// "napitap-dp-<random>" that lives as long as the benchmark.
type podNetns struct{ *nstest.NetNS }

func newPodNetns() (*podNetns, error) {
	n, err := nstest.Add("napitap-dp-" + nstest.RandomSuffix())
	if err != nil {
		return nil, err
	}
	p := &podNetns{n}
	err = p.do(func() error {
		lo, err := netlinksafe.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		// Taps inherit "default"; "all" is or-ed with the device's value.
		// /proc/sys/net is the netns of the calling thread, hence do.
		for _, k := range []string{"net/ipv4/conf/all/rp_filter", "net/ipv4/conf/default/rp_filter"} {
			if _, err := sysctl.Sysctl(k, "0"); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = p.close()
		return nil, fmt.Errorf("netns %s: %w", n.Name, err)
	}
	return p, nil
}

// do runs fn on a thread inside the netns.
func (p *podNetns) do(fn func() error) error {
	return p.Do(func(ns.NetNS) error { return fn() })
}

func (p *podNetns) close() error {
	if p == nil {
		return nil
	}
	return p.Delete()
}

// linkGone reports whether no link called name is left in the netns.
func (p *podNetns) linkGone(name string) (bool, error) {
	gone := false
	err := p.do(func() error {
		_, err := netlinksafe.LinkByName(name)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			gone = true
			return nil
		}
		return err
	})
	return gone, err
}

// netstat reads /proc/net/snmp and /proc/net/netstat of the netns as
// "Group.Counter" -> value. /proc/thread-self follows the calling thread's
// netns, /proc/self that of the main thread. "Tap.*" are the tap's
// /proc/net/dev counters (frames it took from its queues, transmitted and
// dropped on transmit) and "Qdisc.*" its root qdisc's drops and requeues,
// read right after the others so that the counters describe the same
// moment; qdisc is the root qdisc's kind, with its children's.
func (p *podNetns) netstat(tap string) (m map[string]uint64, qdisc string, err error) {
	m = map[string]uint64{}
	err = p.do(func() error {
		for _, f := range []string{"/proc/thread-self/net/snmp", "/proc/thread-self/net/netstat"} {
			raw, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			parseNetstat(raw, m)
		}
		fs, err := procfs.NewFS("/proc/thread-self")
		if err != nil {
			return err
		}
		devs, err := fs.NetDev()
		if err != nil {
			return err
		}
		d, ok := devs[tap]
		if !ok {
			return fmt.Errorf("/proc/thread-self/net/dev: no line for %s", tap)
		}
		m["Tap.RxPackets"], m["Tap.TxPackets"], m["Tap.TxDropped"] = d.RxPackets, d.TxPackets, d.TxDropped
		qdisc, err = qdiscCounters(tap, m)
		return err
	})
	return m, qdisc, err
}

// qdiscCounters adds the drops and requeues of tap's root qdisc (mq sums
// its children's) to m and names it. It runs in the tap's netns.
func qdiscCounters(tap string, m map[string]uint64) (string, error) {
	link, err := netlinksafe.LinkByName(tap)
	if err != nil {
		return "", err
	}
	qs, err := netlinksafe.QdiscList(link)
	if err != nil {
		return "", fmt.Errorf("qdiscs of %s: %w", tap, err)
	}
	var root netlink.Qdisc
	for _, q := range qs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT {
			root = q
		}
	}
	if root == nil {
		return "", fmt.Errorf("tap %s has no root qdisc", tap)
	}
	kind := root.Type()
	if st := root.Attrs().Statistics; st != nil && st.Queue != nil {
		m["Qdisc.Drops"], m["Qdisc.Requeues"] = uint64(st.Queue.Drops), uint64(st.Queue.Requeues)
	}
	// mq's children hang off its handle, which is 0: match on the major.
	major := root.Attrs().Handle & 0xffff0000
	for _, q := range qs {
		if par := q.Attrs().Parent; q != root && par != netlink.HANDLE_INGRESS && par&0xffff0000 == major {
			return kind + "/" + q.Type(), nil
		}
	}
	return kind, nil
}

// parseNetstat parses the pairs of "Group: names" / "Group: values" lines.
func parseNetstat(raw []byte, m map[string]uint64) {
	var header []string
	sc := bufio.NewScanner(bytes.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		if header == nil || header[0] != f[0] {
			header = f
			continue
		}
		group := strings.TrimSuffix(f[0], ":")
		for i := 1; i < len(f) && i < len(header); i++ {
			if v, err := strconv.ParseInt(f[i], 10, 64); err == nil {
				m[group+"."+header[i]] = uint64(v)
			}
		}
		header = nil
	}
}

// podTap is one fresh tap of one benchmark cell, with its queues open.
type podTap struct {
	ns     *podNetns
	name   string
	mac    net.HardwareAddr
	queues []*os.File
	fds    []int
}

// createTap makes a fresh tap in the pod netns, opens its queues with the
// flags of mode, applies mode's NAPI knobs while every queue is attached
// (DESIGN.md fact 9: threaded is only ever switched on, never off, and
// only then), sets mode's root qdisc while it is down, and, with
// addressed, gives it the pod address and a permanent neighbour entry for
// the writer.
func (p *podNetns) createTap(name string, mode Mode, queues int, addressed bool) (t *podTap, err error) {
	flags := tapsetup.QueueFlags{MultiQueue: queues > 1, VnetHdr: true, NAPI: mode.NAPI, NAPIFrags: mode.Frags}
	if err := tapsetup.CheckFeatures(flags); err != nil {
		return nil, err
	}
	t = &podTap{ns: p, name: name}
	err = p.do(func() error {
		link, qs, err := tapsetup.Create(tapsetup.Spec{Name: name, Queues: queues, Flags: flags, VnetHdrSize: vnetHdrLen})
		if err != nil {
			return err
		}
		t.queues = qs
		t.mac = slices.Clone(link.Attrs().HardwareAddr)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", p.Name, err)
	}
	defer func() {
		if err != nil {
			if derr := t.destroy(); derr != nil {
				err = fmt.Errorf("%w (and cleaning up: %v)", err, derr)
			}
			t = nil
		}
	}()
	// Every queue is attached now and stays so until destroy closes them.
	if err := tapsetup.ApplyNAPIKnobs(p.Path(), name, mode.knobs()); err != nil {
		return t, fmt.Errorf("tap %q: NAPI knobs: %w", name, err)
	}
	for _, q := range t.queues {
		fd := int(q.Fd())
		if err := unix.SetNonblock(fd, true); err != nil {
			return t, fmt.Errorf("tap %q: O_NONBLOCK: %w", name, err)
		}
		t.fds = append(t.fds, fd)
	}
	err = p.do(func() error {
		for _, kv := range [][2]string{
			{"net/ipv4/conf/" + name + "/rp_filter", "0"},
			// No router solicitations or DAD on the writer's queues.
			{"net/ipv6/conf/" + name + "/disable_ipv6", "1"},
		} {
			if _, err := sysctl.Sysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
		link, err := netlinksafe.LinkByName(name)
		if err != nil {
			return err
		}
		if mode.Qdisc != "" {
			q := &netlink.GenericQdisc{QdiscType: mode.Qdisc,
				QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_ROOT}}
			if err := netlink.QdiscReplace(q); err != nil {
				return fmt.Errorf("root qdisc %s: %w", mode.Qdisc, err)
			}
		}
		if !addressed {
			return netlink.LinkSetUp(link)
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(podIP[:]), Mask: net.CIDRMask(podPrefixLen, 32)}}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("address %s: %w", addr.IPNet, err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set up: %w", err)
		}
		neigh := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
			IP: net.IP(writerIP[:]), HardwareAddr: writerMAC}
		if err := netlink.NeighSet(neigh); err != nil {
			return fmt.Errorf("neighbour %s: %w", neigh.IP, err)
		}
		return nil
	})
	if err != nil {
		return t, fmt.Errorf("tap %q in netns %s: %w", name, p.Name, err)
	}
	return t, nil
}

// destroy closes every queue (never detaching one first: fact 9), deletes
// the tap and checks that it is gone.
func (t *podTap) destroy() error {
	tapsetup.CloseQueues(t.queues)
	t.queues, t.fds = nil, nil
	if err := t.ns.do(func() error { return tapsetup.DeleteTap(t.name, "") }); err != nil {
		return fmt.Errorf("netns %s: %w", t.ns.Name, err)
	}
	gone, err := t.ns.linkGone(t.name)
	if err != nil {
		return err
	}
	if !gone {
		return fmt.Errorf("tap %q still exists in netns %s after delete", t.name, t.ns.Name)
	}
	return nil
}
