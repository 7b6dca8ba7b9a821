package cnibench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// variant is one plugin chain with a pod netns of its own, reused by every
// iteration: netns creation, and the kernel's asynchronous netns teardown
// (cleanup_net takes rtnl and waits for RCU), would otherwise land in
// whichever exec runs next.
type variant struct {
	res    *VariantResult
	steps  []step
	pod    *netNS
	ifName string
}

type step struct {
	typ  string
	conf map[string]any
	exe  string // the plugin's binary if not typ in the bin dir (--against)
}

// stepConf is what libcni would write on the plugin's stdin: the plugin's
// config with the network's name and version and the previous result.
func stepConf(s step, prev json.RawMessage) ([]byte, error) {
	m := maps.Clone(s.conf)
	m["cniVersion"], m["name"] = cniVersion, networkName
	if prev != nil {
		m["prevResult"] = prev
	}
	return json.Marshal(m)
}

func napitapConf(queues int, napi bool, extra map[string]any) map[string]any {
	m := map[string]any{"type": "napitap", "queues": queues, "napi": napi}
	maps.Copy(m, extra)
	return m
}

// variants makes the (a), (b), (b4), (c) and (d). No config ever
// asks for threaded NAPI (DESIGN.md fact 9).
func (b *bench) variants() ([]*variant, error) {
	noHandoff := map[string]any{"handoff": map[string]any{"disabled": true}}
	bridge := map[string]any{
		"type": "bridge", "bridge": "napibr-" + b.suffix, "isGateway": true,
		"ipam": map[string]any{"type": "host-local", "subnet": "10.250.0.0/16", "dataDir": filepath.Join(b.tmp, "ipam")},
	}
	type def = struct {
		id, label, ifName string
		ref               bool
		plugins           []map[string]any
	}
	defs := []def{
		// The reference creates the same kind of device as (b4): a
		// multiqueue tap (it opens no queue either way).
		{"a", "(a) tap plugin (reference)", "tap0", true, []map[string]any{{"type": "tap", "multiQueue": true}}},
		{"b", "(b) napitap, 1 plain queue", "tap0", false, []map[string]any{napitapConf(1, false, noHandoff)}},
		{"b4", "(b4) napitap, 4 NAPI queues", "tap0", false, []map[string]any{napitapConf(4, true, noHandoff)}},
		{"c", "(c) bridge + napitap 4 NAPI, tc-redirect", "eth0", false, []map[string]any{bridge,
			napitapConf(4, true, map[string]any{"wiring": "tc-redirect", "handoff": map[string]any{"disabled": true}})}},
		{"d", "(d) (c) + hand-off to napitapd", "eth0", false, []map[string]any{bridge,
			napitapConf(4, true, map[string]any{"wiring": "tc-redirect", "handoff": map[string]any{"socket": b.daemon.socket, "required": true}})}},
	}
	var out []*variant
	add := func(d def, twinOf string) error {
		pod, err := b.newNetNS("pod-" + d.id)
		if err != nil {
			return err
		}
		v := &variant{pod: pod, ifName: d.ifName, res: &VariantResult{ID: d.id, Label: d.label, Reference: d.ref, TwinOf: twinOf}}
		for _, p := range d.plugins {
			typ := p["type"].(string)
			s := step{typ: typ, conf: p}
			if twinOf != "" && typ == "napitap" {
				s.exe = b.opt.against
			}
			v.steps = append(v.steps, s)
			v.res.Plugins = append(v.res.Plugins, typ)
		}
		v.res.AddSteps, v.res.DelSteps = make([]Series, len(v.steps)), make([]Series, len(v.steps))
		cfg, err := json.Marshal(d.plugins)
		if err != nil {
			return err
		}
		v.res.Config = strings.ReplaceAll(string(cfg), b.tmp, "$TMP")
		out = append(out, v)
		return nil
	}
	for _, d := range defs {
		if !d.ref && len(b.opt.only) > 0 && !slices.Contains(b.opt.only, d.id) {
			continue
		}
		if err := add(d, ""); err != nil {
			return nil, err
		}
		if b.opt.against == "" || d.ref {
			continue
		}
		// The same chain with the other napitap, interleaved with it.
		twin := d
		twin.id, twin.label = d.id+"-against", d.label+", --against"
		if err := add(twin, d.id); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// chainRun is one ADD or DEL of a whole chain.
type chainRun struct {
	total  time.Duration // the sum of the plugin execs: what the runtime waits for
	cpu    time.Duration
	rss    int64
	steps  []run // chain order, DEL too
	result json.RawMessage
	err    error
}

func (c *chainRun) record(r run) {
	c.total += r.Wall
	c.cpu += r.CPU
	c.rss = max(c.rss, r.MaxRSS)
}

// add runs ADD through the chain as libcni's AddNetworkList does, each
// plugin getting the previous one's result.
func (b *bench) add(ctx context.Context, v *variant, cid string) chainRun {
	c := chainRun{steps: make([]run, len(v.steps))}
	var prev json.RawMessage
	for i, s := range v.steps {
		conf, err := stepConf(s, prev)
		if err != nil {
			c.err = err
			break
		}
		r := b.exec(ctx, invocation{Plugin: s.typ, Command: "ADD", ContainerID: cid, Netns: v.pod.Path(), IfName: v.ifName, Conf: conf, Exe: s.exe})
		c.steps[i] = r
		c.record(r)
		if r.Err != nil {
			c.err = fmt.Errorf("%s: %w", s.typ, r.Err)
			break
		}
		prev = r.Stdout
	}
	c.result = prev
	return c
}

// del runs DEL through the chain in reverse, each plugin getting the final
// ADD result, as libcni's DelNetworkList does. Unlike libcni it goes on
// after an error, so that the bench leaves nothing behind.
func (b *bench) del(ctx context.Context, v *variant, cid string, result json.RawMessage) chainRun {
	c := chainRun{steps: make([]run, len(v.steps))}
	for i := len(v.steps) - 1; i >= 0; i-- {
		s := v.steps[i]
		conf, err := stepConf(s, result)
		if err != nil {
			c.err = err
			continue
		}
		r := b.exec(ctx, invocation{Plugin: s.typ, Command: "DEL", ContainerID: cid, Netns: v.pod.Path(), IfName: v.ifName, Conf: conf, Exe: s.exe})
		c.steps[i] = r
		c.record(r)
		if r.Err != nil && c.err == nil {
			c.err = fmt.Errorf("%s: %w", s.typ, r.Err)
		}
	}
	return c
}

// interleaved runs, per iteration, ADD of every variant, then DEL of every
// variant, each phase in an order rotating from one iteration to the next
// and followed by a pause of --settle. A DEL right after its own ADD
// would inherit that ADD's RCU work: closing a queue fd queues RCU
// callbacks, and DEL of a netdevice waits in rcu_barrier() for every
// callback queued, so it would charge the ADD to the DEL. Pods live
// longer than that.
func (b *bench) interleaved(ctx context.Context, vs []*variant) error {
	total := b.opt.warmup + b.opt.iterations
	partner := twins(vs)
	for it := range total {
		// at is the variant in place i of the rotation. A variant and its
		// --against twin trade places every other iteration: in the
		// rotation the twin always comes right after it, and what ran just
		// before (the reference plugin, say) leaves the kernel work (RCU
		// callbacks, a netdevice's teardown) that the next exec pays for.
		at := func(i int) int {
			if p, ok := partner[i]; ok && it%2 == 1 {
				return p
			}
			return i
		}
		record := it >= b.opt.warmup
		adds := make([]chainRun, len(vs))
		cid := func(v *variant) string { return fmt.Sprintf("napitap-bench-%s-%s-%d", b.suffix, v.res.ID, it) }
		for k := range vs {
			if err := ctx.Err(); err != nil {
				return b.unwind(vs, adds, cid, err)
			}
			i := at((it + k) % len(vs))
			adds[i] = b.add(ctx, vs[i], cid(vs[i]))
			b.recordAdd(vs[i], cid(vs[i]), adds[i], record)
		}
		if err := b.settle(ctx); err != nil {
			return b.unwind(vs, adds, cid, err)
		}
		// DEL in the reverse rotation, so that no variant's DEL always
		// comes first after the ADDs.
		for k := range vs {
			i := at((it + len(vs) - 1 - k) % len(vs))
			del := b.del(ctx, vs[i], cid(vs[i]), adds[i].result)
			b.recordDel(vs[i], cid(vs[i]), adds[i], del, record)
		}
		if n := b.failed(); n >= maxFailures {
			return fmt.Errorf("stopped after %d ADD/DEL failures", n)
		}
		if err := b.settle(ctx); err != nil {
			return err
		}
		if done := it + 1 - b.opt.warmup; record && (done%25 == 0 || done == b.opt.iterations) {
			fmt.Fprintf(os.Stderr, "napitap-bench cni: iteration %d/%d\n", done, b.opt.iterations)
		}
	}
	return nil
}

// twins maps the index of each variant that has an --against twin to the
// twin's, and back.
func twins(vs []*variant) map[int]int {
	partner := map[int]int{}
	for i, v := range vs {
		for j, w := range vs {
			if w.res.TwinOf != "" && w.res.TwinOf == v.res.ID {
				partner[i], partner[j] = j, i
			}
		}
	}
	return partner
}

func (b *bench) settle(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.opt.settle):
		return nil
	}
}

