package crihelp

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// WriteVMMImage imports ref, a VMM container's image: an empty rootfs of
// mount points (usr, etc, dev, proc, sys, tmp and dirs) and the symlinks
// of a merged-/usr Debian, so that the host's /usr mounted read-only runs
// (QEMU, its libraries and firmware, a shell).
func WriteVMMImage(t testing.TB, n *Node, ref string, dirs ...string) {
	t.Helper()
	var entries []ImageEntry
	for _, d := range append([]string{"usr", "etc", "dev", "proc", "sys", "tmp"}, dirs...) {
		entries = append(entries, ImageEntry{Name: d, Dir: true, Mode: 0o755})
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		entries = append(entries, ImageEntry{Name: l, Link: "usr/" + l})
	}
	archive := filepath.Join(n.Root, strings.NewReplacer("/", "-", ":", "-").Replace(ref)+".tar")
	if err := WriteImageArchive(archive, ref, []string{"/usr/bin/qemu-system-x86_64"}, entries); err != nil {
		t.Fatal(err)
	}
	n.ImportImage(archive, ref)
}

// SeccompListeners counts the seccomp listeners napitapd holds.
func (d *Napitapd) SeccompListeners() (int, error) {
	fds, err := d.Fds()
	c := 0
	for _, f := range fds {
		if strings.HasPrefix(f, "anon_inode:seccomp notify") {
			c++
		}
	}
	return c, err
}

// Gateway is host-local's gateway on the bridge: the subnet's first
// address.
func Gateway(subnet string) (string, error) {
	_, n, err := net.ParseCIDR(subnet)
	if err != nil {
		return "", err
	}
	gw := n.IP.To4()
	if gw == nil {
		return "", fmt.Errorf("subnet %s is not IPv4", subnet)
	}
	gw[3]++
	return gw.String(), nil
}

// ZeroReader reads zeros without end.
type ZeroReader struct{}

func (ZeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Peer is a TCP server in a netns serving one connection; it counts what
// that moved and how long it took.
type Peer struct {
	n       atomic.Int64
	elapsed atomic.Int64 // ns from accept to the end of serve
}

// Bytes is what serve moved.
func (p *Peer) Bytes() int64 { return p.n.Load() }

// Mbits is the connection's throughput, 0 before it ended.
func (p *Peer) Mbits() float64 {
	if p.elapsed.Load() == 0 {
		return 0
	}
	return float64(p.n.Load()*8) / float64(p.elapsed.Load()) * 1e3
}

// ListenIn listens on addr in netns and serves the first connection with
// serve; the listener closes when the test ends.
func ListenIn(t testing.TB, netns *nstest.NetNS, addr string, serve func(net.Conn) (int64, error)) *Peer {
	t.Helper()
	var l net.Listener
	netns.Run(t, func() (err error) {
		l, err = net.Listen("tcp4", addr)
		return err
	})
	p := &Peer{}
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
		got, _ := serve(c)
		p.elapsed.Store(int64(time.Since(start)))
		p.n.Store(got)
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return p
}

// Capture counts what enters a netns from one of its links (a tap: the
// guest's frames) as AF_PACKET sees them: after GRO. A frame longer than
// an Ethernet frame (1514 bytes) is segments GRO merged.
type Capture struct {
	fd       int
	frames   atomic.Int64
	merged   atomic.Int64 // frames > 1514 bytes
	maxLen   atomic.Int64
	done     chan struct{}
	stopOnce sync.Once
}

// MaxFrame is the longest Ethernet frame without GRO (MTU 1500).
const MaxFrame = 1514

// StartCapture opens an ETH_P_ALL packet socket on ifName in the netns at
// netnsPath: a tap's packet socket is served before tc ingress, so it
// sees the frames even where tc-redirect wiring takes them on.
func StartCapture(t testing.TB, netnsPath, ifName string) *Capture {
	t.Helper()
	c := &Capture{done: make(chan struct{})}
	proto := htons(unix.ETH_P_ALL)
	err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifName)
		if err != nil {
			return err
		}
		if c.fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto)); err != nil {
			return err
		}
		return unix.Bind(c.fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: link.Attrs().Index})
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", ifName, netnsPath, err)
	}
	_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	_ = unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000})
	go func() {
		defer close(c.done)
		buf := make([]byte, 128)
		for {
			got, from, err := unix.Recvfrom(c.fd, buf, unix.MSG_TRUNC)
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
			if got > MaxFrame {
				c.merged.Add(1)
			}
			if int64(got) > c.maxLen.Load() {
				c.maxLen.Store(int64(got))
			}
		}
	}()
	t.Cleanup(func() { c.Stop() })
	return c
}

// CaptureResult is what a Capture saw.
type CaptureResult struct {
	Frames int64 // every frame in
	Merged int64 // of them, longer than MaxFrame
	MaxLen int64 // the longest
}

func (r CaptureResult) String() string {
	return fmt.Sprintf("%d frames, %d of them over %d bytes, longest %d bytes", r.Frames, r.Merged, MaxFrame, r.MaxLen)
}

// Stop closes the socket and returns what it saw; it may be called more
// than once.
func (c *Capture) Stop() CaptureResult {
	c.stopOnce.Do(func() {
		_ = unix.Shutdown(c.fd, unix.SHUT_RDWR)
		unix.Close(c.fd)
		<-c.done
	})
	return CaptureResult{Frames: c.frames.Load(), Merged: c.merged.Load(), MaxLen: c.maxLen.Load()}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// CheckSeccomp checks the seccomp section containerd gave runc for the
// container id: a Localhost napitap profile (localhost) has its one NOTIFY
// rule and the listener napitapd serves; RuntimeDefault is a filter too,
// without a listener. Both deny by default.
func (n *Node) CheckSeccomp(t testing.TB, id string, localhost bool) {
	t.Helper()
	out, err := n.CrictlRun("inspect", "-o", "json", id)
	if err != nil {
		t.Fatal(err)
	}
	var inspect struct {
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Seccomp *struct {
						DefaultAction    string
						ListenerPath     string
						ListenerMetadata string
						Syscalls         []struct{ Action string }
					}
				}
			}
		}
	}
	if err := json.Unmarshal(out, &inspect); err != nil {
		t.Fatalf("crictl inspect %s: %v", id, err)
	}
	sc := inspect.Info.RuntimeSpec.Linux.Seccomp
	if sc == nil {
		t.Fatalf("container %.12s runs without seccomp", id)
	}
	notify := 0
	for _, r := range sc.Syscalls {
		if r.Action == "SCMP_ACT_NOTIFY" {
			notify++
		}
	}
	t.Logf("container %.12s seccomp: default %s, %d rules, %d notify, listenerPath %q", id, sc.DefaultAction, len(sc.Syscalls), notify, sc.ListenerPath)
	listener := n.Napitapd.SeccompSocket
	switch {
	case sc.DefaultAction != "SCMP_ACT_ERRNO":
		t.Errorf("default action %s, want SCMP_ACT_ERRNO", sc.DefaultAction)
	case localhost && (sc.ListenerPath != listener || sc.ListenerMetadata != "vmm" || notify != 1):
		t.Errorf("listenerPath %q metadata %q with %d notify rules, want %q, vmm and 1", sc.ListenerPath, sc.ListenerMetadata, notify, listener)
	case !localhost && (sc.ListenerPath != "" || notify != 0):
		t.Errorf("RuntimeDefault has listenerPath %q and %d notify rules", sc.ListenerPath, notify)
	}
}
