package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/cnitest"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/testguest"
	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/katadan"
	"github.com/napitap/napitap/pkg/tapsetup"
)

var allVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

type scenario struct {
	name    string
	plugins func(e *cnitest.Env, handoff string) []string // handoff: napitap's "handoff" member
	ifName  string
	tapName string
	chained bool
	// takesPeerIdentity: bridge wiring moves the peer's MAC and addresses to
	// the guest, so the previous plugin's own CHECK no longer agrees.
	takesPeerIdentity bool
}

var scenarios = []scenario{
	{
		name: "standalone with host-local IPAM",
		plugins: func(e *cnitest.Env, handoff string) []string {
			return []string{`{"type":"napitap","queues":4,"ipam":` + e.Ipam() + `,` + handoff + `}`}
		},
		ifName:  "tap0",
		tapName: "tap0",
	},
	{
		name: "chained after bridge with tc-redirect",
		plugins: func(e *cnitest.Env, handoff string) []string {
			return []string{e.BridgePlugin(), `{"type":"napitap","queues":4,` + handoff + `}`}
		},
		ifName:  "eth0",
		tapName: "tap0",
		chained: true,
	},
	{
		name: "chained after bridge with a bridge in the pod",
		plugins: func(e *cnitest.Env, handoff string) []string {
			return []string{e.BridgePlugin(), `{"type":"napitap","queues":2,"wiring":"bridge",` + handoff + `}`}
		},
		ifName:            "net1",
		tapName:           "tap1",
		chained:           true,
		takesPeerIdentity: true,
	},
	{
		name: "chained after ptp with tc-redirect",
		plugins: func(e *cnitest.Env, handoff string) []string {
			return []string{e.PtpPlugin(), `{"type":"napitap","queues":3,` + handoff + `}`}
		},
		ifName:  "eth0",
		tapName: "tap0",
		chained: true,
	},
}

// TestEveryVerbInEverySpecVersion drives each wiring through libcni in every
// spec version napitap speaks: ADD, CHECK, STATUS, GC, DEL twice.
func TestEveryVerbInEverySpecVersion(t *testing.T) {
	for _, sc := range scenarios {
		for _, v := range allVersions {
			t.Run(sc.name+" in spec "+v, func(t *testing.T) {
				e := cnitest.NewEnv(t, binDir)
				before := e.PodLinks()
				list := e.List(v, sc.plugins(e, nodeHandoff(t))...)
				rt := e.RT(sc.ifName)
				res := e.MustAdd(list, rt)

				tap := e.InspectTap(sc.tapName)
				if !tap.Up || !tap.VnetHdr || !tap.Persistent {
					t.Errorf("tap up=%v vnet_hdr=%v persist=%v, want all true", tap.Up, tap.VnetHdr, tap.Persistent)
				}
				if !slices.ContainsFunc(res.Interfaces, func(i *current.Interface) bool {
					return i.Name == sc.tapName && i.Sandbox == e.Pod.Path() && i.Mac == tap.Link.Attrs().HardwareAddr.String()
				}) {
					t.Errorf("result lacks the tap %q in the pod netns: %s", sc.tapName, cnitest.MustJSON(res))
				}
				if sc.chained {
					guest, _ := cnitest.GuestOf(t, res, e.ContainerID)
					if guest.Name != sc.ifName {
						t.Errorf("guest entry is named %q, want %q", guest.Name, sc.ifName)
					}
				}

				if v != "0.3.0" && v != "0.3.1" {
					check := e.Check(list, rt)
					if sc.takesPeerIdentity {
						check = e.CheckNapitapOnly(list, res, sc.ifName)
					}
					if check != nil {
						t.Errorf("CHECK after ADD: %v", check)
					}
				}
				if v == "1.1.0" {
					ctx := context.Background()
					if err := e.InHost(func() error { return e.CNI.GetStatusNetworkList(ctx, list) }); err != nil {
						t.Errorf("STATUS: %v", err)
					}
					valid := &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: e.ContainerID, IfName: sc.ifName}}}
					if err := e.InHost(func() error { return e.CNI.GCNetworkList(ctx, list, valid) }); err != nil {
						t.Errorf("GC: %v", err)
					}
					e.InspectTap(sc.tapName) // GC keeps a valid attachment
				}

				if err := e.Del(list, rt); err != nil {
					t.Fatalf("DEL: %v", err)
				}
				if after := e.PodLinks(); !slices.Equal(before, after) {
					t.Errorf("pod netns after DEL: %v, before ADD: %v", after, before)
				}
				if err := e.Del(list, rt); err != nil {
					t.Errorf("a second DEL must succeed: %v", err)
				}
			})
		}
	}
}

