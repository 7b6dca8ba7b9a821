package reliability

import (
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/nodecheck"
)

// faultConfigs are the attachments the fault tests put through each fault.
var faultConfigs = []struct {
	name   string
	ifName string
	conf   tapConf
}{
	{"a standalone 2-queue tap with host-local and a required hand-off", "net1",
		tapConf{Queues: 2, Handoff: "required", IPAM: true}},
	{"a 1-queue Kata DAN tap in the node netns after bridge (kataDan, no hand-off)", "net1",
		tapConf{Queues: 1, Handoff: "off", Chained: true, KataDan: true}},
	{"a 4-queue tap chained after bridge with tc-redirect and a required hand-off", "eth0",
		tapConf{Queues: 4, Handoff: "required", Chained: true}},
	{"a 2-queue tap chained after bridge with bridge wiring and an optional hand-off", "net1",
		tapConf{Queues: 2, Handoff: "optional", Chained: true, Wiring: "bridge"}},
	{"a 2-queue Kata DAN tap in the node netns after bridge (kataDan, no hand-off)", "eth0",
		tapConf{Queues: 2, Handoff: "off", Chained: true, KataDan: true}},
}

// footprint is what napitap itself holds for one attachment: its tap,
// napitapd's record, its DAN entry.
type footprint struct {
	tap    bool
	known  bool
	held   int
	dan    bool
	tunFDs int
}

func (fp footprint) String() string {
	var parts []string
	if fp.tap {
		parts = append(parts, "tap")
	}
	if fp.known {
		parts = append(parts, fmt.Sprintf("napitapd(held=%d)", fp.held))
	}
	if fp.dan {
		parts = append(parts, "dan")
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, "+")
}

func (f *fixture) footprint(p *podNS, want nodecheck.Expect) footprint {
	f.t.Helper()
	var fp footprint
	// A Kata DAN tap is in the node's netns, whether the pod's is there
	// or not.
	tapNetns, there := "", p != nil && p.Exists()
	if there {
		tapNetns = p.Path
	}
	if want.Wiring == "node-bridge" {
		tapNetns, there = want.NodeNetns, true
	}
	if there {
		_ = inNetns(tapNetns, func() error {
			l, err := netlinksafe.LinkByName(want.TapName)
			if err == nil {
				_, fp.tap = l.(*netlink.Tuntap)
			}
			return nil
		})
	}
	if atts, err := f.d.Client().List(); err == nil {
		for _, a := range atts {
			if a.ContainerID == want.ContainerID && a.IfName == want.IfName {
				fp.known, fp.held = true, a.Held
			}
		}
	}
	for _, d := range danFiles(f.danDir) {
		if strings.HasPrefix(d, want.ContainerID+".json:") && strings.Contains(d, want.IfName+"=") {
			fp.dan = true
		}
	}
	if pid := f.d.PID(); pid != 0 {
		fp.tunFDs = tunFDs(pid)
	}
	return fp
}

// consistent asserts a complete attachment: nodecheck.Present, CHECK,
// and the DAN entry when asked for.
func (f *fixture) consistent(list *libcni.NetworkConfigList, c tapConf, r *libcni.RuntimeConf, p *podNS, final *current.Result) error {
	want := f.expect(c, r.ContainerID, r.IfName)
	if err := nodecheck.Present(p.Path, want); err != nil {
		return fmt.Errorf("nodecheck.Present: %w", err)
	}
	if err := f.check(list, c, r, final); err != nil {
		return fmt.Errorf("CHECK: %w", err)
	}
	if c.KataDan && !f.footprint(p, want).dan {
		return fmt.Errorf("no DAN entry for %s/%s: %q", r.ContainerID, r.IfName, danFiles(f.danDir))
	}
	return nil
}

// primedFixture is newFixture with, when c is chained, the bridge
// plugin's bridge already in the host (primeHost).
func primedFixture(t testing.TB, c tapConf) *fixture {
	t.Helper()
	f := newFixture(t)
	if c.Chained {
		f.primeHost(c)
	}
	return f
}

