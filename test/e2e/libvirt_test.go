package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/napitap/napitap/pkg/config"
	"github.com/napitap/napitap/test/e2e/crihelp"
	"github.com/napitap/napitap/test/e2e/vm"
)

// TestLibvirtDomainOnTheTapGetsNAPIOnlyUnderTheLauncher boots the guest as
// a domain of an unmodified libvirt (Debian's libvirtd 9.0 and QEMU 7.2,
// TCG) whose <interface type='ethernet'> names napitap's tap with
// managed='no', so that libvirtd opens the tap by name, one TUNSETIFF per
// queue, as KubeVirt's virt-launcher does. The attachment is in intercept
// mode in both cases: the only difference is whether libvirtd was started
// under `napitapctl launch`. Launched, napitapd's seccomp agent performs
// libvirtd's TUNSETIFFs with IFF_NAPI and GRO merges the guest's segments
// on the tap; without the launcher nothing is merged (DESIGN.md facts 6,
// 12, 14).
func TestLibvirtDomainOnTheTapGetsNAPIOnlyUnderTheLauncher(t *testing.T) {
	cases := []struct {
		name         string
		launch       bool
		wantMerged   bool
		wantAttaches int
	}{
		{"a domain of a libvirtd started under napitapctl launch sends through NAPI", true, true, 2},
		{"the same domain of a libvirtd started without the launcher gets no NAPI", false, false, 0},
	}
	throughput := map[bool]float64{}
	t.Cleanup(func() {
		if throughput[true] > 0 && throughput[false] > 0 {
			t.Logf("libvirt domain, guest -> peer, 8 MiB, guest TSO off: libvirtd under napitapctl launch %.0f Mbit/s, without %.0f Mbit/s: %.2fx",
				throughput[true], throughput[false], throughput[true]/throughput[false])
		}
	})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := runGuestTraffic(t, guestNet{handoff: config.HandoffIntercept}, func(t *testing.T, b bootSpec) guestVM {
				var launcher []string
				if tc.launch {
					launcher = []string{filepath.Join(binDir, "napitapctl"), "launch", "--seccomp-socket", b.Daemon.SeccompSocket, "--"}
				}
				lv := startLibvirtd(t, b.Env.Pod.Path(), launcher)
				return lv.boot(t, vm.Domain{
					Name: "napitap-lv-" + b.Env.Suffix, Kernel: b.Kernel, Initrd: b.Initrd, Guest: b.Guest,
					Tap: "tap0", Queues: 2, SerialPath: b.Serial, NoGuestTSO: true,
					ScriptPath: filepath.Join(t.TempDir(), "guest.sh"),
				})
			})
			throughput[tc.launch] = r.out
			if r.merged() != tc.wantMerged {
				t.Errorf("GRO merged guest segments: %v (longest frame %d), want %v", r.merged(), r.maxLen, tc.wantMerged)
			}
			if r.agentAttaches != tc.wantAttaches {
				t.Errorf("napitapd's seccomp agent attached %d of libvirtd's queues with NAPI, want %d", r.agentAttaches, tc.wantAttaches)
			}
		})
	}
}

// libvirtd is a libvirt daemon of the test's own, in a pod netns and a
// private mount namespace where test-owned dirs stand in for /etc/libvirt,
// /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt:
// the node's own libvirt (if any) is never touched.
type libvirtd struct {
	dir     string
	uri     string
	logPath string // libvirtd's own log
	cmd     *exec.Cmd
	done    chan struct{}
}

// The daemon's config. libvirt's DAC and cgroup handling need what a
// test netns and no systemd do not have (DESIGN.md fact 14); QEMU runs as
// root, its console file is opened by libvirtd (no virtlogd), and no
// private /dev is made for it.
const (
	libvirtdConf = `unix_sock_dir = "%[1]s/sock"
auth_unix_rw = "none"
auth_unix_ro = "none"
log_outputs = "3:file:%[1]s/libvirtd.log"
`
	libvirtQEMUConf = `security_driver = "none"
cgroup_controllers = [ ]
user = "+0"
group = "+0"
dynamic_ownership = 0
remember_owner = 0
stdio_handler = "file"
namespaces = [ ]
`
)

// libvirtMounts runs in the private mount namespace (unshare --mount
// --propagation private), so nothing it mounts is seen outside. /var gets
// an overlay and /run a tmpfs so that libvirt's dirs can be made without
// making them on the node; the daemon's dirs are then the test's. libvirt
// looks up its libvirt-qemu user and kvm/libvirt-qemu groups at start
// even when QEMU runs as root: the test's copies of passwd and group have
// them.
const libvirtMounts = `set -eu
d=$1
shift
# A tmpfs where /tmp cannot be an overlay's upper dir (an overlay itself):
# libvirtd needs nothing else of /var.
mount -t overlay napitap-libvirt-var -o "lowerdir=/var,upperdir=$d/var/upper,workdir=$d/var/work" /var ||
	mount -t tmpfs -o mode=0755 napitap-libvirt-var /var
mount -t tmpfs -o mode=0755 napitap-libvirt-run /run
for m in run:/run/libvirt lib:/var/lib/libvirt cache:/var/cache/libvirt log:/var/log/libvirt; do
	mkdir -p "${m#*:}"
	mount --bind "$d/${m%%:*}" "${m#*:}"
done
test -d /etc/libvirt || { echo "/etc/libvirt is missing: is libvirt installed (hack/deps.sh)?" >&2; exit 1; }
mount --bind "$d/etc" /etc/libvirt
mount --bind "$d/passwd" /etc/passwd
mount --bind "$d/group" /etc/group
exec "$@"
`