// TestTrafficCrossesTheWiring plays the guest: it opens the tap's queues the
// way a VMM would be handed them, answers ARP and echoes UDP, while a peer
// outside the pod talks to the guest's address.
func TestTrafficCrossesTheWiring(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			// The guest opens the tap by name, as a runtime does with the
			// hand-off off.
			list := e.List("1.1.0", sc.plugins(e, `"handoff":{"mode":"off"}`)...)
			rt := e.RT(sc.ifName)
			res := e.MustAdd(list, rt)
			t.Cleanup(func() { _ = e.Del(list, rt) })

			guest := &testguest.Guest{VnetHdrLen: 12}
			peerNS := e.Host
			if sc.chained {
				iface, ipc := cnitest.GuestOf(t, res, e.ContainerID)
				guest.MAC, _ = net.ParseMAC(iface.Mac)
				guest.IP = ipc.Address.IP
			} else {
				// Standalone: the pod netns owns the tap's address and is the
				// peer; the guest takes another address of the subnet.
				peerNS = e.Pod
				guest.MAC = net.HardwareAddr{0x02, 0x4e, 0x41, 0, 0, 0x01}
				guest.IP = net.IPv4(10, 199, 0, 200)
			}

			// The peer's traffic reaches the guest through the tap's
			// transmit, which the root qdisc sits on; tc-redirect's mirred
			// transmits there too.
			if q := e.InspectTap(sc.tapName).RootQdisc; q != tapsetup.QdiscNoqueue {
				t.Errorf("root qdisc %q, want the default %q", q, tapsetup.QdiscNoqueue)
			}
			queues := openGuestQueues(t, e, sc.tapName, tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true})
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- guest.Serve(ctx, queues) }()
			t.Cleanup(func() {
				cancel()
				if err := <-served; err != nil {
					t.Errorf("guest: %v", err)
				}
			})

			var conn *net.UDPConn
			peerNS.Run(t, func() (err error) {
				conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: guest.IP, Port: 7777})
				return err
			})
			defer conn.Close()
			if err := udpRoundTrip(conn, "napitap"); err != nil {
				t.Fatalf("peer -> guest %s -> peer: %v (guest saw %+v)", guest.IP, err, guest.Stats())
			}
			if s := guest.Stats(); s.ARPReplies == 0 || s.UDPEchoes == 0 {
				t.Errorf("guest stats %+v: want ARP and UDP answered through the tap", s)
			}
		})
	}
}

// openGuestQueues attaches every configured queue of the tap in the pod
// netns, non-blocking so the guest can stop on time.
func openGuestQueues(t *testing.T, e *cnitest.Env, tapName string, flags tapsetup.QueueFlags) []*os.File {
	t.Helper()
	tap := e.InspectTap(tapName)
	n := 1
	if tap.MultiQueue {
		n = 2
	}
	var files []*os.File
	e.Pod.Run(t, func() error {
		queues, err := tapsetup.OpenQueues(tapName, n, tapsetup.QueueFlags{MultiQueue: tap.MultiQueue, VnetHdr: flags.VnetHdr, NAPI: flags.NAPI})
		if err != nil {
			return err
		}
		for _, q := range queues {
			fd, err := unix.Dup(int(q.Fd()))
			q.Close()
			if err != nil {
				return err
			}
			if err := unix.SetNonblock(fd, true); err != nil {
				return err
			}
			files = append(files, os.NewFile(uintptr(fd), q.Name()))
		}
		return nil
	})
	t.Cleanup(func() { tapsetup.CloseQueues(files) })
	return files
}

func udpRoundTrip(conn *net.UDPConn, payload string) error {
	buf := make([]byte, 1500)
	var lastErr error
	for attempt := 0; attempt < 10; attempt++ {
		if _, err := conn.Write([]byte(payload)); err != nil {
			lastErr = err
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := conn.Read(buf)
		if err != nil {
			lastErr = err
			continue
		}
		if got := string(buf[:n]); got != payload {
			return fmt.Errorf("echo %q, want %q", got, payload)
		}
		return nil
	}
	return lastErr
}

func TestCheckNamesWhatDrifted(t *testing.T) {
	cases := []struct {
		name  string
		drift func(tap, peer netlink.Link) error
		want  string
	}{
		{"a changed MTU is reported", func(tap, _ netlink.Link) error { return netlink.LinkSetMTU(tap, 1280) }, "mtu is 1280"},
		{"a tap set down is reported", func(tap, _ netlink.Link) error { return netlink.LinkSetDown(tap) }, "up is false"},
		{"a removed redirect filter is reported", func(_, peer netlink.Link) error { return tapsetup.UnwireRedirect(peer.Attrs().Name) }, "no redirect filter"},
		{"a root qdisc replaced by pfifo_fast is reported", func(tap, _ netlink.Link) error {
			return netlink.QdiscReplace(&netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: tap.Attrs().Index, Parent: netlink.HANDLE_ROOT}, QdiscType: "pfifo_fast"})
		}, "root qdisc is pfifo_fast, config wants noqueue"},
		{"a changed MAC is reported", func(tap, _ netlink.Link) error {
			return netlink.LinkSetHardwareAddr(tap, net.HardwareAddr{2, 0, 0, 0, 0, 0x99})
		}, "mac is 02:00:00:00:00:99"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			list := e.List("1.0.0", e.BridgePlugin(), `{"type":"napitap","queues":2,"mac":"02:00:00:00:00:01",`+nodeHandoff(t)+`}`)
			rt := e.RT("eth0")
			e.MustAdd(list, rt)
			t.Cleanup(func() { _ = e.Del(list, rt) })
			e.Pod.Run(t, func() error {
				tap, err := netlink.LinkByName("tap0")
				if err != nil {
					return err
				}
				peer, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				return tc.drift(tap, peer)
			})
			err := e.Check(list, rt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CHECK: got %v, want an error naming %q", err, tc.want)
			}
			var cniErr *types.Error
			if !errors.As(err, &cniErr) || cniErr.Code != config.ErrCheckDrift {
				t.Errorf("CHECK: got %#v, want code %d", err, config.ErrCheckDrift)
			}
		})
	}
}