// unwind DELs, untimed, what an interrupted iteration ADDed.
func (b *bench) unwind(vs []*variant, adds []chainRun, cid func(*variant) string, err error) error {
	for i, v := range vs {
		if adds[i].steps != nil {
			_ = b.del(context.Background(), v, cid(v), adds[i].result)
		}
	}
	return err
}

func (b *bench) recordAdd(v *variant, cid string, add chainRun, record bool) {
	if add.err != nil {
		v.res.AddFailures++
		b.fail("%s ADD %s: %v", v.res.Label, cid, add.err)
		return
	}
	if !record {
		return
	}
	v.res.Add.Add(add.total, add.cpu, add.rss)
	for i, r := range add.steps {
		v.res.AddSteps[i].Add(r.Wall, r.CPU, r.MaxRSS)
	}
}

// recordDel records a DEL; after a failed ADD it was the runtime's
// clean-up, and only its failure counts.
func (b *bench) recordDel(v *variant, cid string, add, del chainRun, record bool) {
	if del.err != nil {
		v.res.DelFailures++
		b.fail("%s DEL %s: %v", v.res.Label, cid, del.err)
		return
	}
	if !record || add.err != nil {
		return
	}
	v.res.Del.Add(del.total, del.cpu, del.rss)
	for i, r := range del.steps {
		v.res.DelSteps[i].Add(r.Wall, r.CPU, r.MaxRSS)
	}
}

// checkLeftovers: after the loop every pod netns holds only lo, the host
// netns only lo and the bridge, and host-local no reservation.
func (b *bench) checkLeftovers(vs []*variant) {
	for _, v := range vs {
		links, err := linksOf(v.pod)
		if err != nil || len(links) > 0 {
			b.fail("%s: pod netns %s after the last DEL: links %v, err %v", v.res.Label, v.pod.Name, links, err)
		}
	}
	links, err := linksOf(b.host)
	links = slices.DeleteFunc(links, func(l string) bool { return l == "napibr-"+b.suffix+"/bridge" })
	if err != nil || len(links) > 0 {
		b.fail("host netns %s after the last DEL: links %v besides lo and the bridge, err %v", b.host.Name, links, err)
	}
	entries, _ := os.ReadDir(filepath.Join(b.tmp, "ipam", networkName))
	for _, e := range entries {
		if name := e.Name(); name != "lock" && !strings.HasPrefix(name, "last_reserved_ip") {
			b.fail("host-local still reserves %s after the last DEL", name)
		}
	}
}
