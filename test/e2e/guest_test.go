// Package e2e runs napitap end to end: the CNI chain through libcni, the
// napitapd and napitapctl binaries, and a real QEMU guest on the tap.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

var binDir string

func TestMain(m *testing.M) {
	cnitest.MainWithBinaries(m, &binDir, append([]string{
		"github.com/napitap/napitap/plugins/napitap",
		"github.com/napitap/napitap/cmd/napitapd",
		"github.com/napitap/napitap/cmd/napitapctl",
	}, cnitest.ReferencePlugins...)...)
}

// startNapitapd runs the napitapd binary on a socket of the test's own and
// stops it by PID when the test ends.
func startNapitapd(t *testing.T) string {
	return crihelp.StartNapitapd(t, filepath.Join(binDir, "napitapd"), t.TempDir()).Socket
}

// TestGuestTrafficTakesTheNAPIPath boots a real guest on the tap of a pod
// chained after bridge. With the queues napitap opened and napitapd handed
// over, GRO merges the guest's MTU-sized TCP segments in the pod netns:
// those queues carry NAPI. The control, QEMU opening the tap by name, gets
// plain queues, and nothing is ever merged (DESIGN.md facts 1, 6, 10).
func TestGuestTrafficTakesTheNAPIPath(t *testing.T) {
	cases := []struct {
		name       string
		handoff    bool
		wantMerged bool
	}{
		{"a guest on fds fetched from napitapd sends through NAPI", true, true},
		{"a guest whose QEMU opens the tap by ifname gets no NAPI", false, false},
	}
	// Guest-to-peer throughput per case: TCG, so only the ratio means much.
	throughput := map[bool]float64{}
	t.Cleanup(func() {
		if throughput[true] > 0 && throughput[false] > 0 {
			t.Logf("guest -> peer, 8 MiB, guest TSO off: NAPI fds %.0f Mbit/s, tap opened by name %.0f Mbit/s: %.2fx",
				throughput[true], throughput[false], throughput[true]/throughput[false])
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			kernel, initrd, err := vm.Artifacts(cacheDir(t))
			if err != nil {
				t.Fatal(err)
			}
			handoffConf := `{"disabled":true}`
			socket := ""
			if tc.handoff {
				socket = startNapitapd(t)
				handoffConf = fmt.Sprintf(`{"socket":%q,"required":true}`, socket)
			}
			list := e.List("1.1.0", e.BridgePlugin(), `{"type":"napitap","queues":2,"groFlushTimeout":200000,"handoff":`+handoffConf+`}`)
			rt := e.RT("eth0")
			res := e.MustAdd(list, rt)
			deleted := false
			t.Cleanup(func() {
				if !deleted {
					_ = e.Del(list, rt)
				}
			})
			guestIf, guestIP := cnitest.GuestOf(t, res, e.ContainerID)
			gateway := guestIP.Gateway.String()

			const bulk = 8 << 20
			sink := listenInHost(t, e, gateway+":5001", func(c net.Conn) (int64, error) { return io.CopyN(io.Discard, c, bulk) })
			source := listenInHost(t, e, gateway+":5002", func(c net.Conn) (int64, error) {
				return io.CopyN(c, zeroReader{}, bulk)
			})
			capture := startCapture(t, e.Pod.Path(), "tap0")

			script := fmt.Sprintf(`ping -c 3 %[1]s && echo PING-OK
dd if=/dev/zero bs=65536 count=%[2]d 2>/dev/null | nc %[1]s 5001 && echo SENT-OK
echo "RECEIVED $(nc %[1]s 5002 | wc -c)"
echo PEER-PING-WINDOW
sleep 4
`, gateway, bulk/65536)
			guest := vm.Guest{IP: guestIP.Address.String(), Gateway: gateway, MAC: guestIf.Mac, Script: script}
			serial := filepath.Join(t.TempDir(), "serial.log")
			var argv []string
			if tc.handoff {
				netdev := "tap,id=n0,fds={fds},vhost=off"
				argv = append([]string{filepath.Join(binDir, "napitapctl"), "--socket", socket, "exec",
					"--container", e.ContainerID, "--ifname", "eth0", "--"},
					vm.QEMUArgs(kernel, initrd, netdev, 2, guest, serial, true)...)
			} else {
				netdev := "tap,id=n0,ifname=tap0,script=no,downscript=no,vhost=off,queues=2"
				argv = append([]string{"nsenter", "--net=" + e.Pod.Path(), "--"},
					vm.QEMUArgs(kernel, initrd, netdev, 2, guest, serial, true)...)
			}
			v, err := vm.Start(argv, nil, serial)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = v.Stop() })
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := v.WaitFor(ctx, "PEER-PING-WINDOW"); err != nil {
				t.Fatal(err)
			}
			if err := pingFromHost(e, guestIP.Address.IP, 3); err != nil {
				t.Errorf("peer -> guest ping: %v", err)
			}
			if err := v.WaitFor(ctx, "NAPITAP-GUEST-DONE"); err != nil {
				t.Fatal(err)
			}
			out := v.Serial()
			for _, want := range []string{"PING-OK", "SENT-OK", fmt.Sprintf("RECEIVED %d", bulk), "NAPITAP-GUEST-DONE rc=0"} {
				if !strings.Contains(out, want) {
					t.Errorf("guest output lacks %q:\n%s", want, tail(out, 2000))
				}
			}
			throughput[tc.handoff] = sink.mbits()
			t.Logf("guest -> peer %.0f Mbit/s, peer -> guest %.0f Mbit/s", sink.mbits(), source.mbits())
			if n := sink.bytes(); n != bulk {
				t.Errorf("peer received %d bytes from the guest, want %d", n, bulk)
			}
			if n := source.bytes(); n != bulk {
				t.Errorf("peer sent %d bytes to the guest, want %d", n, bulk)
			}
			frames, maxLen := capture.stop()
			merged := maxLen > 1514
			t.Logf("tap0 ingress: %d frames, longest %d bytes", frames, maxLen)
			if merged != tc.wantMerged {
				t.Errorf("GRO merged guest segments: %v (longest frame %d), want %v", merged, maxLen, tc.wantMerged)
			}
			if err := v.Stop(); err != nil {
				t.Logf("stop: %v", err)
			}

			if err := e.Del(list, rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			deleted = true
			if links := e.PodLinks(); len(links) != 1 {
				t.Errorf("pod netns after DEL: %v, want only lo", links)
			}
			if tc.handoff {
				atts, err := (&handoff.Client{Socket: socket}).List()
				if err != nil || len(atts) != 0 {
					t.Errorf("napitapd after DEL: %+v, %v; want nothing", atts, err)
				}
			}
		})
	}
}

