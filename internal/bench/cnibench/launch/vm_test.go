package launch

import (
	"bytes"
	"strings"
	"testing"
)

func TestAVMRefusesWhatIsNotAVMMsQueueHandling(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no verb is a usage error", nil, "usage: vm open TAP QUEUES | vm runc SOCKET TAP QUEUES | vm plain TAP QUEUES | vm fds QUEUES"},
		{"an unknown verb is a usage error", []string{"attach", "tap0", "4"}, "usage:"},
		{"open without a queue count is a usage error", []string{"open", "tap0"}, "usage:"},
		{"a queue count that is not a number is refused", []string{"fds", "four"}, `queue count "four": want 1..256`},
		{"no queues is refused", []string{"open", "tap0", "0"}, "want 1..256"},
		{"a tap that is not there cannot be opened", []string{"open", "napitap-no-such-tap", "1"}, "tap napitap-no-such-tap: queue 1 of 1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var out bytes.Buffer
			err := VM(c.args, strings.NewReader(""), &out)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("VM(%q) = %v, want an error with %q", c.args, err, c.want)
			}
			if out.Len() > 0 {
				t.Errorf("VM(%q) said it was ready: %q", c.args, out.String())
			}
		})
	}
}
