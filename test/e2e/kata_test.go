package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/napitap/napitap/internal/cnitest"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/pkg/tapsetup"
	"github.com/napitap/napitap/test/e2e/vm"
	"golang.org/x/sys/unix"
)

// TestKataDanGuestGetsNAPIThroughTheShimWrapper is Kata runtime-rs as far as
// it runs here (no KVM for Kata): the CNI chain of deploy/kata's NADs
// (bridge + napitap with kataDan, intercept, 2 queues) runs in a throwaway
// node netns; a shim-like process opens the DAN tap's queues by name there
// and runs an unmodified QEMU with them as fds=, as runtime-rs does (DESIGN.md
// facts 18, 24), started through the shipped shim wrapper the way
// containerd starts a sandbox's shim. Its guest reaches the bridge's
// gateway with the pod's address, and GRO merges its segments on the tap:
// NAPI. The same shim started without the wrapper gets plain queues.
func TestKataDanGuestGetsNAPIThroughTheShimWrapper(t *testing.T) {
	cases := []struct {
		name         string
		wrapped      bool
		wantMerged   bool
		wantAttaches int
	}{
		{"QEMU given the queues a shim under the wrapper opened by name in the node's netns sends through NAPI", true, true, 2},
		{"the same shim and QEMU without the wrapper get no NAPI", false, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGuestTraffic(t, guestNet{handoff: config.HandoffIntercept, kataDan: true}, func(t *testing.T, b bootSpec) guestVM {
				return bootKataShim(t, b, tc.wrapped)
			})
			if r.merged() != tc.wantMerged {
				t.Errorf("GRO merged guest segments: %v (longest frame %d), want %v", r.merged(), r.maxLen, tc.wantMerged)
			}
			if r.agentAttaches != tc.wantAttaches {
				t.Errorf("napitapd's seccomp agent attached %d queues with NAPI, want %d", r.agentAttaches, tc.wantAttaches)
			}
		})
	}
}

// bootKataShim is runtime-rs's QEMU path: a shim-like process opens the
// DAN tap's 2 queues by name, as runtime-rs's shim does (O_NONBLOCK,
// IFF_MULTI_QUEUE), and runs QEMU with them as fds= (DESIGN.md fact 24;
// vhost off: this machine has no vhost-net), started by the wrapper
// deploy/kata/containerd-shim-kata-napitap-v2 as KATA_SHIM for a
// sandbox's start, or directly.
func bootKataShim(t *testing.T, b bootSpec, wrapped bool) guestVM {
	t.Helper()
	qemu := vm.QEMUArgs(b.Kernel, b.Initrd, "tap,id=n0,fds={fds},vhost=off", 2, b.Guest, b.Serial, true)
	shim := filepath.Join(binDir, "fake-kata-shim")
	open := fmt.Sprintf("FAKE_KATA_SHIM_OPEN=%s,2,%x", b.Tap, unix.IFF_TAP|unix.IFF_NO_PI|unix.IFF_VNET_HDR|unix.IFF_MULTI_QUEUE)
	shimArgs := append([]string{"-namespace", "k8s.io", "-id", b.Env.ContainerID, "start", "--"}, qemu...)
	argv := []string{"nsenter", "--net=" + b.TapNetns.Path(), "--", "env", open}
	if !wrapped {
		return startVM(t, append(append(argv, shim), shimArgs...), b.Serial)
	}
	wrapper, err := filepath.Abs("../../deploy/kata/containerd-shim-kata-napitap-v2")
	if err != nil {
		t.Fatal(err)
	}
	argv = append(argv, "KATA_SHIM="+shim, "NAPITAPCTL="+filepath.Join(binDir, "napitapctl"),
		"NAPITAP_SECCOMP_SOCKET="+b.Daemon.SeccompSocket, wrapper)
	return startVM(t, append(argv, shimArgs...), b.Serial)
}

