package tapsetup_test

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// From include/uapi/linux/netdev.h.
const (
	netdevCmdNAPIGet = 11
	netdevANAPIIfidx = 1
	netdevANAPIID    = 2
	netdevFamilyName = "netdev"
	netdevFamilyVers = 1
)

// From include/uapi/linux/bpf.h.
const (
	xdpPass           = 2
	bpfProgLoadAttrSz = 48 // union bpf_attr up to kern_version
)

// TestNetdevNetlinkCannotNameATapsNAPIs is why the NAPI knobs go through
// sysfs (pkg/tapsetup/sysfs.go): tun adds each queue's NAPI with
// netif_napi_add_tx, which marks it NAPI_STATE_NO_BUSY_POLL and so gives it
// no NAPI ID; the netdev family's napi-get skips NAPIs without one, and its
// napi-set can only name a NAPI by ID. A veth with an XDP program, whose
// NAPIs have IDs, shows that the dump itself works. If this fails on a new
// kernel because the tap's NAPIs are listed, netlink may have become an
// option (napi-set still sets one NAPI, not the device default that queues
// attached later inherit).
func TestNetdevNetlinkCannotNameATapsNAPIs(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "netdev")
	pod.Run(t, func() error {
		family, err := netlink.GenlFamilyGet(netdevFamilyName)
		if err != nil {
			// Before Linux 6.9 (napi-get) netlink cannot do it either.
			t.Logf("no %q generic netlink family here: %v", netdevFamilyName, err)
			return nil
		}
		napis := func(link netlink.Link) []uint32 {
			t.Helper()
			req := nl.NewNetlinkRequest(int(family.ID), unix.NLM_F_DUMP)
			req.AddData(genlHeader{netdevCmdNAPIGet, netdevFamilyVers})
			req.AddData(nl.NewRtAttr(netdevANAPIIfidx, nl.Uint32Attr(uint32(link.Attrs().Index))))
			msgs, err := req.Execute(unix.NETLINK_GENERIC, 0)
			if err != nil {
				t.Fatalf("napi-get dump of %s (ifindex %d): %v", link.Attrs().Name, link.Attrs().Index, err)
			}
			var ids []uint32
			for _, m := range msgs {
				attrs, err := nl.ParseRouteAttr(m[nl.SizeofGenlmsg:])
				if err != nil {
					t.Fatalf("napi-get dump of %s: %v", link.Attrs().Name, err)
				}
				for _, a := range attrs {
					if a.Attr.Type == netdevANAPIID {
						ids = append(ids, native.Uint32(a.Value))
					}
				}
			}
			return ids
		}

		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "napitestv0"}, PeerName: "napitestv1"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		prog := xdpPassProgram(t)
		defer unix.Close(prog)
		for _, name := range []string{"napitestv0", "napitestv1"} {
			link, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(link); err != nil {
				return err
			}
		}
		link, err := netlink.LinkByName("napitestv0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetXdpFd(link, prog); err != nil {
			return err
		}
		if ids := napis(link); len(ids) == 0 {
			t.Errorf("napi-get lists no NAPI of a veth with XDP; the dump does not work as this test assumes")
		} else {
			t.Logf("a veth with XDP: NAPI IDs %v", ids)
		}

		const name = "napitest0"
		tap, queues, err := tapsetup.Create(tapsetup.Spec{Name: name, Queues: 4, Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}})
		if err != nil {
			return err
		}
		defer tapsetup.DeleteTap(name, "")
		defer tapsetup.CloseQueues(queues)
		// While every queue is attached (DESIGN.md fact 9).
		if err := tapsetup.ApplyNAPIKnobs(pod.Path(), name, tapsetup.NAPIKnobs{Threaded: true}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(tap); err != nil {
			return err
		}
		if ids := napis(tap); len(ids) != 0 {
			t.Errorf("napi-get lists NAPIs %v of a tap up with 4 threaded NAPI queues; want none (no NAPI IDs)", ids)
		}
		return nil
	})
}

var native = nl.NativeEndian()

// genlHeader is struct genlmsghdr with its reserved field zeroed:
// nl.Genlmsg serializes the 2 bytes past its 2-byte struct as that field,
// and the kernel refuses a request whose reserved field is not 0 (EINVAL,
// "genlmsghdr.reserved field is not 0"), now and then.
type genlHeader struct{ cmd, version uint8 }

func (h genlHeader) Len() int          { return nl.SizeofGenlmsg }
func (h genlHeader) Serialize() []byte { return []byte{h.cmd, h.version, 0, 0} }

// xdpPassProgram loads "return XDP_PASS".
func xdpPassProgram(t *testing.T) int {
	t.Helper()
	insns := []uint64{
		0xb7 | uint64(xdpPass)<<32, // mov r0, XDP_PASS
		0x95,                       // exit
	}
	license := []byte("GPL\x00")
	var attr [bpfProgLoadAttrSz]byte
	native.PutUint32(attr[0:], unix.BPF_PROG_TYPE_XDP)
	native.PutUint32(attr[4:], uint32(len(insns)))
	native.PutUint64(attr[8:], uint64(uintptr(unsafe.Pointer(&insns[0]))))
	native.PutUint64(attr[16:], uint64(uintptr(unsafe.Pointer(&license[0]))))
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr[0])), uintptr(len(attr)))
	runtime.KeepAlive(insns)
	runtime.KeepAlive(license)
	if errno != 0 {
		t.Fatalf("BPF_PROG_LOAD of an XDP_PASS program: %v", errno)
	}
	return int(fd)
}
