package tapsetup

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Tap is what the kernel reports about a tap, for CHECK and the tests.
type Tap struct {
	Link       *netlink.Tuntap
	MultiQueue bool
	VnetHdr    bool
	Persistent bool
	Up         bool
	// RootQdisc is the kind of the root qdisc (RootQdisc).
	RootQdisc string
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
		tap.RootQdisc, err = RootQdisc(tt)
		return err
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

// ErrExists marks a name another link holds already: napitap never takes
// over, changes or deletes such a link.
var ErrExists = errors.New("a link of that name already exists")

// OwnerAlias is the ifalias that marks the tap and bridge of one
// attachment.
func OwnerAlias(containerID, ifName string) string {
	return "napitap:" + containerID + "/" + ifName
}

// Prefixes of the temporary names; '~' keeps them apart from names people
// choose.
const (
	tempTapPrefix    = "napi~t"
	tempBridgePrefix = "napi~b"
)

// IsTempName reports a name of the form of the temporary names Create and
// WireBridge make links under. A link takes its real name only once it
// carries its attachment's mark, so that a link under a real name is
// napitap's only if it is marked. The kernel does not set an ifalias in
// the RTM_NEWLINK that creates a link, and tun taps cannot be made by
// RTM_NEWLINK at all (tun_newlink: EOPNOTSUPP), so the mark cannot come
// with the link. The names are random, never derived from the attachment:
// a pod that could work out the name of its next ADD (a hot-plug) could
// take it first and block that ADD. A name that is taken costs a retry.
func IsTempName(name string) bool { return strings.HasPrefix(name, "napi~") }

// newTempName is prefix and 9 random hex digits (36 bits), 15 bytes in
// all. A variable so that a test can make it collide.
var newTempName = func(prefix string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return prefix + hex.EncodeToString(b)[:15-len(prefix)]
}

// tempNameTries bounds the retries: with 36 random bits, even a second
// taken name is a sign of something else at work.
const tempNameTries = 8

// underTempName calls create with fresh temporary names until one is free
// and returns that name. create reports a name already in use with EEXIST
// or, for TUNSETIFF with IFF_TUN_EXCL, EBUSY.
func underTempName(prefix string, create func(name string) error) (string, error) {
	for range tempNameTries {
		name := newTempName(prefix)
		err := create(name)
		if !errors.Is(err, unix.EEXIST) && !errors.Is(err, unix.EBUSY) {
			return name, err
		}
	}
	return "", fmt.Errorf("%d random temporary names %s… in a row are taken", tempNameTries, prefix)
}

// creationGroup is the device group a bridge is made with until it
// carries the mark owner: the mark cannot come with the RTM_NEWLINK that
// makes it, the group can. 0, the kernel's default, is never one.
func creationGroup(owner string) uint32 {
	sum := sha256.Sum256([]byte("napitap-creation-group:" + owner))
	return max(binary.BigEndian.Uint32(sum[:4]), 1)
}

// DeleteLeftovers removes from the current netns what an ADD killed
// half-way left under temporary names: the taps marked owner, and the
// bridges marked owner or, if killed before marking, made with owner's
// creationGroup. A tap becomes persistent only once marked (Create), so an
// unmarked one never outlives its ADD. Any other link is left alone: it is
// not napitap's, or napitap cannot tell it from one that is not.
func DeleteLeftovers(owner string) error {
	return perRequest.DeleteLeftovers(owner)
}

// DeleteLeftovers is DeleteLeftovers on n's socket.
func (n *Netlink) DeleteLeftovers(owner string) error {
	if owner == "" {
		return errors.New("no mark to tell leftovers by")
	}
	links, err := n.safe().LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	for _, link := range links {
		attrs := link.Attrs()
		if !IsTempName(attrs.Name) {
			continue
		}
		switch link.(type) {
		case *netlink.Tuntap:
			if attrs.Alias != owner {
				continue
			}
		case *netlink.Bridge:
			unmarked := attrs.Alias == "" && attrs.Group == creationGroup(owner)
			if attrs.Alias != owner && !unmarked {
				continue
			}
		default:
			continue
		}
		if err := n.h.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("%s %q: delete: %w", link.Type(), attrs.Name, err)
		}
	}
	return nil
}

// ExistsError is ErrExists for one link, saying what it is and how it is
// marked, so that the error tells whose it may be.
type ExistsError struct{ Type, Alias string }

func (e ExistsError) Error() string {
	mark := "no ifalias"
	if e.Alias != "" {
		mark = fmt.Sprintf("ifalias %q", e.Alias)
	}
	return fmt.Sprintf("a %s link of that name already exists (%s)", e.Type, mark)
}

func (e ExistsError) Is(target error) bool { return target == ErrExists || target == unix.EEXIST }

// RequireFree fails with an ExistsError when a link called name exists in
// the current netns.
func RequireFree(name string) error {
	return perRequest.RequireFree(name)
}

// RequireFree is RequireFree on n's socket.
func (n *Netlink) RequireFree(name string) error {
	link, err := n.safe().LinkByName(name)
	if err == nil {
		return ExistsError{link.Type(), link.Attrs().Alias}
	}
	if isNotFound(err) {
		return nil
	}
	return err
}

// DeleteTap removes the tap name from the current netns if it is a tuntap
// link marked owner. An empty owner takes any tuntap link, for a tap the
// caller made itself. A missing link is success; any other link is left
// alone and reported with ErrNotTap.
func DeleteTap(name, owner string) error {
	return perRequest.DeleteTap(name, owner)
}

// DeleteTap is DeleteTap on n's socket.
func (n *Netlink) DeleteTap(name, owner string) error {
	link, err := n.safe().LinkByName(name)
	if err != nil {
		if isNotFound(err) {
			return nil
		}
		return fmt.Errorf("tap %q: %w", name, err)
	}
	if _, ok := link.(*netlink.Tuntap); !ok {
		return fmt.Errorf("tap %q: %w: it is a %s link", name, ErrNotTap, link.Type())
	}
	if alias := link.Attrs().Alias; owner != "" && alias != owner {
		if alias == "" {
			return fmt.Errorf("tap %q: %w of %q: it has no ifalias, napitap did not make it", name, ErrNotTap, owner)
		}
		return fmt.Errorf("tap %q: %w of %q: it is marked %q", name, ErrNotTap, owner, alias)
	}
	if err := n.h.LinkDel(link); err != nil && !isNotFound(err) {
		return fmt.Errorf("tap %q: delete: %w", name, err)
	}
	return nil
}

func (n *Netlink) deleteLink(name string) error {
	link, err := n.safe().LinkByName(name)
	if err != nil {
		return err
	}
	return n.h.LinkDel(link)
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}
