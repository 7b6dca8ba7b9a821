package unixsock

import "testing"

func TestUIDQuota(t *testing.T) {
	// Small limits: 6 for every tenant together, 2 for one uid.
	type step struct {
		uid      uint32
		napitapd bool // the peer is napitapd's equal
		done     bool // one of uid's ends (instead of a new one)
		want     bool // admitted
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"a uid gets as many as one tenant may, and no more", []step{
			{uid: 107, want: true}, {uid: 107, want: true}, {uid: 107, want: false},
		}},
		{"a pod's root is a tenant like any other uid", []step{
			{uid: 0, want: true}, {uid: 0, want: true}, {uid: 0, want: false},
		}},
		{"one that ends makes room for the next one of its uid", []step{
			{uid: 107, want: true}, {uid: 107, want: true}, {uid: 107, done: true}, {uid: 107, want: true}, {uid: 107, want: false},
		}},
		{"one uid at its limit does not hold back another uid", []step{
			{uid: 107, want: true}, {uid: 107, want: true}, {uid: 107, want: false}, {uid: 65534, want: true},
		}},
		{"tenants together get no more than the shared limit", []step{
			{uid: 1, want: true}, {uid: 1, want: true}, {uid: 2, want: true}, {uid: 2, want: true}, {uid: 0, want: true}, {uid: 0, want: true},
			{uid: 3, want: false},
		}},
		{"napitapd's equal is admitted whatever the tenants hold", []step{
			{uid: 1, want: true}, {uid: 1, want: true}, {uid: 2, want: true}, {uid: 2, want: true}, {uid: 0, want: true}, {uid: 0, want: true},
			{uid: 0, napitapd: true, want: true}, {uid: 0, napitapd: true, want: true}, {uid: 0, napitapd: true, want: true},
			{uid: 0, napitapd: true, want: true}, {uid: 0, napitapd: true, want: true}, {uid: 0, napitapd: true, want: true},
			{uid: 0, napitapd: true, want: true},
		}},
		{"napitapd's equal takes nothing from a tenant", []step{
			{uid: 0, napitapd: true, want: true}, {uid: 0, napitapd: true, want: true},
			{uid: 0, want: true}, {uid: 0, want: true}, {uid: 0, want: false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tab := UIDQuota{Max: 6, MaxPerUID: 2}
			for i, s := range tc.steps {
				if s.done {
					tab.Done(s.uid, s.napitapd)
					continue
				}
				got, why := tab.Admit(s.uid, s.napitapd)
				if got != s.want {
					t.Fatalf("step %d: one of uid %d (napitapd's equal %v) admitted=%v (%q), want %v", i, s.uid, s.napitapd, got, why, s.want)
				}
				if !got && why == "" {
					t.Errorf("step %d: refused without a reason", i)
				}
			}
		})
	}
}

func TestUIDQuotaCountsBackToZero(t *testing.T) {
	tab := UIDQuota{Max: 6, MaxPerUID: 2}
	peers := []struct {
		uid      uint32
		napitapd bool
	}{{0, true}, {0, false}, {107, false}, {107, false}, {65534, false}}
	for _, p := range peers {
		if ok, why := tab.Admit(p.uid, p.napitapd); !ok {
			t.Fatalf("uid %d refused: %s", p.uid, why)
		}
	}
	for _, p := range peers {
		tab.Done(p.uid, p.napitapd)
	}
	if tenants, equals := tab.Counted(); tenants != 0 || equals != 0 || len(tab.perUID) != 0 {
		t.Errorf("after every one ended: tenants %d, equals %d, per uid %v; want all zero", tenants, equals, tab.perUID)
	}
}
