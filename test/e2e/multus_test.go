package e2e

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

// TestMultusStyleDelegation drives a NetworkAttachmentDefinition's conflist
// the way Multus does for a pod whose network selection has cni-args and a
// mac: cni-args land in every plugin as args.cni, the mac as
// runtimeConfig.mac through the "mac" capability.
func TestMultusStyleDelegation(t *testing.T) {
	e := cnitest.NewEnv(t, binDir)
	socket := startNapitapd(t, "").Socket
	const podMAC = "02:4e:41:00:00:07"
	podArgs := `"args":{"cni":{"queues":8,"threadedNapi":true}}`
	bridge := e.BridgePlugin()
	bridge = bridge[:len(bridge)-1] + `,"capabilities":{"mac":true},` + podArgs + `}`
	napitap := fmt.Sprintf(`{"type":"napitap","queues":2,"capabilities":{"mac":true},"handoff":{"socket":%q,"required":true},%s}`, socket, podArgs)
	list := e.List("1.1.0", bridge, napitap)
	rt := e.RT("net1")
	rt.CapabilityArgs = map[string]any{"mac": podMAC}

	res := e.MustAdd(list, rt)
	want := nodecheck.Expect{ContainerID: e.ContainerID, IfName: "net1", TapName: "tap1", Queues: 8, NAPI: true,
		Wiring: "tc-redirect", Socket: socket, Held: 8}
	if err := nodecheck.Present(e.Pod.Path(), want); err != nil {
		t.Fatal(err)
	}
	guest, _ := cnitest.GuestOf(t, res, e.ContainerID)
	if guest.Mac != podMAC {
		raw, _ := json.Marshal(res)
		t.Errorf("guest MAC %s, want the pod's %s: %s", guest.Mac, podMAC, raw)
	}
	tap, err := tapsetup.Inspect(e.Pod.Path(), "tap1")
	if err != nil {
		t.Fatal(err)
	}
	if !tap.Sysfs.Threaded {
		t.Error("cni-args threadedNapi did not reach the tap")
	}
	if tap.Link.Attrs().HardwareAddr.String() == podMAC {
		t.Error("the pod's MAC is on the tap too; it belongs to the guest")
	}

	if err := e.Del(list, rt); err != nil {
		t.Fatal(err)
	}
	if err := nodecheck.Gone(e.Pod.Path(), want); err != nil {
		t.Error(err)
	}
}
