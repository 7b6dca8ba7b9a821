package tapsetup

import (
	"maps"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
)

// In a pod netns: links napitap's temporary names may meet.

func tempTap(name, alias string) func() error {
	return func() error {
		tt := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name}, Mode: netlink.TUNTAP_MODE_TAP}
		if err := netlink.LinkAdd(tt); err != nil {
			return err
		}
		CloseQueues(tt.Fds)
		if alias == "" {
			return nil
		}
		return netlink.LinkSetAlias(tt, alias)
	}
}

func tempBridge(name, alias string, group uint32) func() error {
	return func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, Group: group}}
		if err := netlink.LinkAdd(br); err != nil {
			return err
		}
		if alias == "" {
			return nil
		}
		return netlink.LinkSetAlias(br, alias)
	}
}

func tempVeth(name, alias string) func() error {
	return func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "napipeer" + nstest.RandomSuffix()}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		return netlink.LinkSetAlias(veth, alias)
	}
}

// linkIndexes maps the links of the current netns to their indexes.
func linkIndexes(t *testing.T) map[string]int {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, l := range links {
		m[l.Attrs().Name] = l.Attrs().Index
	}
	return m
}

// drawing makes newTempName return names, then fresh random ones, for the
// rest of the test.
func drawing(t *testing.T, names ...string) {
	random := newTempName
	t.Cleanup(func() { newTempName = random })
	newTempName = func(prefix string) string {
		if len(names) == 0 {
			return random(prefix)
		}
		name := names[0]
		names = names[1:]
		return name
	}
}

// TestATakenTemporaryNameCostsOnlyARetry: a link that holds the temporary
// name napitap draws, whatever its kind, makes it draw another; the link is
// left as it was. Only a run of taken names fails, and leaves nothing.
func TestATakenTemporaryNameCostsOnlyARetry(t *testing.T) {
	nstest.RequireRoot(t)
	owner := OwnerAlias("napitap-test", "net1")
	makeTap := func() error {
		_, queues, err := Create(Spec{Name: "napitest0", Queues: 2, Flags: QueueFlags{MultiQueue: true}, Alias: owner})
		CloseQueues(queues)
		return err
	}
	makeBridge := func() error { return perRequest.createMarkedBridge("napitest0", owner, 1500) }
	const squatted = "napi~t000000000"
	cases := []struct {
		name    string
		squat   func() error
		make    func() error
		drawn   []string
		wantErr bool
	}{
		{"a tap whose temporary name a tap holds is made under the next", tempTap(squatted, ""), makeTap, []string{squatted}, false},
		{"a tap whose temporary name a bridge holds is made under the next", tempBridge(squatted, "", 0), makeTap, []string{squatted}, false},
		{"a bridge whose temporary name a tap holds is made under the next", tempTap(squatted, ""), makeBridge, []string{squatted}, false},
		{"a tap whose every temporary name is taken fails", tempTap(squatted, ""), makeTap, slices.Repeat([]string{squatted}, tempNameTries), true},
		{"a bridge whose every temporary name is taken fails", tempVeth(squatted, owner), makeBridge, slices.Repeat([]string{squatted}, tempNameTries), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			drawing(t, tc.drawn...)
			pod := nstest.New(t, "tempname")
			pod.Run(t, func() error {
				if err := tc.squat(); err != nil {
					return err
				}
				before := linkIndexes(t)
				squatter, err := netlink.LinkByName(squatted)
				if err != nil {
					return err
				}

				err = tc.make()
				if (err != nil) != tc.wantErr {
					t.Fatalf("made with its temporary name taken: %v, want error %v", err, tc.wantErr)
				}
				after := linkIndexes(t)
				if now, err := netlink.LinkByName(squatted); err != nil || now.Attrs().Index != squatter.Attrs().Index ||
					now.Type() != squatter.Type() || now.Attrs().Alias != squatter.Attrs().Alias {
					t.Errorf("the link holding %q changed: %v", squatted, err)
				}
				want := maps.Clone(before)
				if !tc.wantErr {
					made, err := netlink.LinkByName("napitest0")
					if err != nil {
						return err
					}
					if made.Attrs().Alias != owner {
						t.Errorf("%s napitest0 has ifalias %q, want %q", made.Type(), made.Attrs().Alias, owner)
					}
					want["napitest0"] = made.Attrs().Index
				}
				if !maps.Equal(after, want) {
					t.Errorf("links after: %v, want %v", after, want)
				}
				return nil
			})
		})
	}
}

// TestDeleteLeftoversTakesOnlyWhatAKilledAddLeaves: under a temporary name,
// DEL's DeleteLeftovers takes a tap or bridge marked as the attachment's
// and a bridge made with its creation group before it could be marked, and
// nothing else.
func TestDeleteLeftoversTakesOnlyWhatAKilledAddLeaves(t *testing.T) {
	nstest.RequireRoot(t)
	owner := OwnerAlias("napitap-test", "net1")
	other := OwnerAlias("napitap-test", "net2")
	const name = "napi~t123456789"
	cases := []struct {
		name     string
		prepare  func() error
		wantGone bool
	}{
		{"a marked tap, as a kill after TUNSETPERSIST leaves, goes", tempTap(name, owner), true},
		{"a marked bridge, as a kill before the rename leaves, goes", tempBridge(name, owner, 0), true},
		{"an unmarked bridge of the attachment's creation group, as a kill before marking leaves, goes", tempBridge(name, "", creationGroup(owner)), true},
		{"a marked bridge still in the creation group goes", tempBridge(name, owner, creationGroup(owner)), true},
		{"an unmarked tap, which napitap never leaves, stays", tempTap(name, ""), false},
		{"a tap marked as another attachment's stays", tempTap(name, other), false},
		{"an unmarked bridge of another attachment's creation group stays", tempBridge(name, "", creationGroup(other)), false},
		{"an unmarked bridge of the default group stays", tempBridge(name, "", 0), false},
		{"a bridge of the attachment's creation group marked as another's stays", tempBridge(name, other, creationGroup(owner)), false},
		{"a veth marked as the attachment's, a kind napitap never makes, stays", tempVeth(name, owner), false},
		{"a marked tap under a name that is not temporary stays", tempTap("napitest0", owner), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "leftover")
			pod.Run(t, func() error {
				if err := tc.prepare(); err != nil {
					return err
				}
				want := linkIndexes(t)
				if tc.wantGone {
					delete(want, name)
				}
				if err := DeleteLeftovers(owner); err != nil {
					t.Errorf("DeleteLeftovers: %v", err)
				}
				if got := linkIndexes(t); !maps.Equal(got, want) {
					t.Errorf("links after DeleteLeftovers: %v, want %v", got, want)
				}
				return nil
			})
		})
	}
}