// TestCheckWhenTheRuntimeOpensTheTapByName: libvirt attaches one queue per
// vCPU whatever the tap's "queues" (4 on a 2-queue tap, DESIGN.md fact 14);
// that is drift only when napitap's own fds are the queues.
func TestCheckWhenTheRuntimeOpensTheTapByName(t *testing.T) {
	cases := []struct {
		name     string
		mode     string
		wantCode uint // 0: CHECK passes
	}{
		{"a runtime's 4 queues on a 2-queue tap pass CHECK in intercept mode", "intercept", 0},
		{"a runtime's 4 queues on a 2-queue tap pass CHECK with the hand-off off", "off", 0},
		{"4 queues on a 2-queue tap are drift when napitap's fds are the queues", "fds", config.ErrCheckDrift},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			d := startNapitapd(t, "")
			list := e.List("1.0.0", e.BridgePlugin(), fmt.Sprintf(`{"type":"napitap","queues":2,"handoff":{"mode":%q,"socket":%q}}`, tc.mode, d.socket))
			rt := e.RT("eth0")
			e.MustAdd(list, rt)
			t.Cleanup(func() { _ = e.Del(list, rt) })
			var queues []*os.File
			e.Pod.Run(t, func() (err error) {
				// As libvirt opens it: IFF_VNET_HDR, multiqueue, no NAPI.
				queues, err = tapsetup.OpenQueues("tap0", 4, tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true})
				return err
			})
			t.Cleanup(func() { tapsetup.CloseQueues(queues) })
			err := e.Check(list, rt)
			var cniErr *types.Error
			switch {
			case tc.wantCode == 0 && err != nil:
				t.Errorf("CHECK: %v, want success", err)
			case tc.wantCode != 0 && (!errors.As(err, &cniErr) || cniErr.Code != tc.wantCode):
				t.Errorf("CHECK: %#v, want code %d", err, tc.wantCode)
			}
		})
	}
}

// TestCheckOfTheRootQdiscWhenLibvirtOpensTheTap: libvirt replaces the root
// qdisc of every tap it opens with noqueue (DESIGN.md fact 14). That is
// napitap's default, and with "mq" it is the runtime's business when the
// runtime opens the tap by name; only with napitap's own fds is it drift.
func TestCheckOfTheRootQdiscWhenLibvirtOpensTheTap(t *testing.T) {
	cases := []struct {
		name, rootQdisc, mode string
		libvirt               bool
		wantCode              uint // 0: CHECK passes
	}{
		{"the default noqueue passes CHECK after libvirt set noqueue again", "", "intercept", true, 0},
		{"mq passes CHECK as the kernel attached it", "mq", "fds", false, 0},
		{"mq replaced by libvirt's noqueue passes CHECK in intercept mode", "mq", "intercept", true, 0},
		{"mq replaced by libvirt's noqueue passes CHECK with the hand-off off", "mq", "off", true, 0},
		{"mq replaced by noqueue is drift when napitap's fds are the queues", "mq", "fds", true, config.ErrCheckDrift},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			qdisc := ""
			if tc.rootQdisc != "" {
				qdisc = fmt.Sprintf(`,"rootQdisc":%q`, tc.rootQdisc)
			}
			d := startNapitapd(t, "")
			list := e.List("1.0.0", e.BridgePlugin(), fmt.Sprintf(`{"type":"napitap","queues":2%s,"handoff":{"mode":%q,"socket":%q}}`, qdisc, tc.mode, d.socket))
			rt := e.RT("eth0")
			e.MustAdd(list, rt)
			t.Cleanup(func() { _ = e.Del(list, rt) })
			want := tapsetup.QdiscNoqueue
			if tc.rootQdisc == "mq" {
				want = "mq"
			}
			if got := e.InspectTap("tap0").RootQdisc; got != want {
				t.Errorf("root qdisc after ADD: %q, want %q", got, want)
			}
			if tc.libvirt {
				// What libvirt runs (virNetDevSetRootQDisc).
				e.Pod.Run(t, func() error {
					out, err := exec.Command("tc", "qdisc", "replace", "dev", "tap0", "root", "handle", "0:", "noqueue").CombinedOutput()
					if err != nil {
						return fmt.Errorf("tc: %v: %s", err, out)
					}
					return nil
				})
			}
			err := e.Check(list, rt)
			var cniErr *types.Error
			switch {
			case tc.wantCode == 0 && err != nil:
				t.Errorf("CHECK: %v, want success", err)
			case tc.wantCode != 0 && (!errors.As(err, &cniErr) || cniErr.Code != tc.wantCode || !strings.Contains(err.Error(), "root qdisc is noqueue")):
				t.Errorf("CHECK: %#v, want code %d naming the root qdisc", err, tc.wantCode)
			}
		})
	}
}

func TestMACPrecedence(t *testing.T) {
	const cfg, cniArg, capability = "02:00:00:00:00:0a", "02:00:00:00:00:0b", "02:00:00:00:00:0c"
	cases := []struct {
		name       string
		args       [][2]string
		capability bool
		want       string
	}{
		{"the config's mac is used alone", nil, false, cfg},
		{"CNI_ARGS MAC beats the config", [][2]string{{"IgnoreUnknown", "1"}, {"MAC", cniArg}}, false, cniArg},
		{"the mac capability beats CNI_ARGS", [][2]string{{"IgnoreUnknown", "1"}, {"MAC", cniArg}}, true, capability},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			list := e.List("1.0.0", fmt.Sprintf(`{"type":"napitap","mac":%q,"capabilities":{"mac":true},%s}`, cfg, nodeHandoff(t)))
			rt := e.RT("tap0")
			rt.Args = tc.args
			if tc.capability {
				rt.CapabilityArgs = map[string]interface{}{"mac": capability}
			}
			e.MustAdd(list, rt)
			t.Cleanup(func() { _ = e.Del(list, rt) })
			if got := e.InspectTap("tap0").Link.Attrs().HardwareAddr.String(); got != tc.want {
				t.Errorf("tap mac %s, want %s", got, tc.want)
			}
		})
	}
}

