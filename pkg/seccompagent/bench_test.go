package seccompagent

import (
	"log/slog"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// BenchmarkTUNSETIFF measures, in one run, the median TUNSETIFF of a
// QEMU-like queue open: natively, natively with IFF_NAPI (what the agent's
// own work adds on top of NAPI's setup), through the agent on a managed
// tap, the same by a caller of uid 107 on a tap it owns (KubeVirt's QEMU,
// whose credentials napitapd takes on), through the agent on an
// unmanaged one (a CONTINUE), and natively with IFF_NAPI and through the
// agent on a tap with threaded NAPI, as ADD makes it by default, whose
// queues each start a kernel thread in the TUNSETIFF. Each is
// max(b.N, 200) open/TUNSETIFF/close cycles in a process of its own; only
// the ioctl is timed. The agent is in the benchmark's process, without
// napitapd's queue record, metrics and log: cmd/napitapd's
// BenchmarkTUNSETIFF measures a whole napitapd.
//
//	CI=true go test -run '^$' -bench TUNSETIFF -benchtime 2000x ./pkg/seccompagent/
func BenchmarkTUNSETIFF(b *testing.B) {
	nstest.RequireRoot(b)
	pod := nstest.New(b, "seccomp")
	newTap(b, pod, tapSpec{name: "napisc0", multiQueue: true})
	newTap(b, pod, tapSpec{name: "napisc1", multiQueue: true})
	qemu := 107
	owner := uint32(qemu)
	newTap(b, pod, tapSpec{name: "napisc2", multiQueue: true, owner: &owner})
	newTap(b, pod, tapSpec{name: "napisc3", multiQueue: true, threaded: true})
	ta := startAgent(b, slog.LevelWarn)
	ta.manage(b, pod, "napisc0", Target{NAPI: true, MultiQueue: true})
	ta.manage(b, pod, "napisc2", Target{NAPI: true, MultiQueue: true})
	ta.manage(b, pod, "napisc3", Target{NAPI: true, MultiQueue: true})

	cycles := max(b.N, 200)
	median := func(name string, tap string, flags uint16, socket string, wantNAPI bool, uid *int) float64 {
		res := runTargetProc(b, targetSpec{Netns: pod.Path(), Tap: tap, Flags: flags, Cycles: cycles, UID: uid, GID: uid}, socket)
		if len(res.CycleErrs) > 0 {
			b.Fatalf("%s: TUNSETIFF errors %v", name, res.CycleErrs)
		}
		if got := res.CycleNAPI == cycles; got != wantNAPI {
			b.Fatalf("%s: %d of %d cycles with NAPI", name, res.CycleNAPI, cycles)
		}
		ns := slices.Clone(res.CycleNanos)
		slices.Sort(ns)
		return float64(ns[len(ns)/2]) / 1e3
	}
	b.ResetTimer()
	native := median("native", "napisc0", qemuFlags, "", false, nil)
	nativeNAPI := median("native with IFF_NAPI", "napisc0", qemuFlags|unix.IFF_NAPI, "", true, nil)
	agent := median("agent", "napisc0", qemuFlags, ta.socket, true, nil)
	agent107 := median("agent, uid 107", "napisc2", qemuFlags, ta.socket, true, &qemu)
	cont := median("agent, unmanaged", "napisc1", qemuFlags, ta.socket, false, nil)
	threadedNAPI := median("native with IFF_NAPI, threaded", "napisc3", qemuFlags|unix.IFF_NAPI, "", true, nil)
	threaded := median("agent, threaded", "napisc3", qemuFlags, ta.socket, true, nil)
	b.StopTimer()
	b.ReportMetric(native, "native-us")
	b.ReportMetric(nativeNAPI, "native-napi-us")
	b.ReportMetric(agent, "agent-us")
	b.ReportMetric(agent107, "agent-uid107-us")
	b.ReportMetric(agent-native, "added-us")
	b.ReportMetric(agent/native, "agent/native")
	b.ReportMetric(cont, "continue-us")
	b.ReportMetric(threadedNAPI, "native-napi-threaded-us")
	b.ReportMetric(threaded, "agent-threaded-us")
	b.ReportMetric(0, "ns/op")
}
