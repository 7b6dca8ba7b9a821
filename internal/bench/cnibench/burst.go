package cnibench

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/procfs"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
	"github.com/napitap/napitap/pkg/handoff"
)

// burstKind is one kind of pod the bursts add: a 4-queue tap, standalone.
type burstKind struct {
	id, label, plugin string
	conf              []byte
	// handoff: napitapd holds the tap's queues, and is measured doing it.
	handoff bool
}

// burstKinds are napitap as configured by default (root qdisc noqueue),
// napitap with the kernel's default root qdisc (mq), and the reference
// plugin's multiqueue tap, which is up and gets the kernel's default too.
func (b *bench) burstKinds() ([]burstKind, error) {
	withHandoff := func(extra map[string]any) map[string]any {
		m := map[string]any{"handoff": map[string]any{"socket": b.daemon.socket, "required": true}}
		maps.Copy(m, extra)
		return napitapConf(4, true, m)
	}
	defs := []struct {
		id, label, plugin string
		conf              map[string]any
		handoff           bool
	}{
		{"napitap", "napitap, 4 NAPI queues, hand-off (default root qdisc: noqueue)", "napitap", withHandoff(nil), true},
		{"napitap-mq", `napitap, 4 NAPI queues, hand-off, "rootQdisc": "mq"`, "napitap", withHandoff(map[string]any{"rootQdisc": "mq"}), true},
		{"tap", "tap plugin (reference), multiQueue", "tap", map[string]any{"type": "tap", "multiQueue": true}, false},
	}
	var kinds []burstKind
	for _, d := range defs {
		conf, err := stepConf(step{typ: d.plugin, conf: d.conf}, nil)
		if err != nil {
			return nil, err
		}
		kinds = append(kinds, burstKind{id: d.id, label: d.label, plugin: d.plugin, conf: conf, handoff: d.handoff})
	}
	return kinds, nil
}

// bursts adds N pods at once, each into a pod netns of its own, measures
// the kernel's slab and napitapd while they are held, then deletes them at
// once; for every N, each kind of pod in turn, the order rotating. The pod
// netns are made once, for the largest burst, and reused.
func (b *bench) bursts(ctx context.Context) ([]BurstResult, error) {
	kinds, err := b.burstKinds()
	if err != nil {
		return nil, err
	}
	most := slices.Max(b.opt.bursts)
	fmt.Fprintf(os.Stderr, "napitap-bench cni: making %d pod netns for the bursts\n", most)
	pods := make([]*netNS, most)
	for i := range pods {
		if pods[i], err = b.newNetNS(fmt.Sprintf("burst-%03d", i)); err != nil {
			return nil, err
		}
	}
	var out []BurstResult
	for round, n := range b.opt.bursts {
		for k := range kinds {
			kind := kinds[(round+k)%len(kinds)]
			if err := b.settle(ctx); err != nil {
				return out, err
			}
			r := b.burst(ctx, kind, pods[:n])
			fmt.Fprintf(os.Stderr, "napitap-bench cni: burst %d %s: ADD %s, DEL %s, %d+%d failures, slab per pod %s\n",
				n, kind.id, fmtDur(r.AddWall), fmtDur(r.DelWall), r.AddFailures, r.DelFailures, fmtMiB(r.SlabPerPod()))
			out = append(out, r)
			if f := b.failed(); f >= maxFailures {
				return out, fmt.Errorf("stopped after %d ADD/DEL failures", f)
			}
		}
	}
	return out, nil
}

