package reliability

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

// gcAttachment is one of the attachments a crashed runtime left.
type gcAttachment struct {
	pod    int
	ifName string
	net    int // index into the networks
	r      *libcni.RuntimeConf
	res    *current.Result
}

// TestGCAfterRuntimeCrash: a runtime added 20 attachments (5 pod netns,
// each with a tc-redirect and a bridge-wired tap handed off to napitapd and
// two Kata DAN taps in the node netns, kataDan on and so the hand-off off,
// four networks in all) and crashed without DEL, losing its
// libcni cache. GC of every network, run by the restarted runtime (a libcni
// with an empty cache, so that GC reaches the plugins instead of libcni
// issuing DELs from its cache), must remove every napitap attachment not
// listed: no taps, napitap filters or pod bridges, the bridge plugin's
// interfaces given back their MACs, no napitapd state or fds, no DAN
// entries. The bridge plugin's veths stay (they are its own); a DEL of the
// chain then leaves the node as it was.
func TestGCAfterRuntimeCrash(t *testing.T) {
	cases := []struct {
		name string
		keep func(a gcAttachment) bool
	}{
		{"GC with no valid attachments removes all 20 napitap attachments a crashed runtime left",
			func(gcAttachment) bool { return false }},
		{"GC keeps exactly the attachments it is told are valid and removes the rest",
			func(a gcAttachment) bool {
				return a.pod < 2 || (a.pod == 2 && (a.ifName == "net1" || a.ifName == "net3"))
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			sfx := f.env.Suffix
			nets := []struct {
				name string
				conf tapConf
			}{
				{"gc-redirect", tapConf{Queues: 2, Handoff: "required", Chained: true}},
				{"gc-bridge", tapConf{Queues: 1, Handoff: "required", Chained: true, Wiring: "bridge",
					HostBr: "napigc-" + sfx, Subnet: "10.197.0.0/24"}},
				{"gc-kata-2q", tapConf{Queues: 2, Handoff: "off", KataDan: true, Chained: true,
					HostBr: "napigk-" + sfx, Subnet: "10.196.0.0/24"}},
				{"gc-kata-1q", tapConf{Queues: 1, Handoff: "off", KataDan: true, Chained: true,
					HostBr: "napigb-" + sfx, Subnet: "10.195.0.0/24"}},
			}
			lists := make([]*libcni.NetworkConfigList, len(nets))
			for i, n := range nets {
				f.primeHost(n.conf)
				lists[i] = f.list(n.name, n.conf)
			}
			pods := make([]*podNS, 5)
			for i := range pods {
				pods[i] = newPodNS(t, fmt.Sprintf("gc%d", i))
			}
			base := f.snapshot(pods...)

			suffix := nstest.RandomSuffix()
			var atts []*gcAttachment
			for i, p := range pods {
				for j, ifName := range []string{"net1", "net2", "net3", "net4"} {
					a := &gcAttachment{pod: i, ifName: ifName, net: j}
					a.r = rt(fmt.Sprintf("gc-%s-pod%d", suffix, i), p, ifName)
					var err error
					if a.res, err = f.env.Add(lists[a.net], a.r); err != nil {
						t.Fatalf("ADD %s/%s: %v", a.r.ContainerID, ifName, err)
					}
					atts = append(atts, a)
				}
			}
			t.Cleanup(func() {
				if t.Failed() {
					for _, a := range atts {
						_ = f.env.Del(lists[a.net], a.r)
					}
				}
			})
			heldQueues := 0
			for _, a := range atts {
				if err := f.consistent(lists[a.net], nets[a.net].conf, a.r, pods[a.pod], a.res); err != nil {
					t.Fatalf("%s/%s: %v", a.r.ContainerID, a.ifName, err)
				}
				if nets[a.net].conf.Handoff != "off" {
					heldQueues += nets[a.net].conf.Queues
				}
			}
			if n := tunFDs(f.d.PID()); n != heldQueues {
				t.Errorf("napitapd holds %d queues, want %d", n, heldQueues)
			}

			// The runtime restarts without its cache and collects garbage.
			valid := []types.GCAttachment{}
			for _, a := range atts {
				if tc.keep(*a) {
					valid = append(valid, types.GCAttachment{ContainerID: a.r.ContainerID, IfName: a.ifName})
				}
			}
			fresh := libcni.NewCNIConfigWithCacheDir([]string{binDir}, filepath.Join(t.TempDir(), "cache"), nil)
			for _, list := range lists {
				err := f.env.InHost(func() error {
					return fresh.GCNetworkList(context.Background(), list, &libcni.GCArgs{ValidAttachments: valid})
				})
				if err != nil {
					t.Errorf("GC of %s: %v", list.Name, err)
				}
			}

			after := f.snapshot(pods...)
			keptQueues := 0
			for _, a := range atts {
				conf := nets[a.net].conf
				want := f.expect(conf, a.r.ContainerID, a.ifName)
				p := pods[a.pod]
				if tc.keep(*a) {
					if conf.Handoff != "off" {
						keptQueues += want.Queues
					}
					if err := f.consistent(lists[a.net], conf, a.r, p, a.res); err != nil {
						t.Errorf("valid attachment %s/%s after GC: %v", a.r.ContainerID, a.ifName, err)
					}
					continue
				}
				var left []string
				if err := nodecheck.Gone(p.Path, want); err != nil {
					left = append(left, err.Error())
				}
				objs := after.Pods[p.Name]
				for _, o := range objs {
					fields := strings.Fields(o)
					if len(fields) > 1 && (fields[1] == want.TapName || (want.Bridge != "" && fields[1] == want.Bridge)) {
						left = append(left, o)
					}
					if strings.HasPrefix(o, "filter "+a.ifName+" ") || strings.HasPrefix(o, "qdisc "+a.ifName+" clsact") {
						left = append(left, o)
					}
				}
				if want.Wiring == "bridge" {
					guest, _ := guestEntry(a.res, a.r.ContainerID)
					if mac := "link " + a.ifName + " type=veth mac=" + guest; !slices.Contains(objs, mac) {
						left = append(left, fmt.Sprintf("%s without its MAC %s", a.ifName, guest))
					}
				}
				// Kata attachments (hand-off off) included: napitapd never
				// held them, GC must find them all the same.
				if len(left) > 0 {
					t.Errorf("%s/%s after GC: %q", a.r.ContainerID, a.ifName, left)
				}
				if slices.ContainsFunc(after.DAN, func(d string) bool {
					return strings.HasPrefix(d, a.r.ContainerID+".json:") && regexp.MustCompile(`(^|[ ,])`+a.ifName+`=`).MatchString(strings.SplitN(d, ":", 2)[1])
				}) {
					// Even when the sandbox has valid attachments too.
					t.Errorf("%s/%s is not valid, but its DAN entry survived GC: %q", a.r.ContainerID, a.ifName, after.DAN)
				}
			}
			if n := tunFDs(f.d.PID()); n != keptQueues {
				t.Errorf("napitapd holds %d queues after GC, want %d", n, keptQueues)
			}
			if len(valid) == 0 {
				for _, field := range []struct {
					name       string
					have, want []string
				}{
					{"napitapd state", after.State, base.State},
					{"napitapd attachments", after.Attachments, base.Attachments},
					{"napitapd fds", after.FDs, base.FDs},
					{"DAN dir", after.DAN, base.DAN},
				} {
					if !slices.Equal(field.have, field.want) {
						t.Errorf("%s after GC: %q, want %q", field.name, field.have, field.want)
					}
				}
			}

			// The bridge plugin's part goes with DEL of the chain.
			for _, a := range atts {
				if err := f.env.Del(lists[a.net], a.r); err != nil {
					t.Errorf("DEL %s/%s: %v", a.r.ContainerID, a.ifName, err)
				}
			}
			f.requireSame(base, "after GC and DEL", pods...)
		})
	}
}

// guestEntry is the MAC of the guest NIC entry (sandbox = container ID).
func guestEntry(res *current.Result, containerID string) (string, bool) {
	for _, iface := range res.Interfaces {
		if iface.Sandbox == containerID {
			return iface.Mac, true
		}
	}
	return "", false
}
