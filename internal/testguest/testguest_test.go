package testguest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/inet"
	"github.com/napitap/napitap/pkg/tapsetup"
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
	nstest.RequireRoot(t)

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
			netns := nstest.New(t, "guest")
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
	binary.BigEndian.PutUint16(req[2:], inet.Checksum(req, 0))
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
		if inet.Checksum(rep, 0) != 0 || !bytes.Equal(rep[4:], req[4:]) {
			return fmt.Errorf("bad ICMP echo reply from %v: % x", ip, rep)
		}
		return nil
	}
}

// createTap creates the persistent multiqueue tap name in netns with
// nQueues queues, brings it up with 10.99.0.1/24 and returns the queues
// non-blocking, so that os.NewFile hands them to Go's poller and they take
// deadlines. When the test ends the queues are closed and the tap deleted.
func createTap(t *testing.T, netns *nstest.NetNS, name string, vnetHdrLen, nQueues int) []*os.File {
	t.Helper()
	spec := tapsetup.Spec{Name: name, Queues: nQueues, VnetHdrSize: vnetHdrLen,
		Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: vnetHdrLen > 0}}
	var files []*os.File
	netns.Run(t, func() error {
		tap, queues, err := tapsetup.Create(spec)
		if err != nil {
			return err
		}
		// The duplicates keep the queues attached.
		defer tapsetup.CloseQueues(queues)
		// The tap is persistent: the queues go first, then the device,
		// then (nstest's earlier cleanup) the netns.
		t.Cleanup(func() {
			tapsetup.CloseQueues(files)
			if err := netns.Do(func(ns.NetNS) error { return tapsetup.DeleteTap(name, "") }); err != nil {
				t.Errorf("deleting tap %q in netns %s: %v", name, netns.Name, err)
			}
		})
		for i, q := range queues {
			// tapsetup's files block. A non-blocking duplicate of the
			// already attached fd is pollable: an unattached tun fd polls
			// as EPOLLERR, which Go's poller remembers as "not pollable".
			fd, err := unix.Dup(int(q.Fd()))
			if err != nil {
				return err
			}
			if err := unix.SetNonblock(fd, true); err != nil {
				unix.Close(fd)
				return err
			}
			files = append(files, os.NewFile(uintptr(fd), fmt.Sprintf("%s queue %d", name, i)))
		}
		addr, err := netlink.ParseAddr("10.99.0.1/24")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(tap, addr); err != nil {
			return err
		}
		return netlink.LinkSetUp(tap)
	})
	return files
}
