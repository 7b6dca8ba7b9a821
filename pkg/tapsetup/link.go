package tapsetup

import (
	"crypto/sha256"
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

// ErrBusy marks a temporary name (TempTapName, TempBridgeName) that is
// taken. DEL removes what a killed ADD left under one.
var ErrBusy = errors.New("another ADD of this attachment is under way, or DEL has not yet run after one that was killed")

// OwnerAlias is the ifalias that marks the tap and bridge of one
// attachment.
func OwnerAlias(containerID, ifName string) string {
	return "napitap:" + containerID + "/" + ifName
}

// TempTapName and TempBridgeName are the names Create and WireBridge give
// the links of the attachment marked owner until they carry the mark. Only
// then do the links take their real names, so that a link under a real name
// is napitap's only if it is marked, and an unmarked link under a temporary
// name can only be what a killed ADD left. The kernel does not set an
// ifalias in the RTM_NEWLINK that creates a link, and tun taps cannot be
// made by RTM_NEWLINK at all (tun_newlink: EOPNOTSUPP), so the mark cannot
// come with the link. '~' keeps them apart from names people choose; 36
// bits of hash keep two attachments of one pod apart.
func TempTapName(owner string) string { return tempName("napi~t", owner) }

// TempBridgeName: see TempTapName.
func TempBridgeName(owner string) string { return tempName("napi~b", owner) }

// IsTempName reports a name of TempTapName's or TempBridgeName's form.
func IsTempName(name string) bool { return strings.HasPrefix(name, "napi~") }

func tempName(prefix, owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return prefix + hex.EncodeToString(sum[:])[:15-len(prefix)]
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
	link, err := netlinksafe.LinkByName(name)
	if err == nil {
		return ExistsError{link.Type(), link.Attrs().Alias}
	}
	if isNotFound(err) {
		return nil
	}
	return err
}

// DeleteTap removes the tap name from the current netns if it is a tuntap
// link marked owner. An empty owner takes any tuntap link: for a name only
// napitap uses (TempTapName) or a tap the caller made itself. A missing
// link is success; any other link is left alone and reported with
// ErrNotTap.
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
	if alias := link.Attrs().Alias; owner != "" && alias != owner {
		if alias == "" {
			return fmt.Errorf("tap %q: %w of %q: it has no ifalias, napitap did not make it", name, ErrNotTap, owner)
		}
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
