package main_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// In the pod netns of a badInputFixture: links napitap did not make.

func foreignTap(name, alias string) func() error {
	return func() error {
		tap := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP}
		if err := netlink.LinkAdd(tap); err != nil {
			return err
		}
		tapsetup.CloseQueues(tap.Fds)
		if alias != "" {
			if err := netlink.LinkSetAlias(tap, alias); err != nil {
				return err
			}
		}
		return netlink.LinkSetUp(tap)
	}
}

func foreignVeth(name string) func() error {
	return func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
			return err
		}
		link, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	}
}

// foreignBridge makes a bridge with eth0 as its port, as KubeVirt's bridge
// binding leaves its own.
func foreignBridge(name string) func() error {
	return func() error {
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return err
		}
		br, err := netlink.LinkByName(name)
		if err != nil {
			return err
		}
		eth0, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(eth0, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	}
}

// A prevResult whose eth0 has another MAC, address and route than the pod's
// eth0 has: what DEL would give eth0 back if it took the bridge for its own.
const otherPrevResult = `"prevResult":{"cniVersion":"1.0.0",` +
	`"interfaces":[{"name":"eth0","mac":"02:4e:41:00:00:09","sandbox":"$POD"}],` +
	`"ips":[{"address":"10.199.9.9/24","gateway":"10.199.9.1","interface":0}],` +
	`"routes":[{"dst":"10.198.0.0/16"}]}`

// TestFailedAddAndItsDelLeaveOthersLinksAlone: an ADD that finds the tap's
// or bridge's name taken fails with the code of whoever chose the name,
// naming the field and the link, and changes nothing; the DEL the runtime
// must send after it deletes nothing napitap did not make and leaves the
// pod interface's MAC, addresses and routes as they are.
func TestFailedAddAndItsDelLeaveOthersLinksAlone(t *testing.T) {
	cases := []struct {
		name       string
		prepare    func() error
		fields     string
		standalone bool
		code       uint
		want       string   // how the message starts
		mentions   []string // what else it must say
	}{
		{
			name:       "a foreign tap named by tapName survives a standalone ADD and its DEL",
			prepare:    foreignTap("vmtap0", ""),
			fields:     `"tapName":"vmtap0"`,
			standalone: true,
			code:       types.ErrInvalidNetworkConfig,
			want:       `tapName: tap "vmtap0" in netns `,
			mentions:   []string{"a tuntap link of that name already exists (no ifalias)"},
		},
		{
			name:     "KubeVirt's unmarked tap0 survives a chained ADD that defaults to its name, and its DEL",
			prepare:  foreignTap("tap0", ""),
			code:     types.ErrInvalidEnvironmentVariables,
			want:     `CNI_IFNAME: tap "tap0" (named after CNI_IFNAME "eth0") in netns `,
			mentions: []string{"a tuntap link of that name already exists (no ifalias)"},
		},
		{
			name:       "a tap marked as another attachment's survives a standalone ADD of CNI_IFNAME tap0, and its DEL",
			prepare:    foreignTap("tap0", tapsetup.OwnerAlias("napitap-other", "tap0")),
			standalone: true,
			code:       types.ErrInvalidEnvironmentVariables,
			want:       `CNI_IFNAME: tap "tap0" in netns `,
			mentions:   []string{`ifalias "napitap:napitap-other/tap0"`},
		},
		{
			name:     "a veth named by tapName survives a chained ADD and its DEL",
			prepare:  foreignVeth("vmtap0"),
			fields:   `"tapName":"vmtap0"`,
			code:     types.ErrInvalidNetworkConfig,
			want:     `tapName: tap "vmtap0" in netns `,
			mentions: []string{"a veth link of that name already exists"},
		},
		{
			name:     "a foreign br0 named by bridge survives bridge wiring's ADD and its DEL, and eth0 keeps its MAC, addresses and routes",
			prepare:  foreignBridge("br0"),
			fields:   `"wiring":"bridge","bridge":"br0",` + otherPrevResult,
			code:     types.ErrInvalidNetworkConfig,
			want:     `bridge: bridge "br0" in netns `,
			mentions: []string{"a bridge link of that name already exists (no ifalias)"},
		},
		{
			name:     "a foreign bridge of the name defaulted from tapName survives bridge wiring's ADD and its DEL",
			prepare:  foreignBridge("br-vmtap0"),
			fields:   `"wiring":"bridge","tapName":"vmtap0",` + otherPrevResult,
			code:     types.ErrInvalidNetworkConfig,
			want:     `bridge: bridge "br-vmtap0" (named after tapName "vmtap0") in netns `,
			mentions: []string{"already exists"},
		},
		{
			name:     "a foreign bridge of the name defaulted from CNI_IFNAME survives bridge wiring's ADD and its DEL",
			prepare:  foreignBridge("br-tap0"),
			fields:   `"wiring":"bridge",` + otherPrevResult,
			code:     types.ErrInvalidEnvironmentVariables,
			want:     `CNI_IFNAME: bridge "br-tap0" (named after CNI_IFNAME "eth0") in netns `,
			mentions: []string{"already exists"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newBadInputFixture(t)
			f.e.Pod.Run(t, tc.prepare)
			before := f.snapshot()
			bad := badInput{fields: tc.fields, standalone: tc.standalone}
			conf, ifName := f.conf(bad), f.ifName(bad)

			err := f.e.ExecNapitap("ADD", conf, ifName)
			if err == nil {
				t.Fatal("ADD succeeded")
			}
			cniErr := cnitest.CNIError(err)
			if cniErr.Code != tc.code || !strings.HasPrefix(cniErr.Msg, tc.want) {
				t.Errorf("ADD: code %d %q, want code %d starting %q", cniErr.Code, cniErr.Msg, tc.code, tc.want)
			}
			for _, m := range tc.mentions {
				if !strings.Contains(cniErr.Msg, m) {
					t.Errorf("ADD: %q does not say %q", cniErr.Msg, m)
				}
			}
			requireSameNode(t, f, before, "after the failed ADD")

			// With the previous plugin's result, and without one, as libcni
			// sends DEL when it has no cached result.
			bad.omit = []string{"prevResult"}
			for _, del := range []struct{ what, conf string }{{"DEL with prevResult", conf}, {"DEL without prevResult", f.conf(bad)}} {
				if err := f.e.ExecNapitap("DEL", del.conf, ifName); err != nil {
					t.Errorf("%s after the failed ADD: %v", del.what, err)
				}
				requireSameNode(t, f, before, "after "+del.what)
			}
		})
	}
}