// startLibvirtd starts libvirtd in the netns podNetns, prefixed by
// launcher (e.g. `napitapctl launch ... --`; none when empty), waits until
// virsh gets an answer, and stops it by PID when the test ends, after the
// domains the test defined are gone.
func startLibvirtd(t *testing.T, podNetns string, launcher []string) *libvirtd {
	t.Helper()
	crihelp.RequireTools(t, "libvirtd", "virsh", "nsenter", "unshare", "mount")
	// Short: libvirtd's sockets live here, and a unix socket path has
	// 107 bytes at most (t.TempDir's can take 90 of them).
	dir, err := os.MkdirTemp("", "napitap-libvirt-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, sub := range []string{"etc", "run", "lib", "cache", "log", "sock", "var/upper", "var/work"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{
		"etc/libvirtd.conf": fmt.Sprintf(libvirtdConf, dir),
		"etc/qemu.conf":     libvirtQEMUConf,
		"mounts.sh":         libvirtMounts,
	}
	if files["passwd"], files["group"], err = libvirtAccounts(); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lv := &libvirtd{
		dir:     dir,
		uri:     "qemu:///system?socket=" + filepath.Join(dir, "sock", "libvirt-sock"),
		logPath: filepath.Join(dir, "libvirtd.log"),
		done:    make(chan struct{}),
	}
	argv := append(append([]string{}, launcher...),
		"nsenter", "--net="+podNetns, "--",
		"unshare", "--mount", "--propagation", "private", "--",
		"sh", filepath.Join(dir, "mounts.sh"), dir,
		"libvirtd", "-f", filepath.Join(dir, "etc", "libvirtd.conf"))
	out, err := os.Create(filepath.Join(dir, "libvirtd.out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	t0 := time.Now()
	lv.cmd = exec.Command(argv[0], argv[1:]...)
	lv.cmd.Stdout, lv.cmd.Stderr = out, out
	lv.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := lv.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = lv.cmd.Wait(); close(lv.done) }()
	t.Cleanup(func() { lv.stop(t) })

	err = crihelp.Poll(30*time.Second, func() error {
		select {
		case <-lv.done:
			return errors.New("libvirtd exited")
		default:
		}
		_, err := lv.virsh("version")
		return err
	})
	if err != nil {
		t.Fatalf("libvirtd (pid %d) does not answer on %s: %v\n%s", lv.cmd.Process.Pid, lv.uri, err, lv.logs())
	}
	// Mostly libvirt probing QEMU's capabilities, each time: its cache
	// is the test's.
	t.Logf("libvirtd (pid %d) answered after %v", lv.cmd.Process.Pid, time.Since(t0).Round(time.Millisecond))
	return lv
}

// libvirtAccounts returns copies of /etc/passwd and /etc/group with
// libvirt's accounts added where missing, at ids nobody uses.
func libvirtAccounts() (passwd, group string, err error) {
	p, err := os.ReadFile("/etc/passwd")
	if err != nil {
		return "", "", err
	}
	g, err := os.ReadFile("/etc/group")
	if err != nil {
		return "", "", err
	}
	passwd, group = string(p), string(g)
	names, ids := accountNames(group), accountIDs(passwd, group)
	free := func() int {
		id := 64055 // Debian's dynamic system range, where libvirt's usually are
		for ids[id] {
			id++
		}
		ids[id] = true
		return id
	}
	for _, name := range []string{"kvm", "libvirt-qemu"} {
		if _, ok := names[name]; !ok {
			id := free()
			names[name] = id
			group = withLine(group, fmt.Sprintf("%s:x:%d:", name, id))
		}
	}
	if _, ok := accountNames(passwd)["libvirt-qemu"]; !ok {
		passwd = withLine(passwd, fmt.Sprintf("libvirt-qemu:x:%d:%d:Libvirt Qemu:/var/lib/libvirt:/usr/sbin/nologin", free(), names["libvirt-qemu"]))
	}
	return passwd, group, nil
}

// accountNames maps the names of a passwd or group file to their ids.
func accountNames(file string) map[string]int {
	m := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(file))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) >= 3 {
			id, _ := strconv.Atoi(f[2])
			m[f[0]] = id
		}
	}
	return m
}

func accountIDs(files ...string) map[int]bool {
	ids := map[int]bool{}
	for _, f := range files {
		for _, id := range accountNames(f) {
			ids[id] = true
		}
	}
	return ids
}

func withLine(file, line string) string {
	if file != "" && !strings.HasSuffix(file, "\n") {
		file += "\n"
	}
	return file + line + "\n"
}

