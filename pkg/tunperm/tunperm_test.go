package tunperm

import (
	"testing"

	"github.com/napitap/napitap/pkg/peer"
)

func TestMayAttachFollowsTheKernel(t *testing.T) {
	u := func(v uint32) *uint32 { return &v }
	cases := []struct {
		name         string
		creds        peer.Creds
		owner, group *uint32
		want         bool
	}{
		{"anyone may attach a tap with neither owner nor group", peer.Creds{EUID: 3000, EGID: 3000}, nil, nil, true},
		{"the owner may attach a tap with only an owner", peer.Creds{EUID: 107, EGID: 3000}, u(107), nil, true},
		{"another uid may not attach a tap with only an owner", peer.Creds{EUID: 3000, EGID: 108}, u(107), nil, false},
		{"the group may attach a tap with only a group", peer.Creds{EUID: 3000, EGID: 108}, nil, u(108), true},
		{"a supplementary group counts", peer.Creds{EUID: 3000, EGID: 3000, Groups: []uint32{5, 108}}, nil, u(108), true},
		{"owner and group both set need both", peer.Creds{EUID: 107, EGID: 108}, u(107), u(108), true},
		{"the owner outside the group may not attach when both are set", peer.Creds{EUID: 107, EGID: 3000}, u(107), u(108), false},
		{"the group without the owner may not attach when both are set", peer.Creds{EUID: 3000, EGID: 108}, u(107), u(108), false},
		{"CAP_NET_ADMIN over the netns overrides both", peer.Creds{EUID: 3000, EGID: 3000, NetAdmin: true}, u(107), u(108), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := MayAttach(tc.creds, tc.owner, tc.group); got != tc.want {
				t.Errorf("MayAttach(%+v, owner %v, group %v) = %v, want %v", tc.creds, tc.owner, tc.group, got, tc.want)
			}
		})
	}
}
