package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// benchLaunchEnv makes the re-executed test binary `napitapctl launch --
// sleep 3600` against the seccomp socket it names: launchSleepEnv's
// process, alive for longer than any benchmark.
const benchLaunchEnv = "NAPITAPD_BENCH_LAUNCH"

func init() {
	if socket := os.Getenv(benchLaunchEnv); socket != "" {
		err := seccompagent.Launch(socket, []string{"sleep", "3600"}, os.Environ())
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
}

// Each round's load: half the attachments in fds mode, each holding both
// queues of its tap, half in intercept mode; one launched process, so one
// seccomp listener, each.
const (
	benchAttachments = 100
	benchListeners   = 100
	benchQueues      = 2
)

// BenchmarkTakeover: each round starts a napitapd on the paths of the
// running one, which holds 100 attachments (50 in fds mode with 2 held
// queues each, 50 in intercept mode, every tap real) and 100 seccomp
// listeners (processes under `napitapctl launch`); the new one takes
// everything over and the old one exits 0. A round's takeover time is what
// the new napitapd logs: from its request on the takeover socket to
// serving. A client lists the attachments every 10 ms throughout.
//
//	sudo go test -run '^$' -bench Takeover -benchtime 20x ./cmd/napitapd/
func BenchmarkTakeover(b *testing.B) {
	p, cur, client := startBenchLoad(b, "takeover")
	polls, failures, firstFailure, stopPolling := pollList(client)

	var took, exited []time.Duration
	for b.Loop() {
		start := time.Now()
		next := startNapitapdProc(b, p)
		select {
		case <-cur.done:
		case <-time.After(30 * time.Second):
			b.Fatalf("round %d: the old napitapd did not exit\nold:\n%s\nnew:\n%s", len(took)+1, cur.log, next.log)
		}
		if cur.err != nil {
			b.Fatalf("round %d: the old napitapd exited with %v, want 0\n%s", len(took)+1, cur.err, cur.log)
		}
		exited = append(exited, time.Since(start))
		took = append(took, tookOf(b, next))
		if strings.Contains(next.log.String(), "is lost") || strings.Contains(next.log.String(), "not taken") {
			b.Fatalf("round %d: the new napitapd lost something:\n%s", len(took), next.log)
		}
		cur = next
		// A rollout starts the next pod seconds later, not at once.
		time.Sleep(100 * time.Millisecond)
	}
	stopPolling()

	if n := seccompListeners(b, cur.cmd.Process.Pid); n != benchListeners {
		b.Errorf("after %d rounds the last napitapd holds %d seccomp listeners, want %d", len(took), n, benchListeners)
	}
	checkBenchAttachments(b, client)
	if n := failures.Load(); n > 0 {
		b.Errorf("%d of %d lists failed during the takeovers, the first: %v", n, polls.Load(), firstFailure.Load())
	}

	b.Logf("takeover over %d rounds (request to serving, ms): %s", len(took), millis(took))
	b.Logf("new napitapd started to old exited (ms): %s", millis(exited))
	b.Logf("%d lists of %d attachments during the rounds, %d failed", polls.Load(), benchAttachments, failures.Load())
	b.ReportMetric(ms(percentile(took, 50)), "p50-ms")
	b.ReportMetric(ms(percentile(took, 99)), "p99-ms")
	b.ReportMetric(ms(percentile(exited, 50)), "exit-p50-ms")
	b.ReportMetric(float64(failures.Load()), "list-errors")
	b.ReportMetric(0, "ns/op") // a round's wall time includes process start-up, not the takeover's
}

// startBenchLoad starts a napitapd with flags and gives it the benchmarks'
// load: benchAttachments attachments and benchListeners listeners.
func startBenchLoad(b *testing.B, name string, flags ...string) (paths, *napitapd, *handoff.Client) {
	nstest.RequireRoot(b)
	pod := nstest.New(b, name)
	dir := b.TempDir()
	p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}
	cur := startNapitapdProc(b, p, flags...)
	waitFile(b, p.socket)
	waitFile(b, p.seccomp)

	client := &handoff.Client{Socket: p.socket}
	for i := range benchAttachments {
		registerBenchAttachment(b, client, pod, i)
	}
	launchBenchListeners(b, p.seccomp, benchListeners)
	for deadline := time.Now().Add(time.Minute); seccompListeners(b, cur.cmd.Process.Pid) != benchListeners; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("the first napitapd holds %d seccomp listeners, want %d", seccompListeners(b, cur.cmd.Process.Pid), benchListeners)
		}
	}
	return p, cur, client
}

