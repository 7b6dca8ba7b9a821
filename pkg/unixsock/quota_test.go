package unixsock

import "testing"

func TestUIDQuota(t *testing.T) {
	// Small limits: 6 in all, 2 per uid other than root, so others
	// together get 4 and root always finds 2 free.
	type step struct {
		uid  uint32
		done bool // a connection of uid ends (instead of a new one)
		want bool // admitted
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"a uid other than root gets as many connections as one uid may, and no more", []step{
			{uid: 107, want: true}, {uid: 107, want: true}, {uid: 107, want: false},
		}},
		{"a connection that ends makes room for the next one of its uid", []step{
			{uid: 107, want: true}, {uid: 107, want: true}, {uid: 107, done: true}, {uid: 107, want: true}, {uid: 107, want: false},
		}},
		{"one uid at its limit does not hold back another uid", []step{
			{uid: 107, want: true}, {uid: 107, want: true}, {uid: 107, want: false}, {uid: 65534, want: true},
		}},
		{"uids other than root together leave room for root", []step{
			{uid: 1, want: true}, {uid: 1, want: true}, {uid: 2, want: true}, {uid: 2, want: true},
			{uid: 3, want: false},
			{uid: 0, want: true}, {uid: 0, want: true},
		}},
		{"root is held to no per-uid limit but to the limit of all connections", []step{
			{uid: 0, want: true}, {uid: 0, want: true}, {uid: 0, want: true}, {uid: 0, want: true}, {uid: 0, want: true}, {uid: 0, want: true},
			{uid: 0, want: false}, {uid: 107, want: false},
			{uid: 0, done: true}, {uid: 107, want: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tab := UIDQuota{Max: 6, MaxPerUID: 2}
			for i, s := range tc.steps {
				if s.done {
					tab.Done(s.uid)
					continue
				}
				got, why := tab.Admit(s.uid)
				if got != s.want {
					t.Fatalf("step %d: a connection of uid %d admitted=%v (%q), want %v", i, s.uid, got, why, s.want)
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
	for _, uid := range []uint32{0, 107, 107, 65534} {
		if ok, why := tab.Admit(uid); !ok {
			t.Fatalf("uid %d refused: %s", uid, why)
		}
	}
	for _, uid := range []uint32{0, 107, 107, 65534} {
		tab.Done(uid)
	}
	if total, others := tab.Counted(); total != 0 || others != 0 || len(tab.perUID) != 0 {
		t.Errorf("after every connection ended: total %d, others %d, per uid %v; want all zero", total, others, tab.perUID)
	}
}
