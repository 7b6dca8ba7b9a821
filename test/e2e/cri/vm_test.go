package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/pkg/handoff"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/nodecheck"
	"github.com/napitap/napitap/test/e2e/vm"
)

// vmmRef is the VMM container's image: an empty rootfs of mount points
// and merged-/usr symlinks, into which the test mounts the host's /usr
// (QEMU, its libraries and firmware) and the guest kernel read-only.
const vmmRef = "napicri.local/vmm:test"

// Throughput of the guest's TCP stream to a peer on the node, per case.
const (
	guestSend = 8 << 20
	guestRecv = 1 << 20
)

// TestVMContainersGetNAPIQueuesThroughTheSeccompAgent runs QEMU in a
// container of a CRI pod sandbox, as a VMM pod would (KubeVirt's
// virt-launcher, minus KubeVirt), opening napitap's tap of that sandbox by
// name (-netdev tap,ifname=tap0,queues=2) on an intercept-mode network.
// Under the Localhost profile `napitapctl seccomp-profile vmm` renders,
// the OCI runtime hands the container's seccomp listener to napitapd,
// whose agent performs QEMU's TUNSETIFFs with IFF_NAPI: the guest's TCP
// segments are GRO-merged on the tap (DESIGN.md fact 10). The same
// container under RuntimeDefault gets plain queues and nothing is merged.
// Removing the pods leaves nothing: no tap, no attachment, no listener in
// napitapd. Each case runs under runc (containerd's default) and crun
// (CRI-O's, so OpenShift Virtualization's), whose listenerPath code is
// their own.
func TestVMContainersGetNAPIQueuesThroughTheSeccompAgent(t *testing.T) {
	nstest.RequireRoot(t)
	crihelp.RequireTools(t, "containerd", "ctr", "runc", "crun", "nsenter", "ip", "qemu-system-x86_64")
	crictl := crihelp.BuildCrictl(t)
	crihelp.EnsureCgroups(t)
	repo, err := crihelp.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	kernel, initrd, err := vm.Artifacts(filepath.Join(repo, ".cache", "vm"))
	if err != nil {
		t.Fatal(err)
	}
	root := crihelp.NewRoot(t, "napicrivm")
	n := crihelp.Start(t, crihelp.Config{
		Root: root, BinDir: binDir, Crictl: crictl, Name: "napicrivm", Subnet: "10.197.0.0/24",
		Queues: 2, HandoffMode: "intercept", NapitapExtra: `"groFlushTimeout": 200000`,
	})
	crihelp.WriteVMMImage(t, n, vmmRef, "guest", "out")
	profile := writeProfile(t, n)

	cases := []struct {
		name       string
		runtime    string // the runtime handler, named after its OCI runtime
		profile    string // Localhost profile path; empty: RuntimeDefault
		wantMerged bool
	}{
		{"QEMU by name under runc and the vmm Localhost profile gets NAPI queues from napitapd's agent", "runc", profile, true},
		{"the same QEMU under runc and RuntimeDefault gets plain queues", "runc", "", false},
		{"QEMU by name under crun and the vmm Localhost profile gets NAPI queues from napitapd's agent", "crun", profile, true},
		{"the same QEMU under crun and RuntimeDefault gets plain queues", "crun", "", false},
	}
	type key struct {
		runtime string
		napi    bool
	}
	throughput := map[key]float64{}
	t.Cleanup(func() {
		for _, rt := range crihelp.OCIRuntimes {
			napi, plain := throughput[key{rt, true}], throughput[key{rt, false}]
			if napi > 0 && plain > 0 {
				t.Logf("%s: guest -> node peer, %d MiB, guest TSO off, TCG: vmm profile (NAPI) %.0f Mbit/s, RuntimeDefault (plain) %.0f Mbit/s: %.2fx",
					rt, guestSend>>20, napi, plain, napi/plain)
			}
		}
	})
	for i, tc := range cases {
		ok := t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			fdsBefore := napitapdFds(t, n.Napitapd)
			p := runVMPod(t, n, i, tc.runtime, tc.profile != "")
			want := nodecheck.Expect{ContainerID: p.id, IfName: "eth0", TapName: "tap0", Queues: 2, NAPI: true,
				Wiring: "tc-redirect", Socket: n.Socket, Held: 0}
			if err := nodecheck.Present(p.netns, want); err != nil {
				t.Fatalf("after runp: %v", err)
			}

			gateway, err := crihelp.Gateway(n.Subnet)
			if err != nil {
				t.Fatal(err)
			}
			sink := crihelp.ListenIn(t, n.NetNS, gateway+":5001", func(c net.Conn) (int64, error) { return io.CopyN(io.Discard, c, guestSend) })
			source := crihelp.ListenIn(t, n.NetNS, gateway+":5002", func(c net.Conn) (int64, error) { return io.CopyN(c, crihelp.ZeroReader{}, guestRecv) })
			capture := crihelp.StartCapture(t, p.netns, "tap0")

			script := fmt.Sprintf(`ping -c 3 %[1]s && echo PING-OK
dd if=/dev/zero bs=65536 count=%[2]d 2>/dev/null | nc %[1]s 5001 && echo SENT-OK
echo "RECEIVED $(nc %[1]s 5002 | wc -c)"
`, gateway, guestSend/65536)
			guest := vm.Guest{IP: p.ip + "/24", Gateway: gateway, MAC: p.mac, Script: script}
			outDir := filepath.Join(n.Root, fmt.Sprintf("vm-%d", i))
			if err := os.MkdirAll(outDir, 0o755); err != nil {
				t.Fatal(err)
			}
			netdev := "tap,id=n0,ifname=tap0,script=no,downscript=no,vhost=off,queues=2"
			argv := vm.QEMUArgs("/guest/"+filepath.Base(kernel), "/guest/"+filepath.Base(initrd), netdev, 2, guest, "/out/serial.log", true)
			cfg := writeVMMContainerConfig(t, n, i, argv, filepath.Dir(kernel), outDir, tc.profile)
			ctr := n.Crictl("create", p.id, cfg, p.config)
			n.CheckSeccomp(t, ctr, tc.profile != "")
			n.Crictl("start", ctr)
			t.Logf("QEMU container %.12s started %v after runp", ctr, time.Since(start).Round(time.Millisecond))

			serial := filepath.Join(outDir, "serial.log")
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			if err := waitExited(ctx, n, ctr); err != nil {
				t.Fatalf("%v\nserial:\n%s\nQEMU's log:\n%s", err, tailFile(serial, 3000), tailFile(filepath.Join(n.Root, "logs", fmt.Sprint(i), "vmm.log"), 3000))
			}
			out := readFile(serial)
			for _, w := range []string{vm.MarkerUp, "PING-OK", "SENT-OK", fmt.Sprintf("RECEIVED %d", guestRecv), vm.MarkerDone + "0"} {
				if !strings.Contains(out, w) {
					t.Errorf("guest output lacks %q:\n%s", w, crihelp.Tail(out, 2000))
				}
			}
			throughput[key{tc.runtime, tc.profile != ""}] = sink.Mbits()
			t.Logf("guest -> peer %.0f Mbit/s (%d bytes), peer -> guest %d bytes", sink.Mbits(), sink.Bytes(), source.Bytes())
			if got := sink.Bytes(); got != guestSend {
				t.Errorf("peer received %d bytes from the guest, want %d", got, guestSend)
			}
			seen := capture.Stop()
			merged := seen.MaxLen > crihelp.MaxFrame
			t.Logf("tap0 ingress: %v", seen)
			if merged != tc.wantMerged {
				t.Errorf("GRO merged guest segments: %v (longest frame %d), want %v", merged, seen.MaxLen, tc.wantMerged)
			}
			checkAgentLog(t, n, p, tc.runtime, tc.profile != "")

			n.Crictl("stopp", p.id)
			if err := nodecheck.Gone(p.netns, want); err != nil {
				t.Errorf("after stopp: %v", err)
			}
			n.Crictl("rmp", p.id)
			if crihelp.Exists(p.netns) {
				t.Errorf("netns file %s is still there after rmp", p.netns)
			}
			if atts, err := (&handoff.Client{Socket: n.Socket}).List(); err != nil || len(atts) > 0 {
				t.Errorf("napitapd after rmp holds %+v (%v), want nothing", atts, err)
			}
			// The listener goes when the last process under its filter
			// has been reaped: poll for napitapd's fds to be as before.
			var fds []string
			err = crihelp.Poll(10*time.Second, func() error {
				fds = napitapdFds(t, n.Napitapd)
				if listeners := countPrefix(fds, "anon_inode:seccomp notify"); listeners > 0 || len(fds) > len(fdsBefore) {
					return fmt.Errorf("%d seccomp listeners, %d fds (%d before)", listeners, len(fds), len(fdsBefore))
				}
				return nil
			})
			if err != nil {
				t.Errorf("napitapd after rmp: %v: %q", err, fds)
			}
			if tc.profile != "" {
				done := regexp.MustCompile(`msg="seccomp listener done: every process under its filter has exited" listener="pod napicri/` +
					regexp.QuoteMeta(p.name) + ` container \\"vmm\\" pid \d+" listeners=0`)
				if !done.MatchString(n.Napitapd.ReadLog()) {
					t.Errorf("napitapd did not log that it let the listener of %s go with none left:\n%s", p.name, crihelp.Tail(n.Napitapd.ReadLog(), 3000))
				}
			}
			t.Logf("case took %v", time.Since(start).Round(time.Millisecond))
		})
		if !ok {
			return // cleanup removes what is left
		}
	}
	for _, line := range strings.Split(n.Napitapd.ReadLog(), "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("napitapd: %s", line)
		}
	}
	if links := crihelp.LinkNames(t, n.NetNS); strings.Join(links, " ") != "lo napicrivm0" {
		t.Errorf("node netns links after rmp: %v, want only lo and napicrivm0", links)
	}
	if left := crihelp.AttachmentStates(n.StateDir); len(left) > 0 {
		t.Errorf("napitapd state dir %s not empty: %v", n.StateDir, left)
	}
	if pids := crihelp.ShimsOf(n.Address); len(pids) > 0 {
		t.Errorf("shims still running after rmp: %v", pids)
	}
}

