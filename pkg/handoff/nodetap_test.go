package handoff_test

import (
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// A Kata DAN tap is in the node's netns, napitapd's own (here a throwaway
// one standing for it), while its attachment belongs to the pod's netns.

// nodeTapAttachment makes tap in node with the attachment's mark and
// returns its intercept-mode attachment, as ADD registers it.
func nodeTapAttachment(t *testing.T, node, pod *nstest.NetNS, key handoff.Key, tap string) *handoff.Attachment {
	t.Helper()
	tapsetup.CloseQueues(newTapAt(t, node.Path(), tap, 2))
	att := attachmentFor(pod, key, "net-kata", tap, 2)
	att.Intercept, att.NodeTap = true, true
	att.TapNetnsID = netnsID(t, node.Path())
	markTap(t, &handoff.Attachment{Key: key, Netns: node.Path(), TapName: tap})
	return att
}

func nodeHas(t *testing.T, node *nstest.NetNS, tap string) bool {
	t.Helper()
	found := false
	node.Run(t, func() error {
		_, err := netlink.LinkByName(tap)
		found = err == nil
		return nil
	})
	return found
}

func TestNapitapdServesATapInItsOwnNetnsForThePodsAttachment(t *testing.T) {
	d := newDaemon(t)
	node, pod := nstest.New(t, "node"), nstest.New(t, "handoff")
	d.srv.NodeNetns = node.Path()
	key := handoff.Key{ContainerID: "kata", IfName: "eth0"}
	att := nodeTapAttachment(t, node, pod, key, "napihok0")
	if err := d.client().Register(att, nil); err != nil {
		t.Fatal(err)
	}
	// The agent looks a tap up by the netns of the runtime's tun fd: the
	// node's, where Kata's shim runs.
	if _, ok := d.srv.Intercepted(netnsID(t, node.Path()), "napihok0"); !ok {
		t.Errorf("the tap is not found in the node's netns")
	}
	if _, ok := d.srv.Intercepted(netnsID(t, pod.Path()), "napihok0"); ok {
		t.Errorf("the tap is found in the pod's netns, where it is not")
	}
	// The pod's netns still there, the tap too: the sweep keeps it.
	if n := d.srv.Sweep(); n != 0 {
		t.Errorf("sweep dropped %d attachments", n)
	}
	if err := d.client().Release(key); err != nil {
		t.Fatal(err)
	}
}

func TestATapInAnotherNetnsThanNapitapdsIsRefused(t *testing.T) {
	d := newDaemon(t)
	node, other, pod := nstest.New(t, "node"), nstest.New(t, "other"), nstest.New(t, "handoff")
	d.srv.NodeNetns = node.Path()
	att := nodeTapAttachment(t, other, pod, handoff.Key{ContainerID: "kata", IfName: "eth0"}, "napihok1")
	err := d.client().Register(att, nil)
	if !handoff.IsCode(err, handoff.CodeBadRequest) || !strings.Contains(err.Error(), "node's netns") {
		t.Errorf("register of a tap in another netns: %v, want bad-request naming the node's netns", err)
	}
}

func TestTheSweepDeletesANodeTapWhosePodIsGoneAndNoOtherLink(t *testing.T) {
	d := newDaemon(t)
	node := nstest.New(t, "node")
	d.srv.NodeNetns = node.Path()
	gone, stays := nstest.New(t, "handoff"), nstest.New(t, "handoff")
	mine := nodeTapAttachment(t, node, gone, handoff.Key{ContainerID: "kata-gone", IfName: "eth0"}, "napihok2")
	alive := nodeTapAttachment(t, node, stays, handoff.Key{ContainerID: "kata-alive", IfName: "eth0"}, "napihok3")
	for _, a := range []*handoff.Attachment{mine, alive} {
		if err := d.client().Register(a, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = d.client().Release(alive.Key) })
	// Someone else's link of the node takes the name of a third attachment
	// whose pod went too: the sweep must leave it alone.
	foreignPod := nstest.New(t, "handoff")
	foreign := nodeTapAttachment(t, node, foreignPod, handoff.Key{ContainerID: "kata-foreign", IfName: "eth0"}, "napihok4")
	if err := d.client().Register(foreign, nil); err != nil {
		t.Fatal(err)
	}
	node.Run(t, func() error {
		link, err := netlink.LinkByName("napihok4")
		if err != nil {
			return err
		}
		return netlink.LinkSetAlias(link, "someone else's")
	})

	// Both pods' netns go without a DEL (a new netns takes each path).
	replaceNetns(t, gone)
	replaceNetns(t, foreignPod)

	if n := d.srv.Sweep(); n != 2 {
		t.Errorf("sweep dropped %d attachments, want 2", n)
	}
	if nodeHas(t, node, "napihok2") {
		t.Errorf("the tap of the pod that went is still in the node's netns")
	}
	if !nodeHas(t, node, "napihok3") {
		t.Errorf("the tap of the pod that stays was deleted")
	}
	if !nodeHas(t, node, "napihok4") {
		t.Errorf("a link marked as someone else's was deleted")
	}
}
