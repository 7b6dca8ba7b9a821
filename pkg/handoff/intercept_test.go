package handoff_test

import (
	"os"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// TestInterceptedAttachments: in intercept mode napitapd records the
// attachment without fds, finds it for the seccomp agent by netns and tap
// name, never hands out queues for it, and sweeps it with its tap.
func TestInterceptedAttachments(t *testing.T) {
	nstest.RequireRoot(t)
	pod, d, c := newPodAndDaemon(t)
	other := nstest.New(t, "handoff")
	const tap, queues = "napihoi", 2
	key := handoff.Key{ContainerID: "vmi", IfName: "net1"}
	tapsetup.CloseQueues(newTap(t, pod, tap, queues, nil, nil))
	att := attachmentFor(pod, key, "net-a", tap, queues)
	att.Intercept = true
	markTap(t, att)

	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Register(att, []*os.File{f, f})
	f.Close()
	if !handoff.IsCode(err, handoff.CodeBadRequest) {
		t.Fatalf("register of an intercepted tap with fds: %v, want bad-request", err)
	}
	if err := c.Register(att, nil); err != nil {
		t.Fatalf("register of an intercepted tap without fds: %v", err)
	}

	podID, otherID := netnsID(t, pod.Path()), netnsID(t, other.Path())
	cases := []struct {
		name    string
		netnsID uint64
		tap     string
		want    bool
	}{
		{"the tap in its own netns is found", podID, tap, true},
		{"another name in that netns is not", podID, "napihox", false},
		{"the same name in another netns is not", otherID, tap, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := d.srv.Intercepted(tc.netnsID, tc.tap)
			if ok != tc.want || (ok && got.Key != key) {
				t.Errorf("Intercepted(%d, %q) = %s, %v; want found=%v", tc.netnsID, tc.tap, got.Key, ok, tc.want)
			}
		})
	}

	if _, files, err := c.Fetch(&key); !handoff.IsCode(err, handoff.CodeBadRequest) || len(files) > 0 {
		tapsetup.CloseQueues(files)
		t.Errorf("fetch of an intercepted attachment: %d fds, %v; want bad-request", len(files), err)
	}
	checkAttached(t, pod, tap, 0)

	pod.Run(t, func() error {
		link, err := netlink.LinkByName(tap)
		if err != nil {
			return err
		}
		return netlink.LinkDel(link)
	})
	if n := d.srv.Sweep(); n != 1 {
		t.Errorf("sweep released %d, want the intercepted attachment whose tap went", n)
	}
	if _, ok := d.srv.Intercepted(podID, tap); ok {
		t.Errorf("the swept attachment is still found")
	}
}
