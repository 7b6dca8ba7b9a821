package tapsetup

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// QdiscNoqueue is the root qdisc that holds no packets: the tap's transmit
// goes straight into the queue's ring (tun_net_xmit drops when it is full,
// and never stops the queue). Set before the tap goes up, it keeps the
// kernel from attaching its default, mq over one default_qdisc per tx
// queue: all 256 of a multiqueue tap, each with rings of txqueuelen slots
// (DESIGN.md fact 15).
const QdiscNoqueue = "noqueue"

// setRootQdisc makes kind the root qdisc of link. Called while the link is
// down, so that dev_activate finds a qdisc and attaches no default one.
func (n *Netlink) setRootQdisc(link netlink.Link, kind string) error {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_ROOT},
		QdiscType:  kind,
	}
	if err := n.h.QdiscReplace(q); err != nil {
		return fmt.Errorf("root qdisc %s: %w", kind, err)
	}
	return nil
}

// RootQdisc returns the kind of link's root qdisc in the current netns:
// "noqueue", "mq", "pfifo_fast", ... The kernel does not report its
// built-in noop qdisc, which a link has until it first goes up; that is
// "noop" here.
func RootQdisc(link netlink.Link) (string, error) {
	qdiscs, err := netlinksafe.QdiscList(link)
	if err != nil {
		return "", fmt.Errorf("list qdiscs of %q: %w", link.Attrs().Name, err)
	}
	for _, q := range qdiscs {
		if q.Attrs().Parent == netlink.HANDLE_ROOT {
			return q.Type(), nil
		}
	}
	return "noop", nil
}