// setUp is how most fault tests start: a primedFixture, the conflist of
// c named napitap-<role>, a pod netns napitap-<role>-<random> and the
// node as it is with that pod before anything was added.
func setUp(t testing.TB, role string, c tapConf) (*fixture, *libcni.NetworkConfigList, *podNS, nodeSnapshot) {
	t.Helper()
	f := primedFixture(t, c)
	p := newPodNS(t, role)
	return f, f.list("napitap-"+role, c), p, f.snapshot(p)
}

// delChain runs DEL of the chain as execDelChain does; after a completed
// ADD (final set) napitap's DEL must give the pod back as it was before.
func (f *fixture) delChain(list *libcni.NetworkConfigList, final *current.Result, r *libcni.RuntimeConf, p *podNS, before nodeSnapshot, what string) error {
	var afterNapitap func()
	if final != nil {
		afterNapitap = func() { f.requireSame(before, what, p) }
	}
	return f.execDelChain(list, final, r, afterNapitap)
}

// TestPodNetnsVanishingDuringAdd deletes the pod netns (ip netns del) at
// many points of a libcni ADD. Whatever ADD answers, napitap's part is
// either complete or absent, and DEL (netns gone) plus a GC with no valid
// attachments leave the node as it was: no napitapd state or held queues
// keeping the dead netns alive.
func TestPodNetnsVanishingDuringAdd(t *testing.T) {
	delays := []time.Duration{0, 1, 2, 3, 5, 8, 12, 17, 25, 35, 50, 70, 100}
	for i := range delays {
		delays[i] *= time.Millisecond
	}
	const rounds = 2
	for _, fc := range faultConfigs {
		t.Run(fc.name+" leaves nothing after DEL and GC when its netns vanishes mid-ADD", func(t *testing.T) {
			f := primedFixture(t, fc.conf)
			list := f.list("napitap-vanish", fc.conf)
			base := f.snapshot()
			outcomes := map[string]int{}
			for round := 0; round < rounds; round++ {
				for _, delay := range delays {
					p := newPodNS(t, "vanish")
					r := rt(fmt.Sprintf("vanish-%s-%d", nstest.RandomSuffix(), delay.Milliseconds()), p, fc.ifName)
					want := f.expect(fc.conf, r.ContainerID, r.IfName)

					var res *current.Result
					var addErr error
					done := make(chan struct{})
					go func() { res, addErr = f.env.Add(list, r); close(done) }()
					finishedFirst := false
					select {
					case <-done:
						finishedFirst = true
					case <-time.After(delay):
					}
					if finishedFirst {
						if addErr != nil {
							t.Fatalf("delay %v: ADD failed with the netns still there: %v", delay, addErr)
						}
						if err := f.consistent(list, fc.conf, r, p, res); err != nil {
							t.Fatalf("delay %v: ADD succeeded but %v", delay, err)
						}
					}
					if err := p.Delete(); err != nil {
						t.Fatal(err)
					}
					<-done

					fp := f.footprint(p, want)
					switch {
					case finishedFirst:
						outcomes["ADD done before the delete"]++
					case addErr == nil:
						outcomes[fmt.Sprintf("ADD succeeded, napitap holds %s", fp)]++
						if fc.conf.Handoff == "required" && (!fp.known || fp.held != fc.conf.Queues) {
							t.Errorf("delay %v: ADD with required hand-off succeeded, but napitapd has %s", delay, fp)
						}
						if fc.conf.KataDan && !fp.dan {
							t.Errorf("delay %v: ADD with kataDan succeeded without a DAN entry", delay)
						}
					default:
						key := fmt.Sprintf("ADD failed (code %d), napitap holds %s", cniCode(addErr), fp)
						if outcomes[key] == 0 {
							t.Logf("first of %q: %v", key, addErr)
						}
						outcomes[key]++
						if fp.known || fp.dan || fp.tunFDs != 0 {
							t.Errorf("delay %v: ADD failed (%v) but napitap left %s and napitapd holds %d queues", delay, addErr, fp, fp.tunFDs)
						}
					}

					if err := f.env.Del(list, r); err != nil {
						t.Errorf("delay %v: DEL with the netns gone: %v", delay, err)
					}
					if err := f.env.GC(list, []types.GCAttachment{}); err != nil {
						t.Errorf("delay %v: GC: %v", delay, err)
					}
					f.requireSame(base, fmt.Sprintf("delay %v, after DEL and GC", delay))
				}
			}
			t.Logf("outcomes over %d ADDs: %s", rounds*len(delays), formatCounts(outcomes))
		})
	}
}

