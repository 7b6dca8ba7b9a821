package handoff

import (
	"testing"
)

func TestConnTable(t *testing.T) {
	// Small limits: 6 connections, 2 per uid other than root, so others
	// together get 4 and root always finds 2 free.
	lim := Limits{MaxConns: 6, MaxConnsPerUID: 2}
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
			var tab connTable
			for i, s := range tc.steps {
				if s.done {
					tab.done(s.uid)
					continue
				}
				got, why := tab.admit(lim, s.uid)
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

func TestConnTableCountsBackToZero(t *testing.T) {
	var tab connTable
	lim := Limits{}.withDefaults()
	for _, uid := range []uint32{0, 107, 107, 65534} {
		if ok, why := tab.admit(lim, uid); !ok {
			t.Fatalf("uid %d refused: %s", uid, why)
		}
	}
	for _, uid := range []uint32{0, 107, 107, 65534} {
		tab.done(uid)
	}
	if tab.total != 0 || tab.others != 0 || len(tab.perUID) != 0 {
		t.Errorf("after every connection ended: total %d, others %d, per uid %v; want all zero", tab.total, tab.others, tab.perUID)
	}
}

func TestLimitsValidate(t *testing.T) {
	cases := []struct {
		name    string
		limits  Limits
		wantErr bool
	}{
		{"zero limits take the defaults and are valid", Limits{}, false},
		{"a per-uid limit below the limit of all connections is valid", Limits{MaxConns: 10, MaxConnsPerUID: 9}, false},
		{"a per-uid limit equal to the limit of all connections leaves root no room", Limits{MaxConns: 10, MaxConnsPerUID: 10}, true},
		{"a per-uid limit above the default limit of all connections leaves root no room", Limits{MaxConnsPerUID: DefaultMaxConns + 1}, true},
		{"a negative limit is invalid", Limits{MaxConns: -1}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.limits.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate(%+v) = %v, want error %v", tc.limits, err, tc.wantErr)
			}
		})
	}
}