// virsh runs virsh against this daemon, bounded.
func (lv *libvirtd) virsh(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "virsh", append([]string{"-c", lv.uri}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// logs is the tail of the daemon's output and log.
func (lv *libvirtd) logs() string {
	out, _ := os.ReadFile(filepath.Join(lv.dir, "libvirtd.out"))
	log, _ := os.ReadFile(lv.logPath)
	// libvirt's nodedev driver probes the node's links from the pod
	// netns: one ethtool error per feature and link, noise.
	var kept []string
	for _, l := range strings.Split(string(log), "\n") {
		if !strings.Contains(l, "ethtool ioctl error") {
			kept = append(kept, l)
		}
	}
	log = []byte(strings.Join(kept, "\n"))
	return fmt.Sprintf("--- libvirtd output ---\n%s\n--- libvirtd log (tail) ---\n%s", crihelp.Tail(string(out), 2000), crihelp.Tail(string(log), 3000))
}

// stop ends libvirtd by its PID (SIGTERM, then SIGKILL), then any QEMU it
// left running, found by the pid files in the test's /run/libvirt.
// libvirtd leaves its domains running when it exits, so a domain that
// could not be destroyed must not outlive the test.
func (lv *libvirtd) stop(t *testing.T) {
	if t.Failed() {
		t.Logf("libvirtd %s:\n%s", lv.dir, lv.logs())
	}
	_ = lv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-lv.done:
	case <-time.After(10 * time.Second):
		_ = lv.cmd.Process.Kill()
		<-lv.done
	}
	pidFiles, _ := filepath.Glob(filepath.Join(lv.dir, "run", "qemu", "*.pid"))
	for _, f := range pidFiles {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		if pid := qemuPid(f, name); pid > 0 {
			t.Logf("killing QEMU of domain %s (pid %d) that libvirtd left running", name, pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// qemuPid is the pid in a libvirt pid file if it is still the QEMU of
// domain name, else 0.
func qemuPid(pidFile, name string) int {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), "qemu-system") || !strings.Contains(string(cmdline), "guest="+name+",") {
		return 0
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		if _, rest, ok := strings.Cut(string(st), ") "); ok && strings.HasPrefix(rest, "Z") {
			return 0 // exited, not reaped yet
		}
	}
	return pid
}

// libvirtDomain is a started domain: the guestVM of a libvirt boot.
type libvirtDomain struct {
	lv      *libvirtd
	name    string
	serial  string
	pidFile string
	qemuLog string
}

// boot defines and starts d, and destroys and undefines it when the test
// ends.
func (lv *libvirtd) boot(t *testing.T, d vm.Domain) *libvirtDomain {
	t.Helper()
	x, err := d.XML()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.WriteScript(); err != nil {
		t.Fatal(err)
	}
	xmlPath := filepath.Join(lv.dir, d.Name+".xml")
	if err := os.WriteFile(xmlPath, []byte(x), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(d.SerialPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	dom := &libvirtDomain{
		lv: lv, name: d.Name, serial: d.SerialPath,
		pidFile: filepath.Join(lv.dir, "run", "qemu", d.Name+".pid"),
		qemuLog: filepath.Join(lv.dir, "log", "qemu", d.Name+".log"),
	}
	if _, err := lv.virsh("define", xmlPath); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = dom.Stop()
		if _, err := lv.virsh("undefine", d.Name); err != nil {
			t.Errorf("undefine: %v", err)
		}
	})
	start := time.Now()
	if _, err := lv.virsh("start", d.Name); err != nil {
		t.Fatalf("%v\n%s", err, dom.logs())
	}
	t.Logf("domain %s started in %v (QEMU pid %d)", d.Name, time.Since(start).Round(time.Millisecond), qemuPid(dom.pidFile, d.Name))
	return dom
}

func (d *libvirtDomain) Serial() string {
	b, _ := os.ReadFile(d.serial)
	return string(b)
}

// WaitFor polls the console until it shows marker, QEMU is gone, or ctx
// ends.
func (d *libvirtDomain) WaitFor(ctx context.Context, marker string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if strings.Contains(d.Serial(), marker) {
			return nil
		}
		if qemuPid(d.pidFile, d.name) == 0 {
			if strings.Contains(d.Serial(), marker) {
				return nil
			}
			return fmt.Errorf("domain %s: QEMU is gone before the console showed %q\n%s", d.name, marker, d.logs())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("domain %s: waiting for %q on the console: %w\n%s", d.name, marker, context.Cause(ctx), d.logs())
		case <-tick.C:
		}
	}
}

// Stop destroys the domain (a no-op once it is off).
func (d *libvirtDomain) Stop() error {
	if qemuPid(d.pidFile, d.name) == 0 {
		return nil
	}
	_, err := d.lv.virsh("destroy", d.name)
	return err
}

func (d *libvirtDomain) logs() string {
	q, _ := os.ReadFile(d.qemuLog)
	return fmt.Sprintf("--- serial %s (tail) ---\n%s\n--- QEMU log %s (tail) ---\n%s\n%s",
		d.serial, tail(d.Serial(), 2000), d.qemuLog, tail(string(q), 2000), d.lv.logs())
}