// burst runs one burst to the end, DEL included, even when interrupted.
func (b *bench) burst(ctx context.Context, kind burstKind, pods []*netNS) BurstResult {
	n := len(pods)
	res := BurstResult{Kind: kind.id, Label: kind.label, Pods: n, Handoff: kind.handoff}
	prefix := fmt.Sprintf("napitap-bench-%s-burst%d-%s-", b.suffix, n, kind.id)
	what := fmt.Sprintf("burst %d %s", n, kind.id)

	// all runs command for every pod at once: one batch in the launcher,
	// which prepares every exec, then forks them back to back.
	all := func(command string) ([]run, time.Duration) {
		invs := make([]invocation, n)
		reqs := make([]launch.Req, n)
		for i := range n {
			invs[i] = invocation{Plugin: kind.plugin, Command: command, ContainerID: prefix + fmt.Sprint(i), Netns: pods[i].Path(), IfName: "tap0", Conf: kind.conf}
			reqs[i] = b.request(invs[i])
		}
		runs := make([]run, n)
		res, err := b.launcher.batch(reqs)
		if err != nil {
			for i := range runs {
				runs[i].Err = err
			}
			return runs, 0
		}
		for i := range runs {
			runs[i] = toRun(invs[i], res.Results[i])
		}
		return runs, res.Wall
	}
	tally := func(command string, runs []run, s *Series) int {
		failures := 0
		for i, r := range runs {
			if r.Err != nil {
				failures++
				b.fail("%s: %s %s%d: %v", what, command, prefix, i, r.Err)
				continue
			}
			s.Add(r.Wall, r.CPU, r.MaxRSS)
			s.SysTotal += r.Sys
		}
		return failures
	}
	held := func() (attachments, queues int, err error) {
		list, err := (&handoff.Client{Socket: b.daemon.socket}).List()
		for _, a := range list {
			if strings.HasPrefix(a.Key.ContainerID, prefix) {
				attachments++
				queues += a.Held
			}
		}
		return attachments, queues, err
	}

	res.SlabBefore = settledSlab(ctx)
	runs, wall := all("ADD")
	res.AddWall = wall
	res.AddFailures = tally("ADD", runs, &res.Add)
	res.SlabHolding = settledSlab(ctx)

	var err error
	if kind.handoff {
		if res.Holding, err = b.daemon.stats(); err != nil {
			b.fail("%s: napitapd stats: %v", what, err)
		}
		if res.HeldAttachments, res.HeldQueues, err = held(); err != nil {
			b.fail("%s: napitapd list: %v", what, err)
		}
		if want := n - res.AddFailures; res.HeldAttachments != want || res.HeldQueues != 4*want {
			b.fail("%s: napitapd holds %d attachments with %d queues, want %d with %d", what, res.HeldAttachments, res.HeldQueues, want, 4*want)
		}
	}

	runs, wall = all("DEL")
	res.DelWall = wall
	res.DelFailures = tally("DEL", runs, &res.Del)
	res.SlabAfter = settledSlab(ctx)

	if res.After, err = b.daemon.stats(); err != nil {
		b.fail("%s: napitapd stats: %v", what, err)
	}
	if left, _, err := held(); err != nil || left > 0 {
		b.fail("%s: napitapd still holds %d attachments after DEL (err %v)", what, left, err)
	}
	for _, pod := range pods {
		if links, err := linksOf(pod); err != nil || len(links) > 0 {
			b.fail("%s: pod netns %s after DEL: links %v, err %v", what, pod.Name, links, err)
		}
	}
	return res
}

// settledSlab reads the kernel's slab once it holds still: the kernel
// frees some of it after the execs exit, through RCU and workqueues. It
// waits for two reads 250 ms apart within 256 KiB of each other, at most
// 10 s.
func settledSlab(ctx context.Context) Slab {
	const (
		every = 250 * time.Millisecond
		still = 256 << 10
	)
	last := readSlab()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return last
		case <-time.After(every):
		}
		now := readSlab()
		if d := now.Total - last.Total; -still < d && d < still {
			return now
		}
		last = now
	}
	return last
}

// readSlab reads Slab and SUnreclaim from /proc/meminfo, zero if it cannot.
func readSlab() Slab {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return Slab{}
	}
	m, err := fs.Meminfo()
	if err != nil || m.SlabBytes == nil || m.SUnreclaimBytes == nil {
		return Slab{}
	}
	return Slab{Total: int64(*m.SlabBytes), Unreclaimable: int64(*m.SUnreclaimBytes)}
}