// TestKataGoRuntimeTapsGetNAPIThroughTheShimWrapper: Kata's Go runtime
// (kata-deploy's kata-qemu, kata-clh) refuses a host-tap DAN file and
// makes its own tap in the pod netns, whose queues its shim opens and
// hands to the VMM (DESIGN.md fact 23): napitap's tap is never opened. A
// shim started through the shipped wrapper runs under napitapctl launch,
// whose listener gives the taps the tree creates NAPI as well. The fake
// shim makes its 2-queue tap as the Go runtime does and probes GRO on each
// queue: merged under the wrapper, nothing without it.
func TestKataGoRuntimeTapsGetNAPIThroughTheShimWrapper(t *testing.T) {
	nstest.RequireRoot(t)
	node := nstest.New(t, "katago-node")
	d := startNapitapd(t, node.Path())
	wrapper, err := filepath.Abs("../../deploy/kata/containerd-shim-kata-napitap-v2")
	if err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(binDir, "fake-kata-shim")
	cases := []struct {
		name    string
		wrapped bool
	}{
		{"the tap a shim under the wrapper makes gets NAPI on every queue", true},
		{"the same shim without the wrapper gets plain queues", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "katago-pod")
			before := d.ReadLog()
			argv := []string{"nsenter", "--net=" + pod.Path(), "--"}
			if tc.wrapped {
				argv = append(argv, "env", "KATA_SHIM="+shim, "NAPITAPCTL="+filepath.Join(binDir, "napitapctl"),
					"NAPITAP_SECCOMP_SOCKET="+d.SeccompSocket, wrapper)
			} else {
				argv = append(argv, shim)
			}
			cmd := exec.Command(argv[0], append(argv[1:], "-namespace", "k8s.io", "-id", "katago", "start")...)
			cmd.Dir = t.TempDir() // no config.json: a sandbox's start
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v\n%s", argv, err, out)
			}
			t.Logf("%s", out)
			want := fmt.Sprintf("merged=%v", tc.wrapped)
			if n := strings.Count(string(out), want); n != 2 {
				t.Errorf("%d of the 2 queues probed %s", n, want)
			}
			log := strings.TrimPrefix(d.ReadLog(), before)
			created, attached := strings.Count(log, "the caller created a tap, with NAPI on its queue"), strings.Count(log, "attached the caller's queue with NAPI")
			if want := map[bool]int{true: 1, false: 0}[tc.wrapped]; created != want || attached != 2*want {
				t.Errorf("napitapd logged %d taps created and %d queues attached with NAPI, want %d and %d:\n%s", created, attached, want, 2*want, log)
			}
		})
	}
}