// vmPod is one pod sandbox of a VM case.
type vmPod struct {
	id, name, uid string
	config        string // the PodSandboxConfig file, which crictl create wants too
	netns         string
	ip, mac       string // the guest takes eth0's: tc-redirect wiring
}

// runVMPod runs a pod sandbox under runtime's handler; its name says
// which runtime and whether its VMM gets the vmm profile, so that
// napitapd's log lines of one case name no other.
func runVMPod(t *testing.T, n *crihelp.Node, i int, runtime string, napi bool) *vmPod {
	t.Helper()
	p := &vmPod{name: "napicri-vm-plain-" + runtime, uid: fmt.Sprintf("napicri-vm-%s-%d", filepath.Base(n.Root), i)}
	if napi {
		p.name = "napicri-vm-napi-" + runtime
	}
	cfg := map[string]any{
		"metadata":      map[string]any{"name": p.name, "namespace": "napicri", "uid": p.uid, "attempt": 0},
		"hostname":      p.name,
		"log_directory": filepath.Join(n.Root, "logs", fmt.Sprint(i)),
		"linux":         map[string]any{"cgroup_parent": n.Cgroup},
	}
	p.config = writeJSON(t, filepath.Join(n.Root, fmt.Sprintf("vm-pod-%d.json", i)), cfg)
	p.id = n.Crictl("runp", "--runtime", runtime, p.config)
	n.Track(p.id)
	sb, err := n.InspectSandbox(p.id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != "SANDBOX_READY" || sb.IP == nil {
		t.Fatalf("sandbox %.12s: state %s, ip %v", p.id, sb.State, sb.IP)
	}
	p.netns, p.ip = sb.NetNS, sb.IP.String()
	err = ns.WithNetNSPath(p.netns, func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			p.mac = l.Attrs().HardwareAddr.String()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("pod %s (%s): sandbox %.12s, guest ip %s mac %s, netns %s", p.name, runtime, p.id, p.ip, p.mac, p.netns)
	return p
}

// writeProfile renders the vmm profile for this node's napitapd with
// napitapctl, as the DaemonSet installs it.
func writeProfile(t *testing.T, n *crihelp.Node) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "napitapctl"), "seccomp-profile", "--listener", n.Napitapd.SeccompSocket, "vmm").Output()
	if err != nil {
		t.Fatalf("napitapctl seccomp-profile: %v", err)
	}
	path := filepath.Join(n.Root, "vmm.json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeVMMContainerConfig writes the ContainerConfig of the QEMU
// container: /dev/net/tun as a device (what KubeVirt's tun device plugin
// gives virt-launcher), the host's /usr and the guest's dir read-only,
// outDir for the serial console, and the seccomp profile.
func writeVMMContainerConfig(t *testing.T, n *crihelp.Node, i int, argv []string, guestDir, outDir, profile string) string {
	t.Helper()
	seccomp := map[string]any{"profile_type": 0} // RuntimeDefault
	if profile != "" {
		seccomp = map[string]any{"profile_type": 2, "localhost_ref": profile}
	}
	cfg := map[string]any{
		"metadata": map[string]any{"name": "vmm"},
		"image":    map[string]any{"image": vmmRef},
		"command":  argv,
		"log_path": "vmm.log",
		"mounts": []map[string]any{
			{"container_path": "/usr", "host_path": "/usr", "readonly": true},
			{"container_path": "/etc/ld.so.cache", "host_path": "/etc/ld.so.cache", "readonly": true},
			{"container_path": "/guest", "host_path": guestDir, "readonly": true},
			{"container_path": "/out", "host_path": outDir},
		},
		"devices": []map[string]any{{"container_path": "/dev/net/tun", "host_path": "/dev/net/tun", "permissions": "rw"}},
		"linux":   map[string]any{"security_context": map[string]any{"seccomp": seccomp}},
	}
	return writeJSON(t, filepath.Join(n.Root, fmt.Sprintf("vm-container-%d.json", i)), cfg)
}

// checkAgentLog: under the profile, the runtime's listener reached
// napitapd with the pod's CRI annotations and both of QEMU's queues were
// attached with NAPI; without it, napitapd heard nothing from the pod.
func checkAgentLog(t *testing.T, n *crihelp.Node, p *vmPod, runtime string, napi bool) {
	t.Helper()
	log := n.Napitapd.ReadLog()
	var served, attached []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `msg="serving seccomp listener"`) && strings.Contains(line, "pod napicri/"+p.name+" ") {
			served = append(served, line)
		}
		if strings.Contains(line, `msg="attached the caller's queue with NAPI"`) && strings.Contains(line, "attachment="+p.id+"/eth0") {
			attached = append(attached, line)
		}
	}
	for _, l := range append(served, attached...) {
		t.Logf("napitapd: %s", l)
	}
	if !napi {
		if len(served)+len(attached) > 0 {
			t.Errorf("napitapd served a pod without the profile: %q", append(served, attached...))
		}
		return
	}
	if len(served) != 1 {
		t.Errorf("napitapd logged %d listeners from %s for %s, want 1:\n%s", len(served), runtime, p.name, crihelp.Tail(log, 3000))
	} else {
		// napitapd names the process that connected by comm: runc create,
		// or crun create (whose helper, cloned from the container's init,
		// sends the listener on that connection). crun create may have
		// exited by the time napitapd looks, and then no comm is logged.
		sender := fmt.Sprintf(`sender="peer pid \d+ uid 0( comm %s)?"`, regexp.QuoteMeta(runtime))
		if !regexp.MustCompile(sender).MatchString(served[0]) {
			t.Errorf("listener line does not name %s as its sender (%s): %s", runtime, sender, served[0])
		}
		for _, want := range []string{`container \"vmm\"`, "sandbox_id=" + p.id, "sandbox_uid=" + p.uid, "metadata=vmm", "status=creating"} {
			if !strings.Contains(served[0], want) {
				t.Errorf("listener line lacks %q: %s", want, served[0])
			}
		}
	}
	if len(attached) != 2 || !strings.Contains(strings.Join(attached, "\n"), "tap=tap0") {
		t.Errorf("napitapd attached %d of QEMU's queues with NAPI, want 2:\n%s", len(attached), crihelp.Tail(log, 3000))
	}
}