// pollList lists the attachments every 10 ms until stop is called.
func pollList(client *handoff.Client) (polls, failures *atomic.Int64, firstFailure *atomic.Value, stop func()) {
	polls, failures, firstFailure = &atomic.Int64{}, &atomic.Int64{}, &atomic.Value{}
	done, polled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(polled)
		for t := time.NewTicker(10 * time.Millisecond); ; {
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
			if _, err := client.List(); err != nil {
				failures.Add(1)
				firstFailure.CompareAndSwap(nil, err.Error())
			}
			polls.Add(1)
		}
	}()
	return polls, failures, firstFailure, func() { close(done); <-polled }
}

// BenchmarkCrashRestart: each round SIGKILLs the running napitapd, which
// holds the load of BenchmarkTakeover beside an fd holder, and starts the
// next one at once, as the kubelet restarts a killed container. A round's
// time runs from the SIGKILL to the next one serving, everything taken
// back from the holder (its start-up included). A client lists the
// attachments every 10 ms throughout: its requests wait in the kept
// socket's backlog.
//
//	sudo go test -run '^$' -bench CrashRestart -benchtime 20x ./cmd/napitapd/
func BenchmarkCrashRestart(b *testing.B) {
	holder := filepath.Join(b.TempDir(), "fdstore.sock")
	startHolder(b, holder)
	p, cur, client := startBenchLoad(b, "crash", "--fdstore-socket", holder)
	polls, failures, firstFailure, stopPolling := pollList(client)

	var took []time.Duration
	for b.Loop() {
		start := time.Now()
		_ = cur.cmd.Process.Kill()
		<-cur.done
		next := startNapitapdProc(b, p, "--fdstore-socket", holder)
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(next.log.String(), "msg=serving"); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatalf("round %d: the next napitapd does not serve:\n%s", len(took)+1, next.log)
			}
		}
		took = append(took, time.Since(start))
		if log := next.log.String(); strings.Contains(log, "is lost") || strings.Contains(log, "not taken") || !strings.Contains(log, "fd holder: recovered") {
			b.Fatalf("round %d: the next napitapd lost something:\n%s", len(took), log)
		}
		cur = next
		time.Sleep(100 * time.Millisecond)
	}
	stopPolling()

	if n := seccompListeners(b, cur.cmd.Process.Pid); n != benchListeners {
		b.Errorf("after %d rounds the last napitapd holds %d seccomp listeners, want %d", len(took), n, benchListeners)
	}
	checkBenchAttachments(b, client)
	if n := failures.Load(); n > 0 {
		b.Errorf("%d of %d lists failed through the crashes, the first: %v", n, polls.Load(), firstFailure.Load())
	}
	b.Logf("SIGKILL to the next napitapd serving, over %d rounds (ms): %s", len(took), millis(took))
	b.Logf("%d lists of %d attachments during the rounds, %d failed", polls.Load(), benchAttachments, failures.Load())
	b.ReportMetric(ms(percentile(took, 50)), "p50-ms")
	b.ReportMetric(ms(percentile(took, 99)), "p99-ms")
	b.ReportMetric(float64(failures.Load()), "list-errors")
	b.ReportMetric(0, "ns/op")
}