// TestPerPodArgs: Multus hands a pod's cni-args to the plugin as args.cni.
func TestPerPodArgsOverrideTheNetwork(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	list := e.List("1.0.0", `{"type":"napitap","queues":1,"args":{"cni":{"queues":8,"threadedNapi":true,"mac":"02:00:00:00:00:42"}},`+nodeHandoff(t)+`}`)
	rt := e.RT("tap0")
	e.MustAdd(list, rt)
	t.Cleanup(func() { _ = e.Del(list, rt) })
	tap := e.InspectTap("tap0")
	if !tap.MultiQueue || !tap.Sysfs.Threaded || tap.Link.Attrs().HardwareAddr.String() != "02:00:00:00:00:42" {
		t.Errorf("multiqueue=%v threaded=%v mac=%s, want true true 02:00:00:00:00:42", tap.MultiQueue, tap.Sysfs.Threaded, tap.Link.Attrs().HardwareAddr)
	}
}

// TestFailedAddLeavesNothing: whatever step fails, the pod is as before.
func TestFailedAddLeavesNothing(t *testing.T) {
	cases := []struct {
		name     string
		prepare  func(e *cnitest.Env) error
		plugins  func(e *cnitest.Env) []string
		ifName   string
		wantCode uint
	}{
		{
			name: "a bridge name already taken in the pod fails before the tap exists",
			prepare: func(e *cnitest.Env) error {
				return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-tap0"}})
			},
			plugins: func(e *cnitest.Env) []string {
				return []string{`{"type":"napitap","wiring":"bridge","queues":2,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"` + e.Pod.Path() + `"}]}}`}
			},
			ifName:   "eth0",
			wantCode: types.ErrInvalidEnvironmentVariables, // br-tap0 comes from CNI_IFNAME eth0
		},
		{
			name: "a tap name taken by another link fails without touching it",
			prepare: func(e *cnitest.Env) error {
				return netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "tap0"}})
			},
			plugins:  func(e *cnitest.Env) []string { return []string{`{"type":"napitap","queues":2}`} },
			ifName:   "tap0",
			wantCode: types.ErrInvalidEnvironmentVariables,
		},
		{
			name: "an IPAM failure leaves no tap",
			plugins: func(e *cnitest.Env) []string {
				return []string{`{"type":"napitap","ipam":{"type":"host-local","subnet":"not-a-subnet"}}`}
			},
			ifName:   "tap0",
			wantCode: types.ErrInternal,
		},
		{
			name: "an IPAM plugin missing from CNI_PATH is a config error naming ipam.type",
			plugins: func(e *cnitest.Env) []string {
				return []string{`{"type":"napitap","ipam":{"type":"napitap-no-such-ipam"}}`}
			},
			ifName:   "tap0",
			wantCode: types.ErrInvalidNetworkConfig,
		},
		{
			name:     "queues out of range is a config error naming the field",
			plugins:  func(e *cnitest.Env) []string { return []string{`{"type":"napitap","queues":257}`} },
			ifName:   "tap0",
			wantCode: types.ErrInvalidNetworkConfig,
		},
		{
			name:     "a misspelt key is a config error, not a default",
			plugins:  func(e *cnitest.Env) []string { return []string{`{"type":"napitap","queus":4}`} },
			ifName:   "tap0",
			wantCode: types.ErrInvalidNetworkConfig,
		},
		{
			name:     "tc-redirect without a previous plugin is a config error",
			plugins:  func(e *cnitest.Env) []string { return []string{`{"type":"napitap","wiring":"tc-redirect"}`} },
			ifName:   "eth0",
			wantCode: types.ErrInvalidNetworkConfig,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			e.Pod.Run(t, func() error {
				// A stand-in for the previous plugin's interface.
				return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0peer"})
			})
			if tc.prepare != nil {
				e.Pod.Run(t, func() error { return tc.prepare(e) })
			}
			before := e.PodLinks()
			plugins := tc.plugins(e)
			conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"napitap-test",%s`, strings.TrimPrefix(plugins[0], "{"))
			err := e.ExecNapitap("ADD", conf, tc.ifName)
			if err == nil {
				t.Fatal("ADD succeeded, want an error")
			}
			if code := cnitest.CNICode(err); code != tc.wantCode {
				t.Errorf("error code %d (%v), want %d", code, err, tc.wantCode)
			}
			if after := e.PodLinks(); !slices.Equal(before, after) {
				t.Errorf("pod netns after failed ADD: %v, before: %v", after, before)
			}
		})
	}
}

func TestSecondAddLeavesTheFirstIntact(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	list := e.List("1.0.0", `{"type":"napitap","queues":2,`+nodeHandoff(t)+`}`)
	rt := e.RT("tap0")
	e.MustAdd(list, rt)
	t.Cleanup(func() { _ = e.Del(list, rt) })
	_, err := e.Add(list, rt)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second ADD: got %v, want an error saying the tap exists", err)
	}
	if err := e.Check(list, rt); err != nil {
		t.Errorf("CHECK after the failed second ADD: %v", err)
	}
}

func TestDelSucceedsWhenTheNetnsIsGone(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	list := e.List("1.0.0", `{"type":"napitap","queues":2,`+nodeHandoff(t)+`}`)
	rt := e.RT("tap0")
	e.MustAdd(list, rt)
	rt.NetNS = "/run/netns/napitap-does-not-exist"
	if err := e.Del(list, rt); err != nil {
		t.Errorf("DEL with the netns gone: %v", err)
	}
	rt.NetNS = ""
	if err := e.Del(list, rt); err != nil {
		t.Errorf("DEL without a netns: %v", err)
	}
}

// A DEL whose config has a typo (a NAD edited after ADD) fails with code 7
// naming the key and removes nothing; the corrected config then cleans up.
func TestDelRefusesAMisspeltKeyAndLeavesTheAttachment(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	list := e.List("1.0.0", `{"type":"napitap","queues":2,`+nodeHandoff(t)+`}`)
	rt := e.RT("tap0")
	e.MustAdd(list, rt)
	t.Cleanup(func() { _ = e.Del(list, rt) })
	before := e.PodLinks()

	typo := e.List("1.0.0", `{"type":"napitap","queus":2,`+nodeHandoff(t)+`}`)
	err := e.Del(typo, rt)
	if code := cnitest.CNICode(err); code != types.ErrInvalidNetworkConfig || !strings.Contains(err.Error(), `queus: unknown key; did you mean "queues"?`) {
		t.Errorf("DEL with a misspelt key: code %d (%v), want %d naming queus", code, err, types.ErrInvalidNetworkConfig)
	}
	if after := e.PodLinks(); !slices.Equal(before, after) {
		t.Errorf("pod netns after the refused DEL: %v, before: %v", after, before)
	}
	if err := e.Del(list, rt); err != nil {
		t.Fatalf("DEL with the corrected config: %v", err)
	}
	if after := e.PodLinks(); slices.Contains(after, "tap0") {
		t.Errorf("tap0 left after DEL: %v", after)
	}
}

// BenchmarkAddDel4QueueNAPI: ADD then DEL of a standalone 4-queue NAPI tap,
// exec'd through libcni as a runtime does.
func BenchmarkAddDel4QueueNAPI(b *testing.B) {
	e := cnitest.NewEnv(b, binDir)
	list, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"napitap-bench","plugins":[{"type":"napitap","queues":4,` + nodeHandoff(b) + `}]}`))
	if err != nil {
		b.Fatal(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: "napitap-bench", NetNS: e.Pod.Path(), IfName: "tap0"}
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := e.CNI.AddNetworkList(ctx, list, rt); err != nil {
			b.Fatal(err)
		}
		if err := e.CNI.DelNetworkList(ctx, list, rt); err != nil {
			b.Fatal(err)
		}
	}
}

