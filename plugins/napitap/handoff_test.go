package main_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/napitap/napitap/internal/cnitest"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/napitap/napitap/pkg/handoff"
)

// napitapd is an in-process napitapd on a socket of the test's own.
type napitapd struct {
	socket, stateDir string
	srv              *handoff.Server
	stop             func()
}

func startNapitapd(t testing.TB, stateDir string) *napitapd {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	d := &napitapd{socket: filepath.Join(t.TempDir(), "napitapd.sock"), stateDir: stateDir}
	var err error
	if d.srv, err = handoff.NewServer(stateDir, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	l, err := handoff.Listen(d.socket, 0o660, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = d.srv.Serve(context.Background(), l); close(done) }()
	d.stop = func() { l.Close(); <-done; d.srv.Close() }
	t.Cleanup(func() { d.stop() })
	return d
}

func (d *napitapd) client() *handoff.Client { return &handoff.Client{Socket: d.socket} }

func handoffConf(socket string, required bool) string {
	return fmt.Sprintf(`"handoff":{"socket":%q,"required":%v}`, socket, required)
}

// nodeHandoff starts a napitapd of the test's own and returns the
// "handoff" member of the default fds mode with its socket: what a node
// runs, and without which a fds-mode ADD fails.
func nodeHandoff(t testing.TB) string {
	t.Helper()
	return fmt.Sprintf(`"handoff":{"socket":%q}`, startNapitapd(t, "").socket)
}

func TestHandoffKeepsTheQueuesUntilDel(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	d := startNapitapd(t, "")
	list := e.List("1.1.0", e.BridgePlugin(), `{"type":"napitap","queues":4,`+handoffConf(d.socket, true)+`}`)
	rt := e.RT("net1")
	res := e.MustAdd(list, rt)

	atts, err := d.client().List()
	if err != nil {
		t.Fatal(err)
	}
	guest, _ := cnitest.GuestOf(t, res, e.ContainerID)
	if len(atts) != 1 || atts[0].Held != 4 || atts[0].TapName != "tap1" || atts[0].MAC != guest.Mac || !atts[0].NAPI || atts[0].Netns != e.Pod.Path() {
		t.Fatalf("napitapd holds %+v, want tap1 with 4 NAPI queues and guest MAC %s", atts, guest.Mac)
	}
	if tap := e.InspectTap("tap1"); tap.Link.Queues != 4 {
		t.Errorf("tap has %d queues attached, want the 4 napitapd holds", tap.Link.Queues)
	}

	if err := e.Del(list, rt); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if atts, _ := d.client().List(); len(atts) != 0 || d.srv.HeldFDs() != 0 {
		t.Errorf("after DEL napitapd holds %+v (%d fds), want nothing", atts, d.srv.HeldFDs())
	}
	if left, _ := filepath.Glob(filepath.Join(d.stateDir, "*")); len(left) != 0 {
		t.Errorf("state files left after DEL: %v", left)
	}
}

// TestHandoffWithoutNapitapd: when napitapd cannot take the attachment,
// ADD fails with code 11 and leaves no tap and no address behind, and
// STATUS answers code 50, except in intercept mode without "required":
// there the runtime's own by-name open still gets queues, if plain ones.
// In fds mode napitapd is the VMM's only way to its queues, so "required"
// makes no difference.
func TestHandoffWithoutNapitapd(t *testing.T) {
	notASocket := filepath.Join(t.TempDir(), "plain-file")
	if err := os.WriteFile(notASocket, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	const nowhere = "/run/napitap-test-nowhere.sock"
	cases := []struct {
		name      string
		mode      string
		socket    string
		required  bool
		wantCode  uint // 0: ADD succeeds
		wantField string
	}{
		{"fds mode with a required napitapd that is down fails ADD with try-again-later", "fds", nowhere, true, types.ErrTryAgainLater, "handoff"},
		{"fds mode with an optional napitapd that is down fails ADD with try-again-later all the same", "fds", nowhere, false, types.ErrTryAgainLater, "handoff"},
		{"intercept mode with a required napitapd that is down fails ADD with try-again-later", "intercept", nowhere, true, types.ErrTryAgainLater, "handoff"},
		{"intercept mode with an optional napitapd that is down lets ADD succeed", "intercept", nowhere, false, 0, ""},
		{"a socket path that is a plain file is a config error", "fds", notASocket, false, types.ErrInvalidNetworkConfig, "handoff.socket"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			before := e.PodLinks()
			list := e.List("1.1.0", fmt.Sprintf(`{"type":"napitap","queues":2,"handoff":{"mode":%q,"socket":%q,"required":%v},"ipam":%s}`,
				tc.mode, tc.socket, tc.required, e.Ipam()))
			rt := e.RT("tap0")
			leases := func() []string {
				l, _ := filepath.Glob(filepath.Join(e.DataDir, "ipam", "*", "10.*"))
				return l
			}
			status := e.InHost(func() error { return e.CNI.GetStatusNetworkList(context.Background(), list) })
			if code := cnitest.CNICode(status); (tc.wantCode == 0) != (status == nil) || status != nil && code != types.ErrPluginNotAvailable {
				t.Errorf("STATUS: %v (code %d), want it to fail with code %d exactly when ADD does", status, code, types.ErrPluginNotAvailable)
			}
			_, err := e.Add(list, rt)
			if tc.wantCode == 0 {
				if err != nil {
					t.Fatalf("ADD: %v", err)
				}
				e.InspectTap("tap0")
				if err := e.Del(list, rt); err != nil {
					t.Errorf("DEL with napitapd down: %v", err)
				}
				return
			}
			if code := cnitest.CNICode(err); code != tc.wantCode || !strings.HasPrefix(cnitest.CNIError(err).Msg, tc.wantField) {
				t.Errorf("ADD: %v (code %d), want code %d naming %s", err, code, tc.wantCode, tc.wantField)
			}
			for what, err := range map[string]error{"ADD": err, "STATUS": status} {
				if n := strings.Count(fmt.Sprint(err), tc.socket); err != nil && n != 1 {
					t.Errorf("%s: %v names the socket %d times, want once", what, err, n)
				}
			}
			if after := e.PodLinks(); !slices.Equal(before, after) {
				t.Errorf("pod netns after failed ADD: %v, before: %v", after, before)
			}
			if l := leases(); len(l) != 0 {
				t.Errorf("host-local leases after the failed ADD: %v", l)
			}
		})
	}
}

// TestInterceptRecordsAsManyQueuesAsATapHas: napitapd holds no fds for an
// intercept-mode attachment, so it records any queue count a tap can have
// (MAX_TAP_QUEUES, 256), beyond the 253 fds one message carries in fds
// mode.
func TestInterceptRecordsAsManyQueuesAsATapHas(t *testing.T) {
	for _, queues := range []int{254, 256} {
		t.Run(fmt.Sprintf("an intercept-mode tap of %d queues is recorded", queues), func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			d := startNapitapd(t, "")
			list := e.List("1.1.0", fmt.Sprintf(`{"type":"napitap","queues":%d,"handoff":{"mode":"intercept","socket":%q,"required":true}}`, queues, d.socket))
			rt := e.RT("tap0")
			e.MustAdd(list, rt)
			t.Cleanup(func() { _ = e.Del(list, rt) })
			atts, err := d.client().List()
			if err != nil {
				t.Fatal(err)
			}
			if len(atts) != 1 || atts[0].Queues != queues || !atts[0].Intercept || atts[0].Held != 0 {
				t.Errorf("napitapd records %+v, want tap0 of %d queues, intercepted, no fds held", atts, queues)
			}
		})
	}
}

