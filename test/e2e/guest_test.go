// Package e2e runs napitap end to end: the CNI chain through libcni, the
// napitapd and napitapctl binaries, and a real QEMU guest on the tap.
package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

var binDir string

func TestMain(m *testing.M) {
	cnitest.MainWithBinaries(m, &binDir, append([]string{
		"github.com/napitap/napitap/plugins/napitap",
		"github.com/napitap/napitap/cmd/napitapd",
		"github.com/napitap/napitap/cmd/napitap-fdstore",
		"github.com/napitap/napitap/cmd/napitapctl",
		"github.com/napitap/napitap/test/e2e/cmd/fake-kata-shim",
	}, cnitest.ReferencePlugins...)...)
}

// startNapitapd runs the napitapd binary in the netns at netns (the
// node's, as the DaemonSet runs it) on sockets of the test's own and stops
// it by PID when the test ends.
func startNapitapd(t *testing.T, netns string) *crihelp.Napitapd {
	return crihelp.StartNapitapd(t, filepath.Join(binDir, "napitapd"), t.TempDir(), netns)
}

// startNapitapdWithHolder is startNapitapd beside an fd holder
// (napitap-fdstore), as the DaemonSet's pod runs them: the holder outlives
// the napitapd processes a test kills.
func startNapitapdWithHolder(t *testing.T, netns string) *crihelp.Napitapd {
	// Short: t.TempDir's path for a subtest would leave no room for the
	// state dir's takeover.sock in sun_path's 108 bytes.
	dir, err := os.MkdirTemp("", "napitapd-holder")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "fdstore.sock")
	holder := exec.Command(filepath.Join(binDir, "napitap-fdstore"), "--socket", socket)
	holder.Stdout, holder.Stderr = os.Stderr, os.Stderr
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = holder.Process.Signal(syscall.SIGTERM); _ = holder.Wait() })
	if err := crihelp.Poll(5*time.Second, func() error { _, err := os.Stat(socket); return err }); err != nil {
		t.Fatalf("napitap-fdstore: %v", err)
	}
	return crihelp.StartNapitapd(t, filepath.Join(binDir, "napitapd"), filepath.Join(dir, "napitapd"), netns, "--fdstore-socket", socket)
}

// TestGuestTrafficTakesTheNAPIPath boots a real guest on the tap of a pod
// chained after bridge. With the queues napitap opened and napitapd handed
// over, GRO merges the guest's MTU-sized TCP segments in the pod netns:
// those queues carry NAPI. So does an unmodified QEMU that opens the tap by
// name under `napitapctl launch`, whose TUNSETIFF napitapd's seccomp agent
// performs with IFF_NAPI. The control, the same QEMU opening the tap by name
// without the launcher, gets plain queues, and nothing is ever merged
// (DESIGN.md facts 1, 6, 10, 12).
func TestGuestTrafficTakesTheNAPIPath(t *testing.T) {
	const control = "QEMU by name"
	cases := []struct {
		name       string
		label      string // in the throughput summary
		handoff    string // the plugin's handoff mode
		boot       guestBoot
		wantMerged bool
		// wantAttaches: queues napitapd's seccomp agent attaches with NAPI.
		wantAttaches int
	}{
		{"a guest on fds fetched from napitapd sends through NAPI", "NAPI fds", config.HandoffFDs, bootQEMUOnFetchedFds, true, 0},
		{"a guest whose QEMU opens the tap by ifname under napitapctl launch sends through NAPI", "QEMU by name, launched", config.HandoffIntercept, bootQEMUByNameLaunched, true, 2},
		{"a guest whose QEMU opens the tap by ifname gets no NAPI", control, config.HandoffOff, bootQEMUByName, false, 0},
	}
	// Guest-to-peer throughput per case: TCG, so only the ratio means much.
	throughput := map[string]float64{}
	t.Cleanup(func() {
		base := throughput[control]
		for _, tc := range cases[:len(cases)-1] {
			if got := throughput[tc.label]; got > 0 && base > 0 {
				t.Logf("guest -> peer, 8 MiB, guest TSO off: %s %.0f Mbit/s, %s %.0f Mbit/s: %.2fx",
					tc.label, got, control, base, got/base)
			}
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGuestTraffic(t, guestNet{handoff: tc.handoff}, tc.boot)
			throughput[tc.label] = r.out
			if r.merged() != tc.wantMerged {
				t.Errorf("GRO merged guest segments: %v (longest frame %d), want %v", r.merged(), r.maxLen, tc.wantMerged)
			}
			if r.agentAttaches != tc.wantAttaches {
				t.Errorf("napitapd's seccomp agent attached %d queues with NAPI, want %d", r.agentAttaches, tc.wantAttaches)
			}
		})
	}
}

