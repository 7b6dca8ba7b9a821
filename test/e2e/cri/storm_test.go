package cri

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/napitap/napitap/internal/nstest"
	"github.com/napitap/napitap/test/e2e/crihelp"
)

// TestASignalStormUnderRuncsFilterNeverYieldsEEXIST: runc 1.1.5 installs
// the vmm profile's filter without WAIT_KILLABLE_RECV, so a signal that
// reaches a container's thread while napitapd's agent attaches its queue
// makes the kernel restart the TUNSETIFF on an attached fd. A container
// under the profile attaches and closes a queue of its pod's tap 300
// times while a thread of its own sends the attaching thread SIGURG
// without pause: every attach must succeed with NAPI, none get EEXIST.
func TestASignalStormUnderRuncsFilterNeverYieldsEEXIST(t *testing.T) {
	nstest.RequireRoot(t)
	crihelp.RequireTools(t, "containerd", "ctr", "runc", "nsenter", "ip")
	crictl := crihelp.BuildCrictl(t)
	crihelp.EnsureCgroups(t)
	root := crihelp.NewRoot(t, "napicristorm")
	n := crihelp.Start(t, crihelp.Config{
		Root: root, BinDir: binDir, Crictl: crictl, Name: "napicrist", Subnet: "10.198.0.0/24",
		Queues: 2, HandoffMode: "intercept",
	})
	crihelp.WriteVMMImage(t, n, vmmRef, "guest", "out")
	profile := writeProfile(t, n)
	p := runVMPod(t, n, 0, "runc", true)

	const attempts = 300
	cfg := map[string]any{
		"metadata": map[string]any{"name": "vmm"},
		"image":    map[string]any{"image": vmmRef},
		"command":  []string{"/storm", "tap0", fmt.Sprint(attempts)},
		"log_path": "vmm.log",
		"mounts": []map[string]any{
			{"container_path": "/storm", "host_path": filepath.Join(binDir, "tunstorm"), "readonly": true},
		},
		"devices": []map[string]any{{"container_path": "/dev/net/tun", "host_path": "/dev/net/tun", "permissions": "rw"}},
		"linux":   map[string]any{"security_context": map[string]any{"seccomp": map[string]any{"profile_type": 2, "localhost_ref": profile}}},
	}
	ctr := n.Crictl("create", p.id, writeJSON(t, filepath.Join(root, "storm-container.json"), cfg), p.config)
	start := time.Now()
	n.Crictl("start", ctr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logPath := filepath.Join(root, "logs", "0", "vmm.log")
	if err := waitExited(ctx, n, ctr); err != nil {
		t.Fatalf("%v\n%s", err, tailFile(logPath, 2000))
	}
	took := time.Since(start)

	var res struct {
		Attempts int
		Errnos   map[string]int
		NAPI     int
		Signals  int64
	}
	for _, line := range strings.Split(readFile(logPath), "\n") {
		// CRI log lines: "<time> stdout F <message>"
		if i := strings.Index(line, `{"attempts"`); i >= 0 {
			if err := json.Unmarshal([]byte(line[i:]), &res); err != nil {
				t.Fatalf("tunstorm output %q: %v", line, err)
			}
		}
	}
	log := n.Napitapd.ReadLog()
	restarts := strings.Count(log, "TUNSETIFF restarted by a signal")
	t.Logf("%d attaches in %v under %d signals: errnos %v, %d with NAPI; napitapd answered %d restarted calls",
		res.Attempts, took.Round(time.Millisecond), res.Signals, res.Errnos, res.NAPI, restarts)
	if res.Attempts != attempts || res.Errnos["0"] != attempts || res.NAPI != attempts {
		t.Errorf("want all %d attaches to succeed with NAPI; container log:\n%s", attempts, tailFile(logPath, 2000))
	}
	if res.Signals == 0 {
		t.Errorf("no signal was sent: the storm proves nothing")
	}
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			t.Errorf("napitapd: %s", line)
		}
	}

	n.Crictl("stopp", p.id)
	n.Crictl("rmp", p.id)
	err := crihelp.Poll(10*time.Second, func() error {
		fds := napitapdFds(t, n.Napitapd)
		if c := countPrefix(fds, "anon_inode:seccomp notify"); c > 0 {
			return fmt.Errorf("%d seccomp listeners", c)
		}
		return nil
	})
	if err != nil {
		t.Errorf("napitapd after rmp: %v", err)
	}
	_ = os.Remove(logPath)
}