func TestGCReleasesWhatTheRuntimeNoLongerLists(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	d := startNapitapd(t, "")
	list := e.List("1.1.0", `{"type":"napitap","queues":2,`+handoffConf(d.socket, true)+`}`)
	kept, dropped := e.RT("tap0"), e.RT("tap1")
	dropped.ContainerID = e.ContainerID + "-crashed"
	e.MustAdd(list, kept)
	e.MustAdd(list, dropped)
	t.Cleanup(func() { _ = e.Del(list, kept); _ = e.Del(list, dropped) })

	valid := []types.GCAttachment{{ContainerID: kept.ContainerID, IfName: kept.IfName}}
	if err := e.GC(list, valid); err != nil {
		t.Fatalf("GC: %v", err)
	}
	atts, err := d.client().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].ContainerID != kept.ContainerID || d.srv.HeldFDs() != 2 {
		t.Errorf("after GC napitapd holds %+v (%d fds), want only %s with 2", atts, d.srv.HeldFDs(), kept.ContainerID)
	}
	links := e.PodLinks()
	if !slices.ContainsFunc(links, func(l string) bool { return strings.HasPrefix(l, "tap0/") }) ||
		slices.ContainsFunc(links, func(l string) bool { return strings.HasPrefix(l, "tap1/") }) {
		t.Errorf("pod links after GC: %v, want tap0 kept and tap1 removed", links)
	}
}