// TestPluginKilledDuringAdd SIGKILLs the napitap binary at random points
// of ADD, as a runtime's timeout does. After a kill the runtime has no
// result, so DEL comes as libcni sends it then: without prevResult. DEL
// must leave nothing, whatever the kill interrupted.
func TestPluginKilledDuringAdd(t *testing.T) {
	const iterations = 30
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0x6e61706974617031))
	for _, fc := range faultConfigs {
		t.Run(fc.name+" leaves nothing after DEL when napitap is killed mid-ADD", func(t *testing.T) {
			f, list, p, base := setUp(t, "kill", fc.conf)
			outcomes := map[string]int{}
			for i := 0; i < iterations; i++ {
				delay := time.Duration(rng.IntN(20_001)) * time.Microsecond
				r := rt(fmt.Sprintf("kill-%s-%d", nstest.RandomSuffix(), i), p, fc.ifName)
				want := f.expect(fc.conf, r.ContainerID, r.IfName)
				prev, err := f.execAddPrev(list, r)
				if err != nil {
					t.Fatalf("ADD of the previous plugins: %v", err)
				}
				beforeAdd := f.snapshot(p)
				conf, err := pluginConf(list, len(list.Plugins)-1, prev)
				if err != nil {
					t.Fatal(err)
				}
				cmd, stdout, stderr := f.pluginCmd("napitap", "ADD", conf, r)
				if err := f.startInHost(cmd); err != nil {
					t.Fatal(err)
				}
				exited := make(chan error, 1)
				go func() { exited <- cmd.Wait() }()
				var waitErr error
				killed := false
				select {
				case waitErr = <-exited:
				case <-time.After(delay):
					// Only the plugin, by its PID, as a runtime does.
					_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
					waitErr = <-exited
					killed = isKilled(waitErr)
				}
				if !waitGroupGone(cmd.Process.Pid, 10*time.Second) {
					t.Fatalf("what napitap (pid %d) forked is still running", cmd.Process.Pid)
				}

				var final *current.Result
				switch {
				case killed:
					outcomes[fmt.Sprintf("killed, napitap left %s", f.footprint(p, want))]++
				case waitErr != nil:
					t.Fatalf("delay %v: ADD failed: %v", delay, pluginError("napitap", "ADD", waitErr, stdout.Bytes(), stderr.Bytes()))
				default:
					outcomes["ADD completed"]++
					if final, err = parseResult(stdout.Bytes()); err != nil {
						t.Fatal(err)
					}
					if err := f.consistent(list, fc.conf, r, p, final); err != nil {
						t.Fatalf("delay %v: ADD completed but %v", delay, err)
					}
				}
				// With the final result napitap's DEL gives the pod back
				// exactly as the previous plugins left it.
				if err := f.delChain(list, final, r, p, beforeAdd, "napitap's DEL after a completed ADD"); err != nil {
					t.Fatalf("delay %v: %v", delay, err)
				}
				// Nothing left includes the DAN dir: a napitap killed inside
				// katadan.update, between writing <sandbox>.json.tmp and
				// renaming it, must not leave the .tmp behind.
				f.requireSame(base, fmt.Sprintf("kill after %v, after DEL", delay), p)
			}
			t.Logf("outcomes over %d ADDs: %s", iterations, formatCounts(outcomes))
		})
	}
}

func isKilled(err error) bool {
	var status syscall.WaitStatus
	if ee, ok := err.(interface{ Sys() any }); ok {
		status, _ = ee.Sys().(syscall.WaitStatus)
	}
	return status.Signaled() && status.Signal() == syscall.SIGKILL
}

