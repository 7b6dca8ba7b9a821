package testguest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestServeRejectsFilesWithoutDeadlines(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "queue")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	g := &Guest{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, IP: net.IPv4(10, 99, 0, 2)}
	err = g.Serve(context.Background(), []*os.File{f})
	if !errors.Is(err, os.ErrNoDeadline) {
		t.Fatalf("Serve on a regular file = %v, want an error wrapping os.ErrNoDeadline", err)
	}
}

func TestGuestAnswersARPUDPAndICMP(t *testing.T) {
	requireRoot(t)

	tests := []struct {
		name       string
		vnetHdrLen int
	}{
		{name: "tap without virtio-net header", vnetHdrLen: 0},
		{name: "tap with a 12-byte virtio-net header", vnetHdrLen: 12},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const tapName = "guest0"
			netns := newNetNS(t, "napitap-guest-")
			queues := createTap(t, netns, tapName, tt.vnetHdrLen, 2)

			g := &Guest{
				MAC:        net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02},
				IP:         net.IPv4(10, 99, 0, 2),
				VnetHdrLen: tt.vnetHdrLen,
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- g.Serve(ctx, queues) }()
			var (
				served   bool
				serveErr error
			)
			// wait reports whether Serve has returned within d.
			wait := func(d time.Duration) bool {
				if !served {
					select {
					case serveErr = <-errc:
						served = true
					case <-time.After(d):
					}
				}
				return served
			}
			// Registered after createTap's cleanups, so Serve is gone
			// before the queues close.
			t.Cleanup(func() {
				cancel()
				if !wait(5 * time.Second) {
					t.Error("Serve still running 5s after cancel")
				}
			})

			err := netns.Do(func(ns.NetNS) error {
				if err := udpEcho(g.IP); err != nil {
					return err
				}
				return icmpEcho(g.IP)
			})
			if err != nil {
				if wait(0) {
					t.Errorf("Serve returned early: %v", serveErr)
				}
				t.Fatalf("in netns %s: %v (guest stats %+v)", netns.Path(), err, g.Stats())
			}

			cancel()
			if !wait(2 * time.Second) {
				t.Fatal("Serve did not return within 2s of cancel")
			}
			if serveErr != nil {
				t.Fatalf("Serve: %v", serveErr)
			}
			st := g.Stats()
			t.Logf("stats: %+v", st)
			if st.ARPReplies < 1 || st.UDPEchoes < 1 || st.ICMPEchoes < 1 {
				t.Errorf("stats %+v: want at least one ARP reply, UDP echo and ICMP echo", st)
			}
		})
	}
}

// udpEcho sends a datagram to ip:9999 from the current netns and expects
// it back from there. The kernel queues the first datagram until ARP
// resolves, and drops datagrams with a bad UDP checksum, so an echo proves
// ARP, the echo and its checksums.
func udpEcho(ip net.IP) error {
	conn, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: ip, Port: 9999})
	if err != nil {
		return err
	}
	defer conn.Close()
	msg := []byte("napitap testguest echo")
	buf := make([]byte, 1500)
	// Retry in case a datagram waiting for ARP was dropped.
	for try := 0; try < 3; try++ {
		if _, err := conn.Write(msg); err != nil {
			return fmt.Errorf("sending UDP to %v: %w", conn.RemoteAddr(), err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, err := conn.Read(buf)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return fmt.Errorf("reading UDP echo from %v: %w", conn.RemoteAddr(), err)
		}
		if !bytes.Equal(buf[:n], msg) {
			return fmt.Errorf("UDP echo from %v: got %q, want %q", conn.RemoteAddr(), buf[:n], msg)
		}
		return nil
	}
	return fmt.Errorf("no UDP echo from %v", conn.RemoteAddr())
}

// icmpEcho pings ip once over a raw socket.
func icmpEcho(ip net.IP) error {
	conn, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return err
	}
	defer conn.Close()
	req := []byte{8, 0, 0, 0, 0x12, 0x34, 0, 1, 'p', 'i', 'n', 'g'}
	binary.BigEndian.PutUint16(req[2:], checksum(req, 0))
	if _, err := conn.WriteTo(req, &net.IPAddr{IP: ip}); err != nil {
		return fmt.Errorf("sending ICMP echo request to %v: %w", ip, err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("reading ICMP echo reply from %v: %w", ip, err)
		}
		// The IPv4 header is already stripped.
		rep := buf[:n]
		if !from.(*net.IPAddr).IP.Equal(ip) || len(rep) != len(req) || rep[0] != 0 {
			continue
		}
		if checksum(rep, 0) != 0 || !bytes.Equal(rep[4:], req[4:]) {
			return fmt.Errorf("bad ICMP echo reply from %v: % x", ip, rep)
		}
		return nil
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

// createTap creates the multiqueue tap name in netns with nQueues queues
// opened non-blocking, so that os.NewFile hands them to Go's poller and
// they take deadlines, brings it up with 10.99.0.1/24, and closes the
// queues when the test ends; the tap is not persistent and goes with them.
func createTap(t *testing.T, netns ns.NetNS, name string, vnetHdrLen, nQueues int) []*os.File {
	t.Helper()
	flags := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_MULTI_QUEUE)
	if vnetHdrLen > 0 {
		flags |= unix.IFF_VNET_HDR
	}
	var queues []*os.File
	t.Cleanup(func() {
		for _, q := range queues {
			q.Close()
		}
	})
	err := netns.Do(func(ns.NetNS) error {
		for i := 0; i < nQueues; i++ {
			// The tap is created in the netns of whoever opened
			// /dev/net/tun, so the open must happen in here.
			fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
			if err != nil {
				return err
			}
			ifr, err := unix.NewIfreq(name)
			if err != nil {
				unix.Close(fd)
				return err
			}
			ifr.SetUint16(flags)
			if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
				unix.Close(fd)
				return fmt.Errorf("TUNSETIFF queue %d: %w", i, err)
			}
			// Only now: os.NewFile registers the fd with epoll, and an
			// unattached tun fd polls as EPOLLERR, which Go's poller
			// remembers as "not pollable" for good.
			queues = append(queues, os.NewFile(uintptr(fd), fmt.Sprintf("%s queue %d", name, i)))
		}
		if vnetHdrLen > 0 {
			fd, err := queues[0].SyscallConn()
			if err != nil {
				return err
			}
			var ioctlErr error
			if err := fd.Control(func(fd uintptr) {
				ioctlErr = unix.IoctlSetPointerInt(int(fd), unix.TUNSETVNETHDRSZ, vnetHdrLen)
			}); err != nil {
				return err
			}
			if ioctlErr != nil {
				return fmt.Errorf("TUNSETVNETHDRSZ: %w", ioctlErr)
			}
		}
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		addr, err := netlink.ParseAddr("10.99.0.1/24")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(link, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	})
	if err != nil {
		t.Fatalf("tap %q in netns %s: %v", name, netns.Path(), err)
	}
	return queues
}
