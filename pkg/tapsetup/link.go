package tapsetup

import (
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
)

// Tap is what the kernel reports about a tap, for CHECK and the tests.
type Tap struct {
	Link       *netlink.Tuntap
	MultiQueue bool
	VnetHdr    bool
	Persistent bool
	Up         bool
	// Sysfs holds what netlink cannot tell: owner/group as set (-1 unset),
	// tun_flags, and the NAPI knobs.
	Sysfs SysfsAttrs
}

// Inspect reads the tap name in the netns at netnsPath. It returns an error
// wrapping ErrNotTap when the link exists but is not a tap.
func Inspect(netnsPath, name string) (*Tap, error) {
	var tap Tap
	err := withNetNS(netnsPath, func() error {
		link, err := netlinksafe.LinkByName(name)
		if err != nil {
			return err
		}
		tt, ok := link.(*netlink.Tuntap)
		if !ok || tt.Mode != netlink.TUNTAP_MODE_TAP {
			return fmt.Errorf("%w: it is a %s link", ErrNotTap, link.Type())
		}
		tap.Link = tt
		tap.MultiQueue = tt.Flags&netlink.TUNTAP_MULTI_QUEUE != 0
		tap.VnetHdr = tt.Flags&netlink.TUNTAP_VNET_HDR != 0
		tap.Persistent = !tt.NonPersist
		tap.Up = tt.Attrs().Flags&net.FlagUp != 0
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("tap %q in netns %s: %w", name, netnsPath, err)
	}
	attrs, err := ReadSysfs(netnsPath, name)
	if err != nil {
		return nil, err
	}
	tap.Sysfs = *attrs
	return &tap, nil
}

// ValidateLinkName enforces the kernel's dev_valid_name rules, counted in
// bytes, plus '%', which would make the kernel pick a name of its own, and
// control characters, which have no business in a name.
func ValidateLinkName(name string) error {
	switch {
	case name == "":
		return errors.New("name is empty")
	case len(name) > 15:
		return fmt.Errorf("%q is longer than 15 bytes", name)
	case name == "." || name == "..":
		return fmt.Errorf("%q is not a valid interface name", name)
	case strings.ContainsAny(name, "/:% "):
		return fmt.Errorf("%q contains '/', ':', '%%' or a space", name)
	}
	// Bytes, not runes: the kernel's isspace() also takes 0xa0 for a space.
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 0x20 || c == 0x7f || c == 0xa0 {
			return fmt.Errorf("%q contains a control or space byte 0x%02x", name, c)
		}
	}
	return nil
}

// ErrNotTap marks a link that exists under the tap's name but is no tap,
// or not this attachment's; napitap never deletes such a link.
var ErrNotTap = errors.New("not a tap")

// OwnerAlias is the ifalias that marks the tap of one attachment.
func OwnerAlias(containerID, ifName string) string {
	return "napitap:" + containerID + "/" + ifName
}

// DeleteTap removes the tap name from the current netns. A missing link is
// success. A link that is not a tuntap, or, when owner is given, a tap
// marked as another attachment's, is left alone and reported with
// ErrNotTap. A tap with no mark is taken: an ADD killed between creating
// the tap and marking it leaves one, and every finished napitap tap is
// marked.
func DeleteTap(name, owner string) error {
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("tap %q: %w", name, err)
	}
	if _, ok := link.(*netlink.Tuntap); !ok {
		return fmt.Errorf("tap %q: %w: it is a %s link", name, ErrNotTap, link.Type())
	}
	if alias := link.Attrs().Alias; owner != "" && alias != owner && alias != "" {
		return fmt.Errorf("tap %q: %w of %q: it is marked %q", name, ErrNotTap, owner, alias)
	}
	if err := netlink.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("tap %q: delete: %w", name, err)
	}
	return nil
}

func deleteLink(name string) error {
	link, err := netlinksafe.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkDel(link)
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
