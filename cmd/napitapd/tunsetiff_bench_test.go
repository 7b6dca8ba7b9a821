package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/pkg/seccompagent"
	"github.com/napitap/napitap/pkg/tapsetup"
)

// opensEnv makes the re-executed test binary open a tap by name as QEMU
// does, as its JSON opens says, and print each TUNSETIFF's time (opened);
// with openSocketEnv it does so under `napitapctl launch` against that
// seccomp socket.
const (
	opensEnv      = "NAPITAPD_BENCH_OPENS"
	openSocketEnv = "NAPITAPD_BENCH_OPEN_SOCKET"
)

type opens struct {
	Netns, Tap string
	Flags      uint16
	N          int // open, TUNSETIFF, TUNGETIFF, close, N times
}

type opened struct {
	Nanos []int64  // each TUNSETIFF's
	NAPI  int      // queues with IFF_NAPI
	Errs  []string // TUNSETIFFs that failed
}

func init() {
	spec := os.Getenv(opensEnv)
	if spec == "" {
		return
	}
	if socket := os.Getenv(openSocketEnv); socket != "" {
		env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, openSocketEnv+"=") })
		err := seccompagent.Launch(socket, []string{os.Args[0], "-test.run=^$"}, env)
		os.Stderr.WriteString(err.Error() + "\n")
		os.Exit(3)
	}
	res, err := runOpens(spec)
	if err == nil {
		err = json.NewEncoder(os.Stdout).Encode(res)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "opens:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

func runOpens(spec string) (opened, error) {
	var o opens
	var res opened
	if err := json.Unmarshal([]byte(spec), &o); err != nil {
		return res, err
	}
	// The netns and every open on this thread: TUNSETIFF looks the name
	// up in the netns /dev/net/tun was opened in.
	runtime.LockOSThread()
	nsfd, err := unix.Open(o.Netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return res, err
	}
	if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
		return res, fmt.Errorf("setns %s: %w", o.Netns, err)
	}
	for range o.N {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return res, err
		}
		ifr, err := unix.NewIfreq(o.Tap)
		if err != nil {
			return res, err
		}
		ifr.SetUint16(o.Flags)
		start := time.Now()
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
		res.Nanos = append(res.Nanos, time.Since(start).Nanoseconds())
		if err != nil {
			res.Errs = append(res.Errs, err.Error())
		} else if got, _ := unix.NewIfreq(""); unix.IoctlIfreq(fd, unix.TUNGETIFF, got) == nil && got.Uint16()&unix.IFF_NAPI != 0 {
			res.NAPI++
		}
		unix.Close(fd)
	}
	return res, nil
}

// BenchmarkTUNSETIFF is the interception as a VM gets it: a whole
// napitapd (flags added from NAPITAPD_BENCH_FLAGS, e.g. "--log-level
// warn"), an intercept-mode attachment whose tap is made and registered
// as ADD makes and registers it (threaded NAPI, its default, and up), and
// a separate program under `napitapctl launch` opening the tap by name as
// QEMU does, max(b.N, 200) times; beside it, in the same run, the same
// program natively, without and with IFF_NAPI (the kernel's own cost of a
// NAPI queue, a kernel thread's start included). Only the ioctl is timed;
// each figure is the median.
//
//	CI=true go test -run '^$' -bench TUNSETIFF -benchtime 400x ./cmd/napitapd/
func BenchmarkTUNSETIFF(b *testing.B) {
	nstest.RequireRoot(b)
	pod := nstest.New(b, "tunsetiff")
	dir := b.TempDir()
	p := paths{filepath.Join(dir, "napitapd.sock"), filepath.Join(dir, "seccomp.sock"), filepath.Join(dir, "state")}
	startNapitapdProc(b, p, strings.Fields(os.Getenv("NAPITAPD_BENCH_FLAGS"))...)
	waitFile(b, p.socket)
	waitFile(b, p.seccomp)
	key := handoff.Key{ContainerID: "bench-tunsetiff", IfName: "net1"}
	tap := "napibtif0"
	err := ns.WithNetNSPath(pod.Path(), func(ns.NetNS) error {
		link, queues, err := tapsetup.Create(tapsetup.Spec{Name: tap, Queues: 1, VnetHdrSize: 12,
			Alias: tapsetup.OwnerAlias(key.ContainerID, key.IfName),
			Flags: tapsetup.QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}})
		if err != nil {
			return err
		}
		// While ADD's queue is attached (DESIGN.md fact 9).
		err = tapsetup.ApplyNAPIKnobsHere(tap, tapsetup.NAPIKnobs{Threaded: true})
		tapsetup.CloseQueues(queues)
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	})
	if err != nil {
		b.Fatal(err)
	}
	att := &handoff.Attachment{Key: key, Network: "bench", Netns: pod.Path(), TapName: tap,
		Queues: 1, MultiQueue: true, NAPI: true, VnetHdr: true, VnetHdrSize: 12, Intercept: true}
	if err := (&handoff.Client{Socket: p.socket}).Register(att, nil); err != nil {
		b.Fatalf("register %s: %v", key, err)
	}

	n := max(b.N, 200)
	qemu := uint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE)
	median := func(name string, flags uint16, wantNAPI bool, env ...string) float64 {
		spec, err := json.Marshal(opens{Netns: pod.Path(), Tap: tap, Flags: flags, N: n})
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), append(env, opensEnv+"="+string(spec))...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var res opened
		if err == nil {
			err = json.Unmarshal(out, &res)
		}
		if err != nil || len(res.Errs) > 0 {
			b.Fatalf("%s: %v, TUNSETIFF errors %v\n%s", name, err, res.Errs, stderr.String())
		}
		if got := res.NAPI == n; got != wantNAPI {
			b.Fatalf("%s: %d of %d queues with NAPI", name, res.NAPI, n)
		}
		ns := slices.Clone(res.Nanos)
		slices.Sort(ns)
		return float64(ns[len(ns)/2]) / 1e3
	}
	b.ResetTimer()
	native := median("native", qemu, false)
	nativeNAPI := median("native with IFF_NAPI", qemu|unix.IFF_NAPI, true)
	launched := median("under napitapctl launch", qemu, true, openSocketEnv+"="+p.seccomp)
	b.StopTimer()
	b.ReportMetric(native, "native-us")
	b.ReportMetric(nativeNAPI, "native-napi-us")
	b.ReportMetric(launched, "launched-us")
	b.ReportMetric(launched-native, "added-us")
	b.ReportMetric(launched-nativeNAPI, "added-over-napi-us")
	b.ReportMetric(0, "ns/op")
}
