package reliability

import (
	"context"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

// TestDelWithoutPrevResultTouchesOnlyItsAttachment: DEL comes without
// prevResult in spec 0.3.x, and in any version when the runtime has no
// cached result (after a failed ADD, or a lost cache). napitap then guesses
// the chained tap name too (tap + CNI_IFNAME[3:]); the guess must never
// take another attachment's tap in the same pod.
func TestDelWithoutPrevResultTouchesOnlyItsAttachment(t *testing.T) {
	cases := []struct {
		name    string
		version string
		viaExec bool // napitap's DEL exec'd alone without prevResult
	}{
		{"a spec 0.3.1 DEL of a standalone tap on eth0 leaves the tap0 of the pod's chained net0 alone", "0.3.1", false},
		{"a spec 1.1.0 DEL without a cached result of a standalone tap on eth0 leaves the tap0 of the pod's chained net0 alone", "1.1.0", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			chained := tapConf{Queues: 2, Handoff: "required", Chained: true}
			standalone := tapConf{Queues: 1, Handoff: "required", CNIVer: tc.version}
			f.primeHost(chained)
			p := newPodNS(t, "delprev")
			base := f.snapshot(p)
			cid := "delprev-" + nstest.RandomSuffix()
			chainedList := f.list("napitap-chained", chained)
			standaloneList := f.list("napitap-standalone", standalone)
			rc, rs := rt(cid, p, "net0"), rt(cid, p, "eth0")
			res, err := f.env.Add(chainedList, rc)
			if err != nil {
				t.Fatalf("ADD net0: %v", err)
			}
			if _, err := f.env.Add(standaloneList, rs); err != nil {
				t.Fatalf("ADD eth0: %v", err)
			}
			t.Cleanup(func() { _ = f.env.Del(chainedList, rc); _ = f.env.Del(standaloneList, rs) })
			if err := f.consistent(chainedList, chained, rc, p, res); err != nil {
				t.Fatal(err)
			}
			if err := nodecheck.Present(p.Path, f.expect(standalone, cid, "eth0")); err != nil {
				t.Fatal(err)
			}

			if tc.viaExec {
				conf, err := pluginConf(standaloneList, 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.exec(context.Background(), "napitap", "DEL", conf, rs); err != nil {
					t.Fatalf("DEL eth0: %v", err)
				}
			} else if err := f.env.Del(standaloneList, rs); err != nil {
				t.Fatalf("DEL eth0: %v", err)
			}
			if err := nodecheck.Gone(p.Path, f.expect(standalone, cid, "eth0")); err != nil {
				t.Errorf("eth0 after its DEL: %v", err)
			}
			if err := f.consistent(chainedList, chained, rc, p, res); err != nil {
				t.Errorf("after DEL of %s/eth0, the pod's other attachment %s/net0 is broken: %v", cid, cid, err)
			}
			if err := f.env.Del(chainedList, rc); err != nil {
				t.Fatalf("DEL net0: %v", err)
			}
			f.requireSame(base, "after both DELs", p)
		})
	}
}

// TestDelWithAConfigThatAddNowRejects: a pod made while napitap accepted
// kataDan with the default hand-off (before "kataDan needs the hand-off
// off") is deleted after the upgrade with the same network config. DEL
// must still clean up: if napitap's DEL fails, libcni stops there and the
// bridge plugin's DEL never runs, and the runtime retries for ever.
func TestDelWithAConfigThatAddNowRejects(t *testing.T) {
	f := newFixture(t)
	kata := tapConf{Queues: 2, Handoff: "off", Chained: true, KataDan: true}
	f.primeHost(kata)
	p := newPodNS(t, "upgrade")
	base := f.snapshot(p)
	r := rt("upgrade-"+nstest.RandomSuffix(), p, "eth0")
	list := f.list("napitap-kata", kata)
	if _, err := f.env.Add(list, r); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	// The config as it was written before: kataDan, hand-off left default.
	legacy := f.list("napitap-kata", kata)
	raw := strings.Replace(string(legacy.Bytes), `"handoff":{"disabled":true},`, "", 1)
	legacy, err := libcni.ConfListFromBytes([]byte(raw))
	if err != nil || !strings.Contains(raw, `"kataDan"`) || strings.Contains(raw, `"handoff"`) {
		t.Fatalf("legacy config %s: %v", raw, err)
	}
	if err := f.env.Del(legacy, r); err != nil {
		t.Errorf("DEL with a config ADD now rejects, %s: %v", raw, err)
		// Clean up all the same, for the comparison below.
		if err := f.env.Del(list, r); err != nil {
			t.Fatalf("DEL with the valid config: %v", err)
		}
	}
	f.requireSame(base, "after DEL", p)
}
