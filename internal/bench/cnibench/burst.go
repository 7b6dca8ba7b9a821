package cnibench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/napitap/napitap/internal/bench/cnibench/launch"
	"github.com/napitap/napitap/pkg/handoff"
)

// bursts adds N pods at once, each into a pod netns of its own, with
// napitap standalone (4 NAPI queues) handing them off to napitapd; measures
// napitapd while it holds them; then deletes them at once. The pod netns
// are made once, for the largest burst, and reused.
func (b *bench) bursts(ctx context.Context) ([]BurstResult, error) {
	most := slices.Max(b.opt.bursts)
	fmt.Fprintf(os.Stderr, "napitap-bench cni: making %d pod netns for the bursts\n", most)
	pods := make([]*netNS, most)
	for i := range pods {
		var err error
		if pods[i], err = b.newNetNS(fmt.Sprintf("burst-%03d", i)); err != nil {
			return nil, err
		}
	}
	conf, err := stepConf(step{typ: "napitap", conf: napitapConf(4, true, map[string]any{
		"handoff": map[string]any{"socket": b.daemon.socket, "required": true},
	})}, nil)
	if err != nil {
		return nil, err
	}
	var out []BurstResult
	for _, n := range b.opt.bursts {
		if err := b.settle(ctx); err != nil {
			return out, err
		}
		r := b.burst(pods[:n], conf)
		fmt.Fprintf(os.Stderr, "napitap-bench cni: burst %d: ADD %s, DEL %s, %d+%d failures\n", n, fmtDur(r.AddWall), fmtDur(r.DelWall), r.AddFailures, r.DelFailures)
		out = append(out, r)
		if f := b.failed(); f >= maxFailures {
			return out, fmt.Errorf("stopped after %d ADD/DEL failures", f)
		}
	}
	return out, nil
}

// burst runs one burst to the end, DEL included, even when interrupted.
func (b *bench) burst(pods []*netNS, conf []byte) BurstResult {
	n := len(pods)
	res := BurstResult{Pods: n}
	prefix := fmt.Sprintf("napitap-bench-%s-burst%d-", b.suffix, n)

	// all runs command for every pod at once: one batch in the launcher,
	// which prepares every exec, then forks them back to back.
	all := func(command string) ([]run, time.Duration) {
		invs := make([]invocation, n)
		reqs := make([]launch.Req, n)
		for i := range n {
			invs[i] = invocation{Plugin: "napitap", Command: command, ContainerID: prefix + fmt.Sprint(i), Netns: pods[i].Path(), IfName: "tap0", Conf: conf}
			reqs[i] = b.request(invs[i], nil)
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
				b.fail("burst %d: %s %s%d: %v", n, command, prefix, i, r.Err)
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

	res.SlabBefore = meminfoKiB("Slab") * 1024
	runs, wall := all("ADD")
	res.AddWall = wall
	res.AddFailures = tally("ADD", runs, &res.Add)

	var err error
	res.SlabHolding = meminfoKiB("Slab") * 1024
	if res.Holding, err = b.daemon.stats(); err != nil {
		b.fail("burst %d: napitapd stats: %v", n, err)
	}
	if res.HeldAttachments, res.HeldQueues, err = held(); err != nil {
		b.fail("burst %d: napitapd list: %v", n, err)
	}
	if want := n - res.AddFailures; res.HeldAttachments != want || res.HeldQueues != 4*want {
		b.fail("burst %d: napitapd holds %d attachments with %d queues, want %d with %d", n, res.HeldAttachments, res.HeldQueues, want, 4*want)
	}

	runs, wall = all("DEL")
	res.DelWall = wall
	res.DelFailures = tally("DEL", runs, &res.Del)

	if res.After, err = b.daemon.stats(); err != nil {
		b.fail("burst %d: napitapd stats: %v", n, err)
	}
	if left, _, err := held(); err != nil || left > 0 {
		b.fail("burst %d: napitapd still holds %d attachments after DEL (err %v)", n, left, err)
	}
	for _, pod := range pods {
		if links, err := pod.links(); err != nil || len(links) > 0 {
			b.fail("burst %d: pod netns %s after DEL: links %v, err %v", n, pod.Name, links, err)
		}
	}
	return res
}

// meminfoKiB reads one field of /proc/meminfo, 0 if it cannot.
func meminfoKiB(key string) int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	return statusKiB(b, key)
}