// TestNapitapdKilledWithLiveAttachments SIGKILLs napitapd while it holds
// attachments and starts it again: it knows them from its state, holds no
// fds until a runtime fetches, then reopens NAPI queues in the pod netns;
// DEL afterwards releases everything.
func TestNapitapdKilledWithLiveAttachments(t *testing.T) {
	cases := []struct {
		name       string
		ifName     string
		conf       tapConf
		vmmHolding bool // a VMM holds fetched queues when napitapd dies
	}{
		{"a standalone 1-queue tap", "net1", tapConf{Queues: 1, Handoff: "required"}, false},
		{"a standalone 4-queue tap with host-local", "net1", tapConf{Queues: 4, Handoff: "required", IPAM: true}, false},
		{"a 2-queue tap chained with tc-redirect", "eth0", tapConf{Queues: 2, Handoff: "required", Chained: true}, false},
		{"a 4-queue tap chained with bridge wiring", "net1", tapConf{Queues: 4, Handoff: "optional", Chained: true, Wiring: "bridge"}, false},
		{"a 2-queue tap whose queues a VMM holds", "eth0", tapConf{Queues: 2, Handoff: "required", Chained: true}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name+" is served again with NAPI queues after napitapd is killed and restarted", func(t *testing.T) {
			f, list, p, base := setUp(t, "restart", tc.conf)
			r := rt("restart-"+nstest.RandomSuffix(), p, tc.ifName)
			want := f.expect(tc.conf, r.ContainerID, r.IfName)
			res, err := f.env.Add(list, r)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if err := f.consistent(list, tc.conf, r, p, res); err != nil {
				t.Fatal(err)
			}
			key := handoff.Key{ContainerID: r.ContainerID, IfName: r.IfName}
			var vmm []*os.File
			if tc.vmmHolding {
				_, vmm = fetchNAPI(t, f, key, tc.conf.Queues)
			}

			f.d.Kill()
			f.d.Start()
			want.Held = 0
			if err := nodecheck.Present(p.Path, want); err != nil {
				t.Fatalf("after the restart: %v", err)
			}
			if n := tunFDs(f.d.PID()); n != 0 {
				t.Errorf("a restarted napitapd holds %d queues before any fetch, want 0", n)
			}
			if err := f.check(list, tc.conf, r, res); err != nil {
				t.Errorf("CHECK after the restart: %v", err)
			}
			if tc.vmmHolding {
				if _, _, err := f.d.Client().Fetch(&key); !handoff.IsCode(err, handoff.CodeBusy) {
					t.Errorf("fetch while the VMM holds the queues: %v, want code %q", err, handoff.CodeBusy)
				}
				tapsetup.CloseQueues(vmm)
			}
			// The VMM starts (fetch), restarts (fetch again): each time NAPI.
			for i := 0; i < 2; i++ {
				att, files := fetchNAPI(t, f, key, tc.conf.Queues)
				if att.TapName != want.TapName {
					t.Errorf("fetched tap %q, want %q", att.TapName, want.TapName)
				}
				if err := nodecheck.Present(p.Path, want); err != nil {
					t.Errorf("while the VMM holds the queues: %v", err)
				}
				tapsetup.CloseQueues(files)
			}

			if err := f.env.Del(list, r); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := nodecheck.Gone(p.Path, want); err != nil {
				t.Error(err)
			}
			f.requireSame(base, "after DEL", p)
		})
	}
}

// fetchNAPI fetches key as a runtime does and checks that it got queues
// attached with IFF_NAPI, in the tap's queue mode.
func fetchNAPI(t *testing.T, f *fixture, key handoff.Key, queues int) (*handoff.Attachment, []*os.File) {
	t.Helper()
	att, files, err := f.d.Client().Fetch(&key)
	if err != nil {
		t.Fatalf("fetch %s: %v", key, err)
	}
	if len(files) != queues {
		tapsetup.CloseQueues(files)
		t.Fatalf("fetch %s: %d fds, want %d", key, len(files), queues)
	}
	for i, q := range files {
		flags, err := tapsetup.QueueFlagsOf(q)
		if err != nil {
			t.Fatalf("queue %d: %v", i, err)
		}
		if flags&unix.IFF_NAPI == 0 {
			t.Errorf("queue %d of %s: TUNGETIFF 0x%x lacks IFF_NAPI", i, key, flags)
		}
		if (flags&unix.IFF_MULTI_QUEUE != 0) != (queues > 1) {
			t.Errorf("queue %d of %s: TUNGETIFF 0x%x, multiqueue wrong for %d queues", i, key, flags, queues)
		}
	}
	return att, files
}