// tempName is a name of napitap's temporary form, 15 bytes like its own.
func tempName(prefix string) string { return prefix + "0" + nstest.RandomSuffix() + "00" }

// foreignMarkedBridge makes an empty bridge, as WireBridge does before it
// renames one.
func foreignMarkedBridge(name, alias string) func() error {
	return func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		return netlink.LinkSetAlias(br, alias)
	}
}

// foreignMarkedVeth makes a veth with a short peer, marked alias.
func foreignMarkedVeth(name, alias string) func() error {
	return func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "napipeer" + nstest.RandomSuffix()}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		if alias == "" {
			return nil
		}
		return netlink.LinkSetAlias(veth, alias)
	}
}

// TestDelRemovesWhatAKilledAddLeftUnderATemporaryName: an ADD killed
// after making a link persistent and before renaming it leaves it under a
// temporary name, marked as the attachment's. It does not stand in the way
// of the next ADD; DEL removes it with the rest, and leaves alone what
// napitap did not make, whatever its name.
func TestDelRemovesWhatAKilledAddLeftUnderATemporaryName(t *testing.T) {
	// The wiring is given: the prevResult DEL gets here is the previous
	// plugin's, not ADD's, which would tell it. Bridge wiring's comes
	// without routes, so that DEL gives eth0 back only what it has.
	const (
		redirect = `"wiring":"tc-redirect"`
		bridged  = `"wiring":"bridge","prevResult":{"cniVersion":"1.0.0",` +
			`"interfaces":[{"name":"eth0","mac":"$PEERMAC","sandbox":"$POD"}],` +
			`"ips":[{"address":"10.199.0.2/24","interface":0}]}`
	)
	cases := []struct {
		name     string
		leftover func(name, owner string) func() error
		prefix   string
		fields   string
		wantGone bool
	}{
		{"a marked tap, as a kill right before the rename leaves, goes with DEL", foreignTap, "napi~t", redirect, true},
		{"a marked bridge, as a kill right before the rename leaves, goes with DEL", foreignMarkedBridge, "napi~b", bridged, true},
		{"an unmarked tap, which napitap never leaves, stays after DEL", func(name, _ string) func() error { return foreignTap(name, "") }, "napi~t", redirect, false},
		{"a veth marked as the attachment's, a kind napitap never makes, stays after DEL", foreignMarkedVeth, "napi~t", redirect, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newBadInputFixture(t)
			bad := badInput{fields: tc.fields}
			conf, ifName := f.conf(bad), f.ifName(bad)
			clean := f.snapshot()
			f.e.Pod.Run(t, tc.leftover(tempName(tc.prefix), tapsetup.OwnerAlias(f.e.ContainerID, ifName)))
			withLeftover := f.snapshot()

			if err := f.e.ExecNapitap("ADD", conf, ifName); err != nil {
				t.Fatalf("ADD beside the leftover: %v", err)
			}
			if err := f.e.ExecNapitap("DEL", conf, ifName); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if tc.wantGone {
				requireSameNode(t, f, clean, "after DEL")
			} else {
				requireSameNode(t, f, withLeftover, "after DEL")
			}
		})
	}
}

