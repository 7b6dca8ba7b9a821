package handoff_test

import (
	"testing"

	"github.com/napitap/napitap/pkg/handoff"
)

// TestAttachmentQueueRange: a tap whose fds napitapd holds has at most the
// 253 queues one message carries; an intercepted one, of which it holds
// none, as many as the kernel gives a tap (MAX_TAP_QUEUES).
func TestAttachmentQueueRange(t *testing.T) {
	cases := []struct {
		name      string
		queues    int
		intercept bool
		wantErr   bool
	}{
		{"a handed-off tap of 253 queues is valid", 253, false, false},
		{"a handed-off tap of 254 queues is not", 254, false, true},
		{"an intercepted tap of 254 queues is valid", 254, true, false},
		{"an intercepted tap of 256 queues is valid", 256, true, false},
		{"an intercepted tap of 257 queues is not", 257, true, true},
		{"an intercepted tap of no queues is not", 0, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			att := &handoff.Attachment{
				Key:        handoff.Key{ContainerID: "napitap-test", IfName: "net1"},
				Netns:      "/run/netns/napitap-test",
				TapName:    "tap1",
				Queues:     tc.queues,
				MultiQueue: true,
				Intercept:  tc.intercept,
			}
			if err := att.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate of %d queues, intercept %v: %v, want error %v", tc.queues, tc.intercept, err, tc.wantErr)
			}
		})
	}
}
