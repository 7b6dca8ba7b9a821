package tapsetup_test

import (
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

func TestRootQdiscIsSetBeforeTheTapGoesUp(t *testing.T) {
	nstest.RequireRoot(t)
	mq := tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}
	cases := []struct {
		name                string
		spec                tapsetup.Spec
		wantDown, wantUp    string
		wantChildrenWhileUp int
	}{
		{"a 4-queue tap with noqueue keeps it once up, and the kernel attaches no mq",
			tapsetup.Spec{Queues: 4, Flags: mq, RootQdisc: tapsetup.QdiscNoqueue}, "noqueue", "noqueue", 0},
		{"a single-queue tap with noqueue keeps it once up",
			tapsetup.Spec{Queues: 1, Flags: tapsetup.QueueFlags{VnetHdr: true}, RootQdisc: tapsetup.QdiscNoqueue}, "noqueue", "noqueue", 0},
		{"a 4-queue tap left to the kernel gets mq with a child per attached queue once up",
			tapsetup.Spec{Queues: 4, Flags: mq}, "noop", "mq", 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "qdisc")
			tc.spec.Name = "napitest0"
			pod.Run(t, func() error {
				link, queues, err := tapsetup.Create(tc.spec)
				if err != nil {
					return err
				}
				defer tapsetup.CloseQueues(queues)
				defer tapsetup.DeleteTap(tc.spec.Name, "")
				if got, err := tapsetup.RootQdisc(link); err != nil || got != tc.wantDown {
					t.Errorf("root qdisc of the new tap: %q (%v), want %q", got, err, tc.wantDown)
				}
				if err := netlink.LinkSetUp(link); err != nil {
					return err
				}
				tap, err := tapsetup.Inspect(pod.Path(), tc.spec.Name)
				if err != nil {
					return err
				}
				if tap.RootQdisc != tc.wantUp {
					t.Errorf("root qdisc once up: %q, want %q", tap.RootQdisc, tc.wantUp)
				}
				qdiscs, err := netlink.QdiscList(link)
				if err != nil {
					return err
				}
				children := 0
				for _, q := range qdiscs {
					if q.Attrs().Parent != netlink.HANDLE_ROOT && q.Attrs().Parent != netlink.HANDLE_INGRESS {
						children++
					}
				}
				if children != tc.wantChildrenWhileUp {
					t.Errorf("%d qdiscs under the root, want %d: %v", children, tc.wantChildrenWhileUp, qdiscs)
				}
				return nil
			})
		})
	}
}