// TestAPodCannotSquatTheTemporaryNamesOfItsNextAdd: pod root watches an
// ADD's temporary names go by (ip monitor) and, after the DEL of an unplug,
// takes every one of them with links DEL never deletes. The next ADD of the
// same attachment, a hot-plug, still works, and its DEL leaves those links
// alone.
func TestAPodCannotSquatTheTemporaryNamesOfItsNextAdd(t *testing.T) {
	f := newBadInputFixture(t)
	bad := badInput{fields: `"wiring":"bridge"`}
	conf, ifName := f.conf(bad), f.ifName(bad)
	watch := f.e.Pod.WatchLinkNames(t)
	if err := f.e.ExecNapitap("ADD", conf, ifName); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	if err := f.e.ExecNapitap("DEL", conf, ifName); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	var seen []string
	for _, name := range watch() {
		if tapsetup.IsTempName(name) && !slices.Contains(seen, name) {
			seen = append(seen, name)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("the ADD's temporary names: %q, want one for the tap and one for the bridge", seen)
	}
	for _, name := range seen {
		f.e.Pod.Run(t, foreignMarkedVeth(name, ""))
	}
	squatted := f.snapshot()

	if err := f.e.ExecNapitap("ADD", conf, ifName); err != nil {
		t.Fatalf("ADD with its earlier temporary names taken: %v", err)
	}
	if err := f.e.ExecNapitap("DEL", conf, ifName); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	requireSameNode(t, f, squatted, "after DEL")
}

// TestAddMarksItsTapAndBridge: what DEL goes by is there after ADD.
func TestAddMarksItsTapAndBridge(t *testing.T) {
	f := newBadInputFixture(t)
	bad := badInput{fields: `"wiring":"bridge"`}
	conf, ifName := f.conf(bad), f.ifName(bad)
	if err := f.e.ExecNapitap("ADD", conf, ifName); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	t.Cleanup(func() { _ = f.e.ExecNapitap("DEL", conf, ifName) })
	owner := tapsetup.OwnerAlias(f.e.ContainerID, ifName)
	f.e.Pod.Run(t, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		marked := map[string]string{}
		for _, l := range links {
			if tapsetup.IsTempName(l.Attrs().Name) {
				t.Errorf("%q is left under a temporary name", l.Attrs().Name)
			}
			marked[l.Attrs().Name] = l.Attrs().Alias
		}
		for _, name := range []string{"tap0", "br-tap0"} {
			if marked[name] != owner {
				t.Errorf("%s has ifalias %q, want %q", name, marked[name], owner)
			}
		}
		if marked["eth0"] != "" {
			t.Errorf("eth0 has ifalias %q, want none", marked["eth0"])
		}
		return nil
	})
}

// requireSameNode fails the test if the node differs from before.
func requireSameNode(t *testing.T, f *badInputFixture, before []string, what string) {
	t.Helper()
	if gone, added := diffLines(before, f.snapshot()); len(gone)+len(added) > 0 {
		t.Errorf("%s the node changed:\n  gone:  %s\n  added: %s", what,
			strings.Join(gone, "\n         "), strings.Join(added, "\n         "))
	}
}