// TestNapitapdDown: ADD fails with code 11 and leaves nothing, with a
// required hand-off or an optional one: in fds mode napitapd is the VMM's
// only way to its queues. DEL with napitapd down succeeds and napitapd
// sweeps its record when it comes back.
func TestNapitapdDown(t *testing.T) {
	downs := []struct {
		name string
		stop func(*daemon)
	}{
		{"stopped (no socket)", (*daemon).Stop},
		{"killed (a stale socket)", (*daemon).Kill},
	}
	configs := []struct {
		name   string
		ifName string
		conf   tapConf
	}{
		{"a standalone tap with host-local", "net1", tapConf{Queues: 2, IPAM: true}},
		{"a tap chained with tc-redirect", "eth0", tapConf{Queues: 4, Chained: true}},
		{"a tap chained with bridge wiring", "net1", tapConf{Queues: 2, Chained: true, Wiring: "bridge"}},
	}
	for _, down := range downs {
		for _, cc := range configs {
			for _, h := range []struct{ handoff, what string }{{"required", "a required"}, {"optional", "an optional"}} {
				t.Run("ADD of "+cc.name+" with "+h.what+" hand-off fails with code 11 and leaves nothing while napitapd is "+down.name, func(t *testing.T) {
					c := cc.conf
					c.Handoff = h.handoff
					f, list, p, base := setUp(t, "down", c)
					down.stop(f.d)
					r := rt("down-"+nstest.RandomSuffix(), p, cc.ifName)
					prev, err := f.execAddPrev(list, r)
					if err != nil {
						t.Fatal(err)
					}
					before := f.snapshot(p)
					_, err = f.execAdd(list, prev, r)
					if cniCode(err) != types.ErrTryAgainLater {
						t.Fatalf("ADD: %v, want CNI code %d", err, types.ErrTryAgainLater)
					}
					t.Logf("ADD: %v", err)
					// Bridge wiring included: the pod interface keeps its MAC and
					// addresses.
					f.requireSame(before, "after the failed ADD", p)
					if err := f.execDelChain(list, nil, r, nil); err != nil {
						t.Fatal(err)
					}
					f.d.Start()
					f.requireSame(base, "after DEL, napitapd back", p)
				})
			}
			t.Run("DEL of "+cc.name+" succeeds while napitapd is "+down.name+", and napitapd sweeps its record on restart", func(t *testing.T) {
				c := cc.conf
				c.Handoff = "required"
				f, list, p, base := setUp(t, "down", c)
				r := rt("down-"+nstest.RandomSuffix(), p, cc.ifName)
				res, err := f.env.Add(list, r)
				if err != nil {
					t.Fatalf("ADD: %v", err)
				}
				if err := f.consistent(list, c, r, p, res); err != nil {
					t.Fatal(err)
				}
				down.stop(f.d)
				if err := f.env.Del(list, r); err != nil {
					t.Fatalf("DEL with napitapd down: %v", err)
				}
				want := f.expect(c, r.ContainerID, r.IfName)
				want.Socket = ""
				if err := nodecheck.Gone(p.Path, want); err != nil {
					t.Error(err)
				}
				f.d.Start()
				f.requireSame(base, "napitapd restarted after DEL", p)
			})
		}
	}
}

