package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
)

// BenchmarkThickPluginFloor weighs a thick plugin (a thin plugin asking a
// long-lived daemon to do ADD, as Multus's thick plugin does; issue 46)
// against this one. A thin plugin costs about what this plugin's VERSION
// verb does: Go's start, skel and the package inits, nearly all of them
// skel's and the runtime's. The daemon costs at least what the same ADD
// costs run again in a warm process (no start, caches built, stacks
// grown), before it reads the request and checks who sent it. Each
// iteration runs all three, so that they share the machine's load; the
// metrics are medians of CPU time (user+sys), the exec'd ones from wait4,
// the in-process one from getrusage.
func BenchmarkThickPluginFloor(b *testing.B) {
	nstest.RequireRoot(b)
	dir, err := cnitest.Build(".")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	pod := nstest.New(b, "thick")
	// (b4) of napitap-bench cni: four NAPI queues, threaded, no hand-off.
	conf := `{"cniVersion":"1.1.0","name":"napitap-bench","type":"napitap","queues":4,"napi":true,"handoff":{"disabled":true}}`
	args := &skel.CmdArgs{ContainerID: "napitap-thick", Netns: pod.Path(), IfName: "tap0", StdinData: []byte(conf)}
	run := func(verb string) time.Duration {
		cmd := exec.Command(dir + "/napitap")
		cmd.Env = []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=" + args.ContainerID, "CNI_NETNS=" + args.Netns,
			"CNI_IFNAME=" + args.IfName, "CNI_PATH=" + dir}
		cmd.Stdin = strings.NewReader(conf)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("napitap %s: %v: %s", verb, err, out)
		}
		return cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	devNull, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer devNull.Close()
	inProcess := func(verb func(*skel.CmdArgs) error) time.Duration {
		stdout := os.Stdout
		os.Stdout = devNull // PrintResult's
		defer func() { os.Stdout = stdout }()
		before := selfCPU()
		if err := verb(args); err != nil {
			b.Fatal(err)
		}
		return selfCPU() - before
	}
	// The first in-process ADD builds the caches a daemon would have.
	inProcess(cmdAdd)
	inProcess(cmdDel)

	var execAdd, version, warmAdd []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		execAdd = append(execAdd, run("ADD"))
		run("DEL")
		version = append(version, run("VERSION"))
		warmAdd = append(warmAdd, inProcess(cmdAdd))
		inProcess(cmdDel)
	}
	b.StopTimer()
	ms := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / float64(time.Millisecond)
	}
	e, v, w := ms(execAdd), ms(version), ms(warmAdd)
	b.ReportMetric(e, "ms-cpu/exec-ADD")
	b.ReportMetric(v, "ms-cpu/exec-VERSION")
	b.ReportMetric(w, "ms-cpu/warm-ADD")
	b.ReportMetric((v+w)/e, "thick-floor/exec-ADD")
	b.Logf("median CPU, %d each: exec'd ADD %.2f ms; a thick plugin's floor %.2f ms (VERSION %.2f + warm ADD %.2f)", b.N, e, v+w, v, w)
}

func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
