package napiprobe

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestBuildFrameChecksums(t *testing.T) {
	dst := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x2a}
	for _, payloadLen := range []int{1, 2, 999, 1000, 1448} {
		payload := make([]byte, payloadLen)
		for i := range payload {
			payload[i] = byte(i * 7)
		}
		frame := make([]byte, hdrsLen+payloadLen)
		buildFrame(frame, dst, 0x1234, 0xfffffff0, payload)

		if got := net.HardwareAddr(frame[0:6]).String(); got != dst.String() {
			t.Errorf("payload %d: dst MAC %s, want %s", payloadLen, got, dst)
		}
		ip := frame[ethHdrLen : ethHdrLen+ipHdrLen]
		// A correct checksum makes the sum over the whole header 0xffff,
		// i.e. checksum() of it 0.
		if c := checksum(ip, 0); c != 0 {
			t.Errorf("payload %d: IPv4 header does not check: residue %#04x", payloadLen, c)
		}
		if got := int(binary.BigEndian.Uint16(ip[2:])); got != ipHdrLen+tcpHdrLen+payloadLen {
			t.Errorf("payload %d: IPv4 total length %d", payloadLen, got)
		}
		if ip[6]&0x40 == 0 {
			t.Errorf("payload %d: DF not set", payloadLen)
		}
		tcp := frame[ethHdrLen+ipHdrLen:]
		if c := checksum(tcp, pseudoHeaderSum(ip, len(tcp))); c != 0 {
			t.Errorf("payload %d: TCP segment does not check: residue %#04x", payloadLen, c)
		}
		if tcp[13] != 0x10 {
			t.Errorf("payload %d: TCP flags %#02x, want ACK only", payloadLen, tcp[13])
		}
		if !isProbeFrame(frame) {
			t.Errorf("payload %d: frame not recognised as the probe flow", payloadLen)
		}
	}

	// Known vector: the RFC 1071 example bytes sum to 0xddf2.
	if c := checksum([]byte{0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7}, 0); c != ^uint16(0xddf2) {
		t.Errorf("checksum of the RFC 1071 example = %#04x, want %#04x", c, ^uint16(0xddf2))
	}
}

func TestRun(t *testing.T) {
	requireRoot(t)

	const (
		tapName    = "napiprobe0"
		vnetHdrLen = 12
		segments   = 16
		segmentLen = 1000
	)
	tests := []struct {
		name       string
		napi       bool
		wantMerged bool
	}{
		{name: "a queue opened with IFF_NAPI merges segments in GRO", napi: true, wantMerged: true},
		{name: "a queue opened without IFF_NAPI does not merge", napi: false, wantMerged: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			netns := newNetNS(t, "napitap-probe-")
			flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
			if tt.napi {
				flags |= unix.IFF_NAPI
			}
			queue := createTap(t, netns, tapName, flags, vnetHdrLen)
			writeSysfsNet(t, netns.Path(), tapName, "gro_flush_timeout", "200000")

			res, err := Run(netns.Path(), tapName, queue, vnetHdrLen, segments, segmentLen)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("received frame lengths: %v", res.SKBLens)

			total := 0
			for _, l := range res.SKBLens {
				total += l - hdrsLen
			}
			if total != segments*segmentLen {
				t.Errorf("received %d payload bytes, want %d", total, segments*segmentLen)
			}
			if got := res.Merged(); got != tt.wantMerged {
				t.Errorf("Merged() = %v, want %v", got, tt.wantMerged)
			}
		})
	}
}

// requireRoot skips the test without root, except in CI where a missing
// privilege must fail loudly rather than pass silently.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("test needs root (CI=true)")
	}
	t.Skip("test needs root")
}