// TestGCAfterARuntimeCrash: the runtime lost every pod without DEL; a GC
// with no valid attachments leaves nothing of napitap's on the node.
func TestGCAfterARuntimeCrash(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	d := startNapitapd(t, "")
	danDir := t.TempDir()
	list := e.List("1.1.0", e.BridgePlugin(), fmt.Sprintf(`{"type":"napitap","queues":2,%s}`, handoffConf(d.socket, true)))
	rt := e.RT("eth0")
	e.MustAdd(list, rt)
	t.Cleanup(func() { _ = e.Del(list, rt) })
	// A Kata pod on another network of the node, whose tap is in the
	// node's netns (Kata opens its tap itself: no hand-off).
	kataList := e.ListNamed("napitap-kata", "1.1.0", e.BridgePlugin(), fmt.Sprintf(`{"type":"napitap","queues":2,"handoff":{"disabled":true},"kataDan":{"enabled":true,"dir":%q}}`, danDir))
	kataRT := e.RT("tap7")
	kataRT.ContainerID += "-kata"
	e.MustAdd(kataList, kataRT)
	t.Cleanup(func() { _ = e.Del(kataList, kataRT) })

	for _, l := range []*libcni.NetworkConfigList{list, kataList} {
		if err := e.GC(l, nil); err != nil {
			t.Fatalf("GC: %v", err)
		}
	}
	if atts, _ := d.client().List(); len(atts) != 0 || d.srv.HeldFDs() != 0 {
		t.Errorf("napitapd after GC: %+v (%d fds)", atts, d.srv.HeldFDs())
	}
	for _, l := range e.PodLinks() {
		if strings.HasPrefix(l, "tap0/") || strings.HasSuffix(l, "/redirect") {
			t.Errorf("pod netns after GC still has %s", l)
		}
	}
	for _, l := range e.HostLinks() {
		if strings.HasPrefix(l, "ktap") {
			t.Errorf("node netns after GC still has the Kata tap %s", l)
		}
	}
	if entries, _ := os.ReadDir(danDir); len(entries) != 0 {
		t.Errorf("DAN files after GC: %v", entries)
	}
	if left, _ := filepath.Glob(filepath.Join(d.stateDir, "*")); len(left) != 0 {
		t.Errorf("napitapd state after GC: %v", left)
	}
}

func TestDelWithNapitapdDownIsSweptLater(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	d := startNapitapd(t, "")
	list := e.List("1.1.0", `{"type":"napitap","queues":2,`+handoffConf(d.socket, true)+`}`)
	rt := e.RT("tap0")
	e.MustAdd(list, rt)
	d.stop()
	d.stop = func() {}
	if err := e.Del(list, rt); err != nil {
		t.Fatalf("DEL with napitapd down: %v", err)
	}
	restarted := startNapitapd(t, d.stateDir)
	if atts, _ := restarted.client().List(); len(atts) != 0 {
		t.Errorf("a restarted napitapd still lists %+v whose tap is gone", atts)
	}
	if left, _ := filepath.Glob(filepath.Join(d.stateDir, "*")); len(left) != 0 {
		t.Errorf("state files left: %v", left)
	}
}

// TestStandaloneTapGetsAGuestMAC: with wiring "none" there is no pod
// interface to take a MAC from, so napitapd must still hand out one for
// napitapctl's {mac}: locally administered unicast, not the tap's, and the
// same for the same attachment after DEL and ADD again.
func TestStandaloneTapGetsAGuestMAC(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	d := startNapitapd(t, "")
	list := e.List("1.1.0", `{"type":"napitap","queues":2,"wiring":"none",`+handoffConf(d.socket, true)+`}`)
	rt := e.RT("tap0")
	var macs []string
	for round := range 2 {
		e.MustAdd(list, rt)
		atts, err := d.client().List()
		if err != nil {
			t.Fatal(err)
		}
		if len(atts) != 1 {
			t.Fatalf("round %d: napitapd holds %+v, want one attachment", round, atts)
		}
		mac, err := net.ParseMAC(atts[0].MAC)
		if err != nil || mac[0]&0x03 != 0x02 {
			t.Errorf("round %d: guest MAC %q, want a locally administered unicast MAC", round, atts[0].MAC)
		}
		if tapMAC := e.InspectTap("tap0").Link.Attrs().HardwareAddr.String(); atts[0].MAC == tapMAC {
			t.Errorf("round %d: guest MAC %s is the tap's own", round, tapMAC)
		}
		macs = append(macs, atts[0].MAC)
		if err := e.Del(list, rt); err != nil {
			t.Fatalf("DEL: %v", err)
		}
	}
	if macs[0] != macs[1] {
		t.Errorf("guest MACs %v: want the same for the same attachment", macs)
	}
}