// bootQEMUOnFetchedFds: napitapctl exec fetches the queues napitap opened
// and runs QEMU with them (fds=).
func bootQEMUOnFetchedFds(t *testing.T, b bootSpec) guestVM {
	netdev := "tap,id=n0,fds={fds},vhost=off"
	argv := append([]string{filepath.Join(binDir, "napitapctl"), "--socket", b.Daemon.Socket, "exec",
		"--container", b.Env.ContainerID, "--ifname", "eth0", "--"},
		vm.QEMUArgs(b.Kernel, b.Initrd, netdev, 2, b.Guest, b.Serial, true)...)
	return startVM(t, argv, b.Serial)
}

// byNameNetdev: QEMU opens tap itself, one TUNSETIFF per queue.
func byNameNetdev(tap string) string {
	return "tap,id=n0,ifname=" + tap + ",script=no,downscript=no,vhost=off,queues=2"
}

// bootQEMUByName: QEMU in the tap's netns opens the tap by name.
func bootQEMUByName(t *testing.T, b bootSpec) guestVM {
	argv := append([]string{"nsenter", "--net=" + b.TapNetns.Path(), "--"},
		vm.QEMUArgs(b.Kernel, b.Initrd, byNameNetdev(b.Tap), 2, b.Guest, b.Serial, true)...)
	return startVM(t, argv, b.Serial)
}

// bootQEMUByNameLaunched is bootQEMUByName under napitapctl launch: the
// same QEMU, its TUNSETIFFs served by napitapd's seccomp agent.
func bootQEMUByNameLaunched(t *testing.T, b bootSpec) guestVM {
	argv := append([]string{filepath.Join(binDir, "napitapctl"), "launch", "--seccomp-socket", b.Daemon.SeccompSocket, "--",
		"nsenter", "--net=" + b.TapNetns.Path(), "--"},
		vm.QEMUArgs(b.Kernel, b.Initrd, byNameNetdev(b.Tap), 2, b.Guest, b.Serial, true)...)
	return startVM(t, argv, b.Serial)
}

func startVM(t *testing.T, argv []string, serial string) guestVM {
	t.Helper()
	v, err := vm.Start(argv, nil, serial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = v.Stop() })
	return v
}

// guestVM is a booted guest, whoever started it.
type guestVM interface {
	WaitFor(ctx context.Context, marker string) error
	Serial() string
	Stop() error
}

// bootSpec is what a guestBoot gets: the pod, napitapd (nil for handoff
// mode off), and the guest to boot on Tap, in TapNetns: the pod's tap0, or a
// Kata DAN tap in the node's netns.
type bootSpec struct {
	Env            *cnitest.Env
	Daemon         *crihelp.Napitapd
	TapNetns       *nstest.NetNS
	Tap            string
	Kernel, Initrd string
	Guest          vm.Guest
	Serial         string // the guest's console log
}

// guestBoot starts b's guest and returns it running; it stops it when the
// test ends.
type guestBoot func(t *testing.T, b bootSpec) guestVM

// trafficResult is what one guest moved and what the tap saw of it.
type trafficResult struct {
	out, in        float64 // Mbit/s, guest -> peer and peer -> guest
	frames, maxLen int64   // the tap's ingress after GRO
	// agentAttaches counts the queues napitapd's seccomp agent attached
	// with NAPI for the runtime, as its log says.
	agentAttaches int
}

// merged: a frame longer than the MTU left the tap, so GRO merged the
// guest's segments: NAPI (DESIGN.md fact 10).
func (r trafficResult) merged() bool { return r.maxLen > crihelp.MaxFrame }

// bulk is what the guest sends and receives over TCP.
const bulk = 8 << 20

// guestNet is how napitap makes the guest's tap: its handoff mode and, for
// Kata runtime-rs, a DAN file, which puts the tap in the node's netns.
type guestNet struct {
	handoff string
	kataDan bool
	holder  bool // napitapd beside an fd holder
}