// newNetNS creates a persistent network namespace named prefix plus a random
// suffix under /run/netns, so leftovers are recognisable, and removes it
// when the test ends. testutils.NewNS cannot take a name; this follows it.
func newNetNS(t *testing.T, prefix string) ns.NetNS {
	t.Helper()
	const runDir = "/var/run/netns" // the prefix testutils.UnmountNS expects
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Shared, like ip-netns does, so the bind mount shows in other mount
	// namespaces too.
	if err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		if err := unix.Mount(runDir, runDir, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatalf("bind mounting %s: %v", runDir, err)
		}
		if err := unix.Mount("", runDir, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			t.Fatalf("making %s shared: %v", runDir, err)
		}
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	nsPath := filepath.Join(runDir, prefix+hex.EncodeToString(b))
	f, err := os.OpenFile(nsPath, os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// Never unlocked: the thread moves to the new netns and must die
		// with the goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		if err = unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		err = unix.Mount(self, nsPath, "none", unix.MS_BIND, "")
	}()
	wg.Wait()
	if err != nil {
		os.Remove(nsPath)
		t.Fatalf("creating netns %s: %v", nsPath, err)
	}
	netns, err := ns.GetNS(nsPath)
	if err != nil {
		unix.Unmount(nsPath, unix.MNT_DETACH)
		os.Remove(nsPath)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netns.Close()
		if err := testutils.UnmountNS(netns); err != nil {
			t.Errorf("removing netns: %v", err)
		}
	})
	return netns
}

// createTap creates the persistent tap name in netns, attaches one queue
// with flags, sets its virtio-net header size and brings it up. The queue
// is closed and the tap deleted when the test ends.
func createTap(t *testing.T, netns ns.NetNS, name string, flags uint16, vnetHdrLen int) *os.File {
	t.Helper()
	var queue *os.File
	err := netns.Do(func(ns.NetNS) error {
		// The tap is created in the netns of whoever opened /dev/net/tun,
		// so the open must happen in here.
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		queue = os.NewFile(uintptr(fd), "/dev/net/tun:"+name)
		features, err := unix.IoctlGetUint32(fd, unix.TUNGETFEATURES)
		if err != nil {
			return fmt.Errorf("TUNGETFEATURES: %w", err)
		}
		// TUNSETIFF silently drops flags it does not know.
		if missing := uint32(flags) &^ features; missing != 0 {
			return fmt.Errorf("kernel lacks tun flags %#x", missing)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			return err
		}
		ifr.SetUint16(flags)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			return fmt.Errorf("TUNSETIFF: %w", err)
		}
		t.Cleanup(func() { deleteTap(t, netns, name) })
		if vnetHdrLen > 0 {
			if err := unix.IoctlSetPointerInt(fd, unix.TUNSETVNETHDRSZ, vnetHdrLen); err != nil {
				return fmt.Errorf("TUNSETVNETHDRSZ: %w", err)
			}
		}
		if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
			return fmt.Errorf("TUNSETPERSIST: %w", err)
		}
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	})
	if queue != nil {
		// Registered after deleteTap, so it runs before it: the queue goes
		// first, then the persistent device, then the netns.
		t.Cleanup(func() { queue.Close() })
	}
	if err != nil {
		t.Fatalf("tap %q in netns %s: %v", name, netns.Path(), err)
	}
	return queue
}

func deleteTap(t *testing.T, netns ns.NetNS, name string) {
	err := netns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(name)
		if _, ok := err.(netlink.LinkNotFoundError); ok {
			return nil // not persistent after all: it left with its queue
		}
		if err != nil {
			return err
		}
		return netlink.LinkDel(link)
	})
	if err != nil {
		t.Errorf("deleting tap %q in netns %s: %v", name, netns.Path(), err)
	}
}

// writeSysfsNet writes /sys/class/net/<dev>/<attr> of a device in another
// netns. Our /sys shows the netns it was mounted from, so this takes a
// thread into the target netns and a mount namespace of its own with a
// fresh sysfs; the thread is never unlocked and dies with its goroutine.
func writeSysfsNet(t *testing.T, nsPath, dev, attr, value string) {
	t.Helper()
	p := filepath.Join("/sys/class/net", dev, attr)
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		errc <- func() error {
			fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("setns: %w", err)
			}
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare mount namespace: %w", err)
			}
			// Keep our mounts from propagating back to the host.
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
				return fmt.Errorf("making / slave: %w", err)
			}
			if err := unix.Mount("sysfs", "/sys", "sysfs", 0, ""); err != nil {
				return fmt.Errorf("mounting sysfs: %w", err)
			}
			if err := os.WriteFile(p, []byte(value), 0); err != nil {
				return err
			}
			got, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if strings.TrimSpace(string(got)) != value {
				return fmt.Errorf("reads back %q", got)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatalf("setting %s to %s in netns %s: %v", p, value, nsPath, err)
	}
}
