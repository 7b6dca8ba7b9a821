package tunperm

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

func TestMayAttachFollowsTheKernel(t *testing.T) {
	u := func(v uint32) *uint32 { return &v }
	cases := []struct {
		name         string
		creds        Creds
		owner, group *uint32
		want         bool
	}{
		{"anyone may attach a tap with neither owner nor group", Creds{EUID: 3000, EGID: 3000}, nil, nil, true},
		{"the owner may attach a tap with only an owner", Creds{EUID: 107, EGID: 3000}, u(107), nil, true},
		{"another uid may not attach a tap with only an owner", Creds{EUID: 3000, EGID: 108}, u(107), nil, false},
		{"the group may attach a tap with only a group", Creds{EUID: 3000, EGID: 108}, nil, u(108), true},
		{"a supplementary group counts", Creds{EUID: 3000, EGID: 3000, Groups: []uint32{5, 108}}, nil, u(108), true},
		{"owner and group both set need both", Creds{EUID: 107, EGID: 108}, u(107), u(108), true},
		{"the owner outside the group may not attach when both are set", Creds{EUID: 107, EGID: 3000}, u(107), u(108), false},
		{"the group without the owner may not attach when both are set", Creds{EUID: 3000, EGID: 108}, u(107), u(108), false},
		{"CAP_NET_ADMIN over the netns overrides both", Creds{EUID: 3000, EGID: 3000, NetAdmin: true}, u(107), u(108), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := MayAttach(tc.creds, tc.owner, tc.group); got != tc.want {
				t.Errorf("MayAttach(%+v, owner %v, group %v) = %v, want %v", tc.creds, tc.owner, tc.group, got, tc.want)
			}
		})
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tqemu\nUid:\t107\t107\t107\t107\nGid:\t1\t108\t108\t108\nGroups:\t36 108 \nCapEff:\t0000000000001000\n"
	c, err := parseStatus([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if c.EUID != 107 || c.EGID != 108 || len(c.Groups) != 2 || c.Groups[1] != 108 || c.CapEff != 1<<unix.CAP_NET_ADMIN {
		t.Errorf("parsed %+v", c)
	}
	if _, err := parseStatus([]byte("Name:\tx\n")); err == nil {
		t.Error("a status without Uid, Gid and CapEff parsed")
	}
}

func TestOfSelf(t *testing.T) {
	nstest.RequireRoot(t)
	fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := Of(os.Getpid(), fd)
	if err != nil {
		t.Fatal(err)
	}
	if c.EUID != 0 || !c.NetAdmin {
		t.Errorf("root in the initial user namespace reads as %+v", c)
	}
}