// TestKernelThatCannotServeTheConfigIsReported plays a kernel without
// /dev/net/tun, or without the NAPI knobs in sysfs (an empty tmpfs over lo's
// sysfs directory, which the plugin probes), in a private mount namespace:
// STATUS and ADD must answer code 50 naming the config field and leave the
// pod alone; a config that sets no knob is served. Nothing real is written.
func TestKernelThatCannotServeTheConfigIsReported(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	const (
		noTun   = "mount -t tmpfs napitap-test /dev/net"
		noKnobs = "mount -t tmpfs napitap-test /sys/class/net/lo/"
	)
	cases := []struct {
		name, hide, command, conf string
		wantIn                    []string // in the code 50 message; nil: success
	}{
		{"STATUS without /dev/net/tun answers code 50 naming it", noTun, "STATUS", `"queues":2`, []string{"/dev/net/tun"}},
		{"ADD without /dev/net/tun answers code 50 naming it", noTun, "ADD", `"queues":2`, []string{"/dev/net/tun"}},
		{"STATUS of the defaults without threaded answers code 50 naming threadedNapi", noKnobs, "STATUS", `"queues":2`, []string{"threadedNapi", "threaded NAPI (Linux 5.12+)"}},
		{"ADD of the defaults without threaded answers code 50 before making anything", noKnobs, "ADD", `"queues":2`, []string{"threadedNapi", "/sys/class/net/lo has no threaded"}},
		{"ADD without napi_defer_hard_irqs answers code 50 naming napiDeferHardIrqs", noKnobs, "ADD", `"threadedNapi":false,"napiDeferHardIrqs":2`, []string{"napiDeferHardIrqs", "Linux 5.10+"}},
		{"STATUS of a config that sets no knob is served without them", noKnobs, "STATUS", `"threadedNapi":false,` + nodeHandoff(t), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conf := `{"cniVersion":"1.1.0","name":"napitap-test","type":"napitap",` + tc.conf + `}`
			script := fmt.Sprintf(`%s && exec env CNI_COMMAND=%s CNI_CONTAINERID=%s CNI_NETNS=%s CNI_IFNAME=tap0 CNI_PATH=%s %s/napitap`,
				tc.hide, tc.command, e.ContainerID, e.Pod.Path(), binDir, binDir)
			cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", script)
			cmd.Stdin = strings.NewReader(conf)
			out, err := cmd.Output()
			if tc.wantIn == nil {
				if err != nil {
					t.Fatalf("%s: %v: %s", tc.command, err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s succeeded: %s", tc.command, out)
			}
			var cniErr types.Error
			if err := json.Unmarshal(out, &cniErr); err != nil {
				t.Fatalf("stdout is not a CNI error: %q", out)
			}
			if cniErr.Code != types.ErrPluginNotAvailable {
				t.Errorf("got code %d %q, want code 50", cniErr.Code, cniErr.Msg)
			}
			for _, want := range tc.wantIn {
				if !strings.Contains(cniErr.Msg, want) {
					t.Errorf("message %q does not name %q", cniErr.Msg, want)
				}
			}
			if links := e.PodLinks(); len(links) != 1 {
				t.Errorf("pod netns: %v, want only lo", links)
			}
		})
	}
}

// TestStatusRefusesAConfigNoADDCouldTake: STATUS answers code 7 naming the
// field for settings that fight, as ADD would, instead of reporting ready.
func TestStatusRefusesAConfigNoADDCouldTake(t *testing.T) {
	cases := []struct{ name, conf, field string }{
		{"more queues than one hand-off message carries", `"queues":254,"handoff":{"mode":"fds"}`, "queues"},
		{"a Kata DAN file with the fd hand-off", `"kataDan":{"enabled":true},"handoff":{"mode":"fds"}`, "kataDan"},
		{"vnetHdr off where the runtime opens the tap by name", `"vnetHdr":false,"handoff":{"mode":"intercept"}`, "vnetHdr"},
	}
	for _, tc := range cases {
		t.Run("STATUS of "+tc.name+" is code 7 naming "+tc.field, func(t *testing.T) {
			cmd := exec.Command(binDir + "/napitap")
			cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=" + binDir}
			cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0","name":"napitap-test","type":"napitap",` + tc.conf + `}`)
			out, err := cmd.Output()
			if err == nil {
				t.Fatalf("STATUS succeeded: %s", out)
			}
			var cniErr types.Error
			if err := json.Unmarshal(out, &cniErr); err != nil {
				t.Fatalf("stdout is not a CNI error: %q", out)
			}
			if cniErr.Code != types.ErrInvalidNetworkConfig || !strings.Contains(cniErr.Msg, tc.field) {
				t.Errorf("got code %d %q, want code 7 naming %s", cniErr.Code, cniErr.Msg, tc.field)
			}
		})
	}
}

func TestNAPIKnobsAreApplied(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	list := e.List("1.1.0", `{"type":"napitap","queues":4,"threadedNapi":true,"groFlushTimeout":50000,"napiDeferHardIrqs":2,`+nodeHandoff(t)+`}`)
	rt := e.RT("tap0")
	e.MustAdd(list, rt)
	t.Cleanup(func() { _ = e.Del(list, rt) })
	got := e.InspectTap("tap0").Sysfs
	if !got.Threaded || got.GROFlushTimeout != 50000 || got.DeferHardIRQs != 2 {
		t.Errorf("threaded=%v gro_flush_timeout=%d napi_defer_hard_irqs=%d, want true 50000 2", got.Threaded, got.GROFlushTimeout, got.DeferHardIRQs)
	}
	if err := e.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}

func TestBadEnvironmentIsCode4(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	conf := `{"cniVersion":"1.1.0","name":"napitap-test","type":"napitap"}`
	cases := []struct {
		name  string
		netns string
	}{
		{"a CNI_NETNS that does not exist", "/run/netns/napitap-no-such-netns"},
		{"a CNI_NETNS that is not a netns", "/proc/self/status"},
	}
	for _, tc := range cases {
		t.Run(tc.name+" is rejected naming CNI_NETNS", func(t *testing.T) {
			args := fmt.Sprintf("CNI_COMMAND=ADD CNI_CONTAINERID=%s CNI_NETNS=%s CNI_IFNAME=tap0 CNI_PATH=%s", e.ContainerID, tc.netns, binDir)
			cmd := exec.Command("env", append(strings.Fields(args), binDir+"/napitap")...)
			cmd.Stdin = strings.NewReader(conf)
			out, _ := cmd.Output()
			var cniErr types.Error
			if err := json.Unmarshal(out, &cniErr); err != nil {
				t.Fatalf("stdout is not a CNI error: %q", out)
			}
			if cniErr.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(cniErr.Msg, "CNI_NETNS") {
				t.Errorf("got code %d %q, want code 4 naming CNI_NETNS", cniErr.Code, cniErr.Msg)
			}
		})
	}
}

// danConfig is Kata runtime-rs's DanConfig as it deserializes the DAN file
// (src/runtime-rs/crates/resource/src/network/dan.rs): what serde requires
// there (no #[serde(default)], not an Option) is a pointer here that must
// be set; fields of napitap's own are ignored there, as here.
type danConfig struct {
	Netns   *string      `json:"netns"`
	Devices *[]danDevice `json:"devices"`
}

type danDevice struct {
	Name     *string `json:"name"`
	GuestMAC string  `json:"guest_mac"`
	Device   *struct {
		Type      string  `json:"type"`
		TapName   *string `json:"tap_name"`
		QueueNum  int     `json:"queue_num"`
		QueueSize int     `json:"queue_size"`
	} `json:"device"`
	NetworkInfo *struct {
		Interface *struct {
			IPAddresses *[]string `json:"ip_addresses"`
			MTU         uint64    `json:"mtu"`
		} `json:"interface"`
		Routes []struct {
			Dest    string `json:"dest"`
			Gateway string `json:"gateway"`
		} `json:"routes"`
	} `json:"network_info"`
}

// readDan decodes the sandbox's DAN file as runtime-rs does, and fails on
// anything runtime-rs would refuse.
func readDan(t *testing.T, dir, sandbox string) (*danConfig, []byte) {
	t.Helper()
	b, err := os.ReadFile(katadan.Path(dir, sandbox))
	if err != nil {
		t.Fatalf("no DAN file: %v", err)
	}
	var dan danConfig
	if err := json.Unmarshal(b, &dan); err != nil {
		t.Fatalf("DAN file %s: %v", b, err)
	}
	if dan.Devices == nil {
		t.Fatalf("DAN file %s lacks devices, which runtime-rs requires", b)
	}
	for i, d := range *dan.Devices {
		if d.Name == nil || d.Device == nil || d.Device.TapName == nil || d.NetworkInfo == nil ||
			d.NetworkInfo.Interface == nil || d.NetworkInfo.Interface.IPAddresses == nil {
			t.Fatalf("DAN file %s: device %d lacks a field runtime-rs requires", b, i)
		}
		if d.Device.Type != "host-tap" {
			t.Errorf("DAN file %s: device %d is %q, want host-tap", b, i, d.Device.Type)
		}
	}
	return &dan, b
}

// TestKataDanTapIsWhereRuntimeRsLooks: runtime-rs looks the DAN tap up by
// name in the netns its shim runs in, the node's, where the CNI plugins
// ran (DESIGN.md fact 18). The tap is there, a port of the bridge plugin's
// bridge, with the pod interface's MAC and address for the guest; the pod
// interface is down; DEL leaves nothing of it on the node.
func TestKataDanTapIsWhereRuntimeRsLooks(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	danDir := t.TempDir()
	list := e.List("1.1.0", e.BridgePlugin(), fmt.Sprintf(`{"type":"napitap","queues":4,"handoff":{"disabled":true},"kataDan":{"enabled":true,"dir":%q}}`, danDir))
	hostBefore := e.HostLinks()
	rt := e.RT("eth0")
	res := e.MustAdd(list, rt)
	deleted := false
	t.Cleanup(func() {
		if !deleted {
			_ = e.Del(list, rt)
		}
	})
	guest, ip := cnitest.GuestOf(t, res, e.ContainerID)

	dan, b := readDan(t, danDir, e.ContainerID)
	if len(*dan.Devices) != 1 {
		t.Fatalf("DAN file %s, want one device", b)
	}
	dev := (*dan.Devices)[0]
	tap := *dev.Device.TapName
	if dan.Netns != nil {
		t.Errorf("DAN file %s names netns %q, which runtime-rs would enter before opening the tap in the node's", b, *dan.Netns)
	}
	if *dev.Name != "eth0" || dev.GuestMAC != guest.Mac || dev.Device.QueueNum != 4 ||
		!slices.Equal(*dev.NetworkInfo.Interface.IPAddresses, []string{ip.Address.String()}) {
		t.Errorf("DAN file %s, want eth0 with 4 queues, MAC %s and %s", b, guest.Mac, ip.Address.String())
	}
	if want := config.NodeTapName(e.ContainerID, "eth0"); tap != want {
		t.Errorf("tap %q, want %q", tap, want)
	}

	// As runtime-rs: by name, in the netns the plugin ran in.
	var bridgeIndex int
	e.Host.Run(t, func() error {
		link, err := netlink.LinkByName(tap)
		if err != nil {
			return fmt.Errorf("runtime-rs's lookup of %q in the node's netns: %w", tap, err)
		}
		br, err := netlink.LinkByName("napibr-" + e.Suffix)
		if err != nil {
			return err
		}
		bridgeIndex = br.Attrs().Index
		if link.Attrs().MasterIndex != bridgeIndex || link.Attrs().Flags&net.FlagUp == 0 || link.Attrs().Alias != tapsetup.OwnerAlias(e.ContainerID, "eth0") {
			return fmt.Errorf("tap %s: master %d up %v alias %q; want up on bridge %d with the attachment's mark",
				tap, link.Attrs().MasterIndex, link.Attrs().Flags&net.FlagUp != 0, link.Attrs().Alias, bridgeIndex)
		}
		return nil
	})
	var nodeEnd int
	e.Pod.Run(t, func() error {
		if _, err := netlink.LinkByName(tap); err == nil {
			return fmt.Errorf("tap %q is in the pod's netns too", tap)
		}
		pod, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		nodeEnd, err = netlink.VethPeerIndex(pod.(*netlink.Veth))
		return err
	})
	e.Host.Run(t, func() error {
		link, err := netlink.LinkByIndex(nodeEnd)
		if err != nil {
			return err
		}
		if link.Attrs().Flags&net.FlagUp != 0 {
			return fmt.Errorf("the pod interface's node end %s is up: the pod would answer for the guest's MAC and address on the bridge", link.Attrs().Name)
		}
		return nil
	})
	for _, iface := range res.Interfaces {
		if iface.Name == tap && iface.Sandbox != "" {
			t.Errorf("result lists tap %s in sandbox %q; it is in the node's netns", tap, iface.Sandbox)
		}
	}
	if err := e.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}

	if err := e.Del(list, rt); err != nil {
		t.Fatal(err)
	}
	deleted = true
	if entries, _ := os.ReadDir(danDir); len(entries) != 0 {
		t.Errorf("DAN dir after DEL: %v", entries)
	}
	// The bridge plugin leaves its bridge.
	if after := e.HostLinks(); len(after) != len(hostBefore)+1 {
		t.Errorf("node netns after DEL: %v, before ADD: %v and no bridge", after, hostBefore)
	}
}