// registerBenchAttachment makes attachment i's tap in pod and registers
// it: even i in fds mode with both queues held, odd i in intercept mode.
func registerBenchAttachment(b *testing.B, client *handoff.Client, pod *nstest.NetNS, i int) {
	b.Helper()
	key := handoff.Key{ContainerID: fmt.Sprintf("bench-%03d", i), IfName: "net1"}
	tap := fmt.Sprintf("napibt%03d", i)
	var queues []*os.File
	err := ns.WithNetNSPath(pod.Path(), func(ns.NetNS) error {
		var err error
		_, queues, err = tapsetup.Create(tapsetup.Spec{Name: tap, Queues: benchQueues, VnetHdrSize: 12,
			Alias: tapsetup.OwnerAlias(key.ContainerID, key.IfName),
			Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	att := &handoff.Attachment{Key: key, Network: "bench", Netns: pod.Path(), TapName: tap,
		Queues: benchQueues, MultiQueue: true, NAPI: true, VnetHdr: true, VnetHdrSize: 12, Intercept: i%2 == 1}
	held := queues
	if att.Intercept {
		held = nil // the tap is persistent: it stays for the runtime's by-name open
	}
	err = client.Register(att, held)
	tapsetup.CloseQueues(queues)
	if err != nil {
		b.Fatalf("register %s: %v", key, err)
	}
}

// launchBenchListeners starts n processes under the filter, a few at a
// time, each handing its listener to the agent at socket; they are killed
// when the benchmark ends.
func launchBenchListeners(b *testing.B, socket string, n int) {
	b.Helper()
	var mu sync.Mutex
	var errs []error
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), benchLaunchEnv+"="+socket)
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		// A launched process is under the filter once it runs sleep.
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
				if string(comm) == "sleep\n" {
					return
				}
				if time.Now().After(deadline) || len(comm) == 0 {
					mu.Lock()
					errs = append(errs, fmt.Errorf("launched pid %d never ran sleep (comm %q)", cmd.Process.Pid, comm))
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatal(errs)
	}
}

// checkBenchAttachments: the last napitapd still lists every attachment,
// holds every fds-mode queue, and a fetch gives NAPI queues.
func checkBenchAttachments(b *testing.B, client *handoff.Client) {
	b.Helper()
	atts, err := client.List()
	if err != nil {
		b.Fatal(err)
	}
	heldQueues := 0
	for _, a := range atts {
		heldQueues += a.Held
	}
	if len(atts) != benchAttachments || heldQueues != benchAttachments/2*benchQueues {
		b.Fatalf("after the rounds: %d attachments holding %d queues, want %d holding %d", len(atts), heldQueues, benchAttachments, benchAttachments/2*benchQueues)
	}
	key := handoff.Key{ContainerID: "bench-000", IfName: "net1"}
	_, fetched, err := client.Fetch(&key)
	if err != nil {
		b.Fatal(err)
	}
	defer tapsetup.CloseQueues(fetched)
	for i, q := range fetched {
		if flags, err := tapsetup.QueueFlagsOf(q); err != nil || flags&unix.IFF_NAPI == 0 {
			b.Errorf("queue %d of %s fetched after the rounds: flags 0x%x, %v; want IFF_NAPI", i, key, flags, err)
		}
	}
}

var tookRE = regexp.MustCompile(`tookOver=true took=(\S+)`)

// tookOf waits for the new napitapd's "serving" line and returns its took.
func tookOf(b *testing.B, d *napitapd) time.Duration {
	b.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if m := tookRE.FindStringSubmatch(d.log.String()); m != nil {
			took, err := time.ParseDuration(m[1])
			if err != nil {
				b.Fatalf("took=%s: %v", m[1], err)
			}
			return took
		}
		if time.Now().After(deadline) {
			b.Fatalf("the new napitapd never logged tookOver=true:\n%s", d.log)
		}
	}
}

// percentile is nearest-rank: with fewer than 100 samples p99 is the
// maximum.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(int(math.Ceil(p/100*float64(len(s))))-1, 0)]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func millis(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%.1f", ms(d))
	}
	return strings.Join(parts, " ")
}
