package handoff

import (
	"testing"
)

func TestLimitsValidate(t *testing.T) {
	cases := []struct {
		name    string
		limits  Limits
		wantErr bool
	}{
		{"zero limits take the defaults and are valid", Limits{}, false},
		{"a per-uid limit below the limit of all connections is valid", Limits{MaxConns: 10, MaxConnsPerUID: 9}, false},
		{"a per-uid limit equal to the limit of all connections leaves other tenants no room", Limits{MaxConns: 10, MaxConnsPerUID: 10}, true},
		{"a per-uid limit above the default limit of all connections leaves other tenants no room", Limits{MaxConnsPerUID: DefaultMaxConns + 1}, true},
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