// TestFailedBridgeWiringGivesThePodItsRoutesBack: taking the pod
// interface's addresses takes its routes along; a failed ADD puts both back.
func TestFailedBridgeWiringGivesThePodItsRoutesBack(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	// A default route through the pod interface, as a primary network has.
	withRoute := strings.Replace(e.BridgePlugin(), `"type":"host-local",`, `"type":"host-local","routes":[{"dst":"0.0.0.0/0"}],`, 1)
	if withRoute == e.BridgePlugin() {
		t.Fatalf("cannot add a route to %s", withRoute)
	}
	bridgeOnly := e.List("1.0.0", withRoute)
	rt := e.RT("eth0")
	prev := e.MustAdd(bridgeOnly, rt)
	t.Cleanup(func() { _ = e.Del(bridgeOnly, rt) })
	routes := func() []string {
		var out []string
		e.Pod.Run(t, func() error {
			list, err := netlink.RouteList(nil, netlink.FAMILY_ALL)
			for _, r := range list {
				if r.Dst != nil && r.Dst.IP.IsLinkLocalUnicast() {
					continue // the kernel's, whenever IPv6 autoconf gets to it
				}
				out = append(out, r.String())
			}
			return err
		})
		slices.Sort(out)
		return out
	}
	before, linksBefore := routes(), e.PodLinks()

	notASocket := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notASocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	prevJSON, err := json.Marshal(prev)
	if err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"napitap-test","type":"napitap","wiring":"bridge","handoff":{"socket":%q,"required":true},"prevResult":%s}`, notASocket, prevJSON)
	if err := e.ExecNapitap("ADD", conf, "eth0"); err == nil {
		t.Fatal("ADD succeeded with a handoff socket that is a plain file")
	}
	if after := routes(); !slices.Equal(before, after) {
		t.Errorf("pod routes after the failed ADD:\n%v\nbefore:\n%v", after, before)
	}
	if after := e.PodLinks(); !slices.Equal(linksBefore, after) {
		t.Errorf("pod links after the failed ADD: %v, before: %v", after, linksBefore)
	}
}

// TestStandaloneTapGetsTheIPAMAddressAndRoutes: a route without a gateway
// goes through the address's gateway, one with a gateway through its own,
// and DEL gives the address back to the pool.
func TestStandaloneTapGetsTheIPAMAddressAndRoutes(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	ipam := `{"type":"host-local","subnet":"10.199.0.0/24","gateway":"10.199.0.1","dataDir":"` + filepath.Join(e.DataDir, "ipam") +
		`","routes":[{"dst":"10.196.0.0/16"},{"dst":"10.195.0.0/16","gw":"10.199.0.9"}]}`
	list := e.List("1.1.0", `{"type":"napitap","queues":2,"ipam":`+ipam+`,`+nodeHandoff(t)+`}`)
	rt := e.RT("tap0")
	res := e.MustAdd(list, rt)
	t.Cleanup(func() { _ = e.Del(list, rt) })
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.199.0.2/24" {
		t.Fatalf("result IPs %v", cnitest.MustJSON(res.IPs))
	}

	var addrs, routes []string
	e.Pod.Run(t, func() error {
		tap, err := netlink.LinkByName("tap0")
		if err != nil {
			return err
		}
		list, err := netlink.AddrList(tap, netlink.FAMILY_V4)
		for _, a := range list {
			addrs = append(addrs, a.IPNet.String())
		}
		if err != nil {
			return err
		}
		rlist, err := netlink.RouteList(tap, netlink.FAMILY_V4)
		for _, r := range rlist {
			if r.Gw != nil {
				routes = append(routes, r.Dst.String()+" via "+r.Gw.String())
			}
		}
		return err
	})
	slices.Sort(routes)
	if want := []string{"10.199.0.2/24"}; !slices.Equal(addrs, want) {
		t.Errorf("tap addresses %v, want %v", addrs, want)
	}
	if want := []string{"10.195.0.0/16 via 10.199.0.9", "10.196.0.0/16 via 10.199.0.1"}; !slices.Equal(routes, want) {
		t.Errorf("tap routes %v, want %v", routes, want)
	}
	if err := e.Check(list, rt); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	leases, _ := filepath.Glob(filepath.Join(e.DataDir, "ipam", "*", "10.*"))
	if len(leases) != 1 {
		t.Errorf("host-local leases after ADD: %v, want the one address", leases)
	}
	if err := e.Del(list, rt); err != nil {
		t.Fatal(err)
	}
	leases, _ = filepath.Glob(filepath.Join(e.DataDir, "ipam", "*", "10.*"))
	if len(leases) != 0 {
		t.Errorf("host-local leases after DEL: %v", leases)
	}
}

// TestFailedAddGivesTheIPAMAddressBack: an ADD that fails after IPAM
// handed out an address (here at the hand-off) releases it, and the tap
// goes with it.
func TestFailedAddGivesTheIPAMAddressBack(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	notASocket := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notASocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	before := e.PodLinks()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"napitap-test","type":"napitap","queues":2,"handoff":{"socket":%q,"required":true},"ipam":%s}`, notASocket, e.Ipam())
	if err := e.ExecNapitap("ADD", conf, "tap0"); err == nil {
		t.Fatal("ADD succeeded with a handoff socket that is a plain file")
	}
	if leases, _ := filepath.Glob(filepath.Join(e.DataDir, "ipam", "*", "10.*")); len(leases) != 0 {
		t.Errorf("host-local leases after the failed ADD: %v", leases)
	}
	if after := e.PodLinks(); !slices.Equal(before, after) {
		t.Errorf("pod links after the failed ADD: %v, before: %v", after, before)
	}
}