// TestRacingAddsForOneAttachment runs two ADDs of the same container and
// interface at once: exactly one succeeds and is complete, or both fail
// and leave nothing; never two taps, never a held attachment without its
// tap. DEL then leaves nothing.
func TestRacingAddsForOneAttachment(t *testing.T) {
	const iterations = 15
	for _, fc := range faultConfigs {
		t.Run("two racing ADDs of "+fc.name+" give one attachment or none", func(t *testing.T) {
			f, list, p, base := setUp(t, "race", fc.conf)
			outcomes := map[string]int{}
			for i := 0; i < iterations; i++ {
				r := rt(fmt.Sprintf("race-%s-%d", nstest.RandomSuffix(), i), p, fc.ifName)
				want := f.expect(fc.conf, r.ContainerID, r.IfName)
				prev, err := f.execAddPrev(list, r)
				if err != nil {
					t.Fatal(err)
				}
				beforeAdd := f.snapshot(p)
				var wg sync.WaitGroup
				results := make([]*current.Result, 2)
				errs := make([]error, 2)
				for j := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						results[j], errs[j] = f.execAdd(list, prev, r)
					}()
				}
				wg.Wait()
				var winner *current.Result
				var failures []string
				for j := range 2 {
					if errs[j] == nil {
						if winner != nil {
							t.Fatalf("both ADDs succeeded: %s and %s", results[0], results[1])
						}
						winner = results[j]
					} else {
						failures = append(failures, errs[j].Error())
					}
				}
				if n := countTaps(t, p); n > 1 {
					t.Fatalf("%d taps in the pod netns", n)
				}
				fp := f.footprint(p, want)
				if fp.known && !fp.tap {
					t.Fatalf("napitapd holds %s without a tap", fp)
				}
				if winner != nil {
					outcomes["one succeeded"]++
					if err := f.consistent(list, fc.conf, r, p, winner); err != nil {
						t.Fatalf("the winner: %v (loser: %v)", err, failures)
					}
					if fc.conf.Handoff != "off" && fp.tunFDs != fc.conf.Queues {
						t.Errorf("napitapd holds %d queues, want %d", fp.tunFDs, fc.conf.Queues)
					}
				} else {
					outcomes["both failed"]++
					t.Logf("both failed: %v", failures)
					f.requireSame(beforeAdd, "both ADDs failed", p)
				}
				if len(failures) > 0 && i == 0 {
					t.Logf("the loser's error: %s", failures[0])
				}
				if err := f.delChain(list, winner, r, p, beforeAdd, "napitap's DEL of the winner"); err != nil {
					t.Fatal(err)
				}
				f.requireSame(base, "after DEL", p)
			}
			t.Logf("outcomes over %d races: %s", iterations, formatCounts(outcomes))
		})
	}
}

func countTaps(t testing.TB, p *podNS) int {
	n := 0
	for _, o := range podObjects(t, p) {
		if strings.HasPrefix(o, "link ") && strings.Contains(o, " type=tuntap") {
			n++
		}
	}
	return n
}

// TestAddRepeatedAfterSuccess: a second ADD of an attachment that exists
// fails with an error that says so, and changes nothing of the first.
func TestAddRepeatedAfterSuccess(t *testing.T) {
	for _, fc := range faultConfigs {
		t.Run("a second ADD of "+fc.name+" fails clearly and leaves the first intact", func(t *testing.T) {
			f, list, p, base := setUp(t, "again", fc.conf)
			r := rt("again-"+nstest.RandomSuffix(), p, fc.ifName)
			prev, err := f.execAddPrev(list, r)
			if err != nil {
				t.Fatal(err)
			}
			beforeAdd := f.snapshot(p)
			final, err := f.execAdd(list, prev, r)
			if err != nil {
				t.Fatalf("first ADD: %v", err)
			}
			if err := f.consistent(list, fc.conf, r, p, final); err != nil {
				t.Fatal(err)
			}
			after := f.snapshot(p)
			danBefore, _ := os.ReadFile(f.danDir + "/" + r.ContainerID + ".json")

			_, err = f.execAdd(list, prev, r)
			if err == nil {
				t.Fatal("second ADD succeeded")
			}
			t.Logf("second ADD: %v", err)
			if !regexp.MustCompile(`already exists|has been allocated`).MatchString(err.Error()) {
				t.Errorf("second ADD: %q does not say the attachment already exists", err)
			}
			f.requireSame(after, "after the second ADD", p)
			if err := f.consistent(list, fc.conf, r, p, final); err != nil {
				t.Errorf("the first attachment after the second ADD: %v", err)
			}
			if danAfter, _ := os.ReadFile(f.danDir + "/" + r.ContainerID + ".json"); string(danAfter) != string(danBefore) {
				t.Errorf("DAN file changed:\n%s\nwas\n%s", danAfter, danBefore)
			}
			if err := f.delChain(list, final, r, p, beforeAdd, "napitap's DEL"); err != nil {
				t.Fatal(err)
			}
			f.requireSame(base, "after DEL", p)
		})
	}
}

func formatCounts(m map[string]int) string {
	keys := sortedKeys(m)
	sort.SliceStable(keys, func(i, j int) bool { return m[keys[i]] > m[keys[j]] })
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, "; ")
}