// waitExited waits until the container has exited (the guest powers off,
// QEMU exits) with status 0.
func waitExited(ctx context.Context, n *crihelp.Node, id string) error {
	for {
		out, err := n.CrictlRun("inspect", "-o", "json", id)
		if err != nil {
			return err
		}
		var st struct {
			Status struct {
				State    string
				ExitCode int32
				Reason   string
				Message  string
			}
		}
		if err := json.Unmarshal(out, &st); err != nil {
			return fmt.Errorf("crictl inspect %s: %v", id, err)
		}
		if st.Status.State == "CONTAINER_EXITED" {
			if st.Status.ExitCode != 0 {
				return fmt.Errorf("container %.12s exited %d (%s %s)", id, st.Status.ExitCode, st.Status.Reason, st.Status.Message)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("container %.12s still %s: %w", id, st.Status.State, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func napitapdFds(t *testing.T, d *crihelp.Napitapd) []string {
	t.Helper()
	fds, err := d.Fds()
	if err != nil {
		t.Fatalf("napitapd's fds: %v", err)
	}
	return fds
}

func countPrefix(list []string, prefix string) int {
	c := 0
	for _, s := range list {
		if strings.HasPrefix(s, prefix) {
			c++
		}
	}
	return c
}

func writeJSON(t *testing.T, path string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func tailFile(p string, n int) string { return crihelp.Tail(readFile(p), n) }