// pingFromHost sends ICMP echo requests from the host netns to dst and
// wants every one answered.
func pingFromHost(e *cnitest.Env, dst net.IP, count int) error {
	var conn *icmp.PacketConn
	err := e.Host.Do(func(ns.NetNS) (err error) {
		conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	id := os.Getpid() & 0xffff
	buf := make([]byte, 1500)
	for seq := 1; seq <= count; seq++ {
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("napitap")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := conn.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			return err
		}
		for answered := false; !answered; {
			_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
			n, from, err := conn.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("echo %d: %w", seq, err)
			}
			reply, err := icmp.ParseMessage(1, buf[:n])
			if err != nil || reply.Type != ipv4.ICMPTypeEchoReply || !from.(*net.IPAddr).IP.Equal(dst) {
				continue
			}
			if echo, ok := reply.Body.(*icmp.Echo); ok && echo.ID == id && echo.Seq == seq {
				answered = true
			}
		}
	}
	return nil
}

func cacheDir(t *testing.T) string {
	dir, err := filepath.Abs("../../.cache/vm")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// peer is a TCP server in the host netns that serves one connection.
// peer counts what one connection moved and how long it took.
type peer struct {
	n       atomic.Int64
	elapsed atomic.Int64 // ns from accept to the end of serve
}

func (p *peer) bytes() int64 { return p.n.Load() }

// mbits is the connection's throughput in Mbit/s.
func (p *peer) mbits() float64 {
	if p.elapsed.Load() == 0 {
		return 0
	}
	return float64(p.n.Load()*8) / float64(p.elapsed.Load()) * 1e3
}

func listenInHost(t *testing.T, e *cnitest.Env, addr string, serve func(net.Conn) (int64, error)) *peer {
	t.Helper()
	var l net.Listener
	e.Host.Run(t, func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	})
	p := &peer{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		start := time.Now()
		n, _ := serve(c)
		p.elapsed.Store(int64(time.Since(start)))
		p.n.Store(n)
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return p
}

// capture counts what enters the pod netns from the tap (the guest's
// frames) as AF_PACKET sees it: after GRO.
type capture struct {
	fd     int
	frames atomic.Int64
	maxLen atomic.Int64
	done   chan struct{}
}

func startCapture(t *testing.T, netnsPath, ifName string) *capture {
	t.Helper()
	c := &capture{done: make(chan struct{})}
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		if c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		return unix.Bind(c.fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: link.Attrs().Index})
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", ifName, netnsPath, err)
	}
	_ = unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000})
	go func() {
		defer close(c.done)
		buf := make([]byte, 128)
		for {
			n, from, err := unix.Recvfrom(c.fd, buf, unix.MSG_TRUNC)
			if err == unix.EAGAIN || err == unix.EINTR {
				continue
			}
			if err != nil {
				return
			}
			if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
				continue
			}
			c.frames.Add(1)
			if int64(n) > c.maxLen.Load() {
				c.maxLen.Store(int64(n))
			}
		}
	}()
	t.Cleanup(func() { c.stop() })
	return c
}

var stopOnce sync.Map

func (c *capture) stop() (frames, maxLen int64) {
	if _, loaded := stopOnce.LoadOrStore(c, true); !loaded {
		_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
		unix.Close(c.fd)
		<-c.done
	}
	return c.frames.Load(), c.maxLen.Load()
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