// runGuestTraffic adds bridge + napitap (2 queues, gro_flush_timeout
// 200 us, as net asks, napitapd started unless the mode is off) to a fresh
// pod, boots the guest with boot, has it ping and move bulk bytes each way
// to a peer in the host netns while the tap's ingress is captured, then
// stops it, runs DEL and checks that nothing is left.
func runGuestTraffic(t *testing.T, gn guestNet, boot guestBoot) trafficResult {
	t.Helper()
	e := cnitest.NewEnv(t, binDir)
	kernel, initrd, err := vm.Artifacts(cacheDir(t))
	if err != nil {
		t.Fatal(err)
	}
	handoffConf := `{"mode":"off"}`
	var d *crihelp.Napitapd
	if gn.handoff != config.HandoffOff {
		if gn.holder {
			d = startNapitapdWithHolder(t, e.Host.Path())
		} else {
			d = startNapitapd(t, e.Host.Path())
		}
		handoffConf = fmt.Sprintf(`{"mode":%q,"socket":%q,"required":true}`, gn.handoff, d.Socket)
	}
	napitap := `{"type":"napitap","queues":2,"groFlushTimeout":200000,"handoff":` + handoffConf
	tapNetns, tap := e.Pod, "tap0"
	if gn.kataDan {
		napitap += fmt.Sprintf(`,"kataDan":{"enabled":true,"dir":%q}`, t.TempDir())
		tapNetns, tap = e.Host, config.NodeTapName(e.ContainerID, "eth0")
	}
	list := e.List("1.1.0", e.BridgePlugin(), napitap+`}`)
	rt := e.RT("eth0")
	hostBefore := e.HostLinks()
	res := e.MustAdd(list, rt)
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = e.Del(list, rt)
		}
	})
	guestIf, guestIP := cnitest.GuestOf(t, res, e.ContainerID)
	gateway := guestIP.Gateway.String()

	sink := crihelp.ListenIn(t, e.Host, gateway+":5001", func(c net.Conn) (int64, error) { return io.CopyN(io.Discard, c, bulk) })
	source := crihelp.ListenIn(t, e.Host, gateway+":5002", func(c net.Conn) (int64, error) {
		return io.CopyN(c, crihelp.ZeroReader{}, bulk)
	})
	capture := crihelp.StartCapture(t, tapNetns.Path(), tap)

	script := fmt.Sprintf(`ping -c 3 %[1]s && echo PING-OK
dd if=/dev/zero bs=65536 count=%[2]d 2>/dev/null | nc %[1]s 5001 && echo SENT-OK
echo "RECEIVED $(nc %[1]s 5002 | wc -c)"
echo PEER-PING-WINDOW
sleep 4
`, gateway, bulk/65536)
	guest := vm.Guest{IP: guestIP.Address.String(), Gateway: gateway, MAC: guestIf.Mac, Script: script}
	serial := filepath.Join(t.TempDir(), "serial.log")
	v := boot(t, bootSpec{Env: e, Daemon: d, TapNetns: tapNetns, Tap: tap, Kernel: kernel, Initrd: initrd, Guest: guest, Serial: serial})
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
	r := trafficResult{out: sink.Mbits(), in: source.Mbits()}
	t.Logf("guest -> peer %.0f Mbit/s, peer -> guest %.0f Mbit/s", r.out, r.in)
	if n := sink.Bytes(); n != bulk {
		t.Errorf("peer received %d bytes from the guest, want %d", n, bulk)
	}
	if n := source.Bytes(); n != bulk {
		t.Errorf("peer sent %d bytes to the guest, want %d", n, bulk)
	}
	seen := capture.Stop()
	r.frames, r.maxLen = seen.Frames, seen.MaxLen
	t.Logf("%s ingress: %s", tap, seen)
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
	// The bridge plugin leaves its bridge, and nothing else may stay.
	if links := e.HostLinks(); len(links) != len(hostBefore)+1 {
		t.Errorf("host netns after DEL: %v, before ADD: %v and no bridge", links, hostBefore)
	}
	if d != nil {
		r.agentAttaches = agentAttaches(t, d)
		atts, err := (&handoff.Client{Socket: d.Socket}).List()
		if err != nil || len(atts) != 0 {
			t.Errorf("napitapd after DEL: %+v, %v; want nothing", atts, err)
		}
	}
	return r
}

// agentAttaches counts the "attached the caller's queue with NAPI" lines
// in napitapd's log.
func agentAttaches(t *testing.T, d *crihelp.Napitapd) int {
	t.Helper()
	b, err := os.ReadFile(d.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "attached the caller's queue with NAPI")
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

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