// TestEveryRuntimeRsVMMOpensTheShippedKataNADsAsItCan: each runtime-rs VMM
// opens a DAN tap its own way (DESIGN.md fact 24): the shim opens the
// queues for QEMU (the file's queue_num) and Cloud Hypervisor (its TOML's
// network_queues, 1 in kata-deploy's), Firecracker and Dragonball open
// it themselves (Dragonball's vhost backend queue_num, its virtio backend
// one). Each way, under the shipped wrapper, opens the tap of
// deploy/kata/nad.yaml with NAPI on every queue; nad-multiqueue.yaml's
// suits the VMMs that open as many as the file says, and the others get
// the kernel's EINVAL, as the NAD says.
func TestEveryRuntimeRsVMMOpensTheShippedKataNADsAsItCan(t *testing.T) {
	const (
		single = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
		multi  = single | unix.IFF_MULTI_QUEUE
	)
	type vmm struct {
		name   string
		queues int
		flags  uint16
		want   string // "napi" on every queue, or the errno's name
	}
	nads := []struct {
		file string
		vmms []vmm
	}{
		{"nad.yaml", []vmm{
			{"QEMU: the shim opens queue_num queues", 1, single, "napi"},
			{"Cloud Hypervisor: the shim opens network_queues queues", 1, single, "napi"},
			{"Firecracker opens one queue", 1, single, "napi"},
			{"Dragonball's vhost backend opens queue_num queues", 1, single, "napi"},
			{"Dragonball's virtio backend opens one queue", 1, single, "napi"},
		}},
		{"nad-multiqueue.yaml", []vmm{
			{"QEMU: the shim opens queue_num queues", 2, multi, "napi"},
			{"Dragonball's vhost backend opens queue_num queues", 2, multi, "napi"},
			{"Cloud Hypervisor: the shim opens network_queues queues", 1, single, "EINVAL"},
			{"Firecracker opens one queue", 1, single, "EINVAL"},
		}},
	}
	wrapper, err := filepath.Abs("../../deploy/kata/containerd-shim-kata-napitap-v2")
	if err != nil {
		t.Fatal(err)
	}
	for _, nad := range nads {
		t.Run(nad.file, func(t *testing.T) {
			e := cnitest.NewEnv(t, binDir)
			d := startNapitapd(t, e.Host.Path())
			napitap := shippedNapitap(t, filepath.Join("..", "..", "deploy", "kata", nad.file), d.Socket, t.TempDir())
			list := e.List("1.1.0", e.BridgePlugin(), napitap)
			rt := e.RT("eth0")
			e.MustAdd(list, rt)
			t.Cleanup(func() {
				if err := e.Del(list, rt); err != nil {
					t.Errorf("DEL: %v", err)
				}
			})
			tap := config.NodeTapName(e.ContainerID, "eth0")
			gro := uint64(200_000)
			if err := tapsetup.ApplyNAPIKnobs(e.Host.Path(), tap, tapsetup.NAPIKnobs{GROFlushTimeout: &gro}); err != nil {
				t.Fatal(err)
			}
			for _, v := range nad.vmms {
				t.Run(v.name, func(t *testing.T) {
					cmd := exec.Command("nsenter", "--net="+e.Host.Path(), "--", "env",
						"KATA_SHIM="+filepath.Join(binDir, "fake-kata-shim"), "NAPITAPCTL="+filepath.Join(binDir, "napitapctl"),
						"NAPITAP_SECCOMP_SOCKET="+d.SeccompSocket, fmt.Sprintf("FAKE_KATA_SHIM_OPEN=%s,%d,%x", tap, v.queues, v.flags),
						wrapper, "-namespace", "k8s.io", "-id", e.ContainerID, "start")
					cmd.Dir = t.TempDir() // no config.json: a sandbox's start
					out, err := cmd.CombinedOutput()
					if err != nil {
						t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
					}
					t.Logf("%d queue(s), TUNSETIFF flags %#x:\n%s", v.queues, v.flags, out)
					want, n := "errno="+v.want, 1
					if v.want == "napi" {
						want, n = "merged=true", v.queues
					}
					if got := strings.Count(string(out), want); got != n {
						t.Errorf("%d lines say %s, want %d", got, want, n)
					}
				})
			}
		})
	}
}

// shippedNapitap is the napitap object of the NAD at path, its hand-off
// socket and DAN dir the test's own.
func shippedNapitap(t *testing.T, path, socket, danDir string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The config is the NAD's literal block: the lines after "config: |",
	// indented by four spaces.
	_, block, ok := strings.Cut(string(b), "config: |\n")
	if !ok {
		t.Fatalf("%s has no config block", path)
	}
	var conf strings.Builder
	for _, line := range strings.Split(block, "\n") {
		if line != "" && !strings.HasPrefix(line, "    ") {
			break
		}
		conf.WriteString(strings.TrimPrefix(line, "    ") + "\n")
	}
	var list struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal([]byte(conf.String()), &list); err != nil || len(list.Plugins) != 2 || list.Plugins[1]["type"] != "napitap" {
		t.Fatalf("%s: %v: want bridge then napitap:\n%s", path, err, conf.String())
	}
	napitap := list.Plugins[1]
	napitap["handoff"].(map[string]any)["socket"] = socket
	napitap["handoff"].(map[string]any)["required"] = true
	napitap["kataDan"].(map[string]any)["dir"] = danDir
	out, err := json.Marshal(napitap)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