// TestNapitapdKilledRepeatedlyDuringChurn SIGKILLs napitapd every few
// hundred milliseconds and starts it again while 4 workers run ADD/DEL
// cycles with a required hand-off. An ADD may fail then (with code 11,
// try again later, when it is the hand-off napitapd dropped), but DEL
// always succeeds, and once napitapd is back for good the node is as it
// was: no <key>.json.tmp of a state write the kill cut short in its state
// dir, nor a <sandbox>.json.tmp in the DAN dir.
func TestNapitapdKilledRepeatedlyDuringChurn(t *testing.T) {
	const (
		workers  = 4
		duration = 8 * time.Second
	)
	configs := []struct {
		ifName string
		conf   tapConf
	}{
		{"net1", tapConf{Queues: 2, Handoff: "required", IPAM: true}},
		{"eth0", tapConf{Queues: 4, Handoff: "required", Chained: true}},
		{"net1", tapConf{Queues: 1, Handoff: "optional", Chained: true, Wiring: "bridge"}},
		{"net1", tapConf{Queues: 1, Handoff: "off", Chained: true, KataDan: true}},
	}
	f := newFixture(t)
	f.primeHost(configs[1].conf)
	lists := make([]*libcni.NetworkConfigList, len(configs))
	for i, c := range configs {
		lists[i] = f.list("napitap-killd", c.conf)
	}
	pods := make([]*podNS, workers)
	for w := range pods {
		pods[w] = newPodNS(t, fmt.Sprintf("killd%d", w))
	}
	base := f.snapshot(pods...)
	suffix := nstest.RandomSuffix()

	var mu sync.Mutex
	outcomes := map[string]int{}
	var problems []string
	note := func(key string, problem string) {
		mu.Lock()
		defer mu.Unlock()
		if outcomes[key] == 0 && problem == "" {
			t.Logf("first %q", key)
		}
		outcomes[key]++
		if problem != "" {
			problems = append(problems, problem)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := pods[w]
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := (w + i) % len(configs)
				c, list := configs[k], lists[k]
				r := rt(fmt.Sprintf("killd-%s-w%d-%d", suffix, w, i), p, c.ifName)
				res, err := f.env.Add(list, r)
				switch {
				case err == nil:
					note("ADD succeeded", "")
					if err := f.check(list, c.conf, r, res); err != nil {
						note("CHECK failed", fmt.Sprintf("%s: CHECK after a successful ADD: %v", r.ContainerID, err))
					}
				default:
					msg := regexp.MustCompile(`/tmp/\S+`).ReplaceAllString(err.Error(), "<path>")
					problem := ""
					if strings.Contains(msg, "handoff") && cniCode(err) != types.ErrTryAgainLater {
						problem = fmt.Sprintf("%s: a required hand-off that napitapd drops mid-request must fail ADD with code %d, not %d: %v",
							r.ContainerID, types.ErrTryAgainLater, cniCode(err), err)
					}
					note(fmt.Sprintf("ADD failed with code %d: %s", cniCode(err), firstWords(msg, 14)), problem)
				}
				if err := f.env.Del(list, r); err != nil {
					note("DEL failed", fmt.Sprintf("%s: DEL: %v", r.ContainerID, err))
				}
				if err := nodecheck.Gone(p.Path, nodecheck.Expect{ContainerID: r.ContainerID, IfName: r.IfName, TapName: f.expect(c.conf, r.ContainerID, r.IfName).TapName}); err != nil {
					note("left after DEL", fmt.Sprintf("%s: after DEL: %v", r.ContainerID, err))
				}
			}
		}()
	}
	kills := 0
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	for start := time.Now(); time.Since(start) < duration; kills++ {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		f.d.Kill()
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		f.d.Start()
	}
	close(stop)
	wg.Wait()
	// Back for good: the start-up sweep drops what DEL could not tell it.
	f.d.Kill()
	f.d.Start()
	t.Logf("%d kills of napitapd; outcomes: %s", kills, formatCounts(outcomes))
	for _, p := range problems {
		t.Error(p)
	}
	f.requireSame(base, "after the churn, napitapd restarted", pods...)
}

func firstWords(s string, n int) string {
	w := strings.Fields(s)
	if len(w) > n {
		w = w[:n]
	}
	return strings.Join(w, " ")
}
