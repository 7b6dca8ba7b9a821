package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/napitap/napitap/internal/cnitest"
)

// exampleList loads examples/bridge-napitap.conflist (what hack/demo.sh
// runs) with only its paths moved into the test's own dirs, as the demo
// moves the socket.
func exampleList(t *testing.T, e *cnitest.Env, socket string) *libcni.NetworkConfigList {
	t.Helper()
	raw, err := os.ReadFile("../../examples/bridge-napitap.conflist")
	if err != nil {
		t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatalf("examples/bridge-napitap.conflist: %v", err)
	}
	plugins := list["plugins"].([]any)
	plugins[0].(map[string]any)["ipam"].(map[string]any)["dataDir"] = filepath.Join(e.DataDir, "ipam")
	plugins[1].(map[string]any)["handoff"].(map[string]any)["socket"] = socket
	raw, _ = json.Marshal(list)
	conf, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		t.Fatalf("examples/bridge-napitap.conflist: %v", err)
	}
	return conf
}

// TestExampleConflistGivesTheGuestTheRuntimesMAC: a runtime's "mac"
// capability must reach the bridge plugin's eth0, whose MAC the guest takes
// over, and so the result's guest NIC and what napitapd hands out.
func TestExampleConflistGivesTheGuestTheRuntimesMAC(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	d := startNapitapd(t, "")
	list := exampleList(t, e, d.socket)
	const mac = "02:00:00:00:00:aa"
	rt := e.RT("eth0")
	rt.CapabilityArgs = map[string]any{"mac": mac}
	res := e.MustAdd(list, rt)
	t.Cleanup(func() {
		if err := e.Del(list, rt); err != nil {
			t.Errorf("DEL: %v", err)
		}
	})

	guest, _ := cnitest.GuestOf(t, res, e.ContainerID)
	if guest.Mac != mac {
		t.Errorf("guest NIC %q has MAC %s, want the runtime's %s: %s", guest.Name, guest.Mac, mac, cnitest.MustJSON(res))
	}
	atts, err := d.client().List()
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 1 || atts[0].MAC != mac {
		t.Errorf("napitapd holds %+v, want one attachment with guest MAC %s", atts, mac)
	}
	if tap := e.InspectTap("tap0"); tap.Link.Attrs().HardwareAddr.String() == mac {
		t.Errorf("tap0 has the guest's MAC %s too", mac)
	}
}
