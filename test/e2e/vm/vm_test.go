package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/napitap/napitap/internal/nstest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// cacheDir is <repo>/.cache/vm (gitignored), or $NAPITAP_VM_CACHE.
func cacheDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("NAPITAP_VM_CACHE"); d != "" {
		return d
	}
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, ".cache", "vm")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

func TestQEMUArgs(t *testing.T) {
	g := Guest{IP: "10.9.0.2/24", Gateway: "10.9.0.1", MAC: "52:54:00:AB:CD:EF", Script: "echo a,b"}
	args := QEMUArgs("/k", "/i", "tap,id=n0,fds=3:4,vhost=off", 2, g, "/tmp/s.log", true)
	joined := strings.Join(args, "\n")
	for _, want := range []string{
		"qemu-system-x86_64", "q35,accel=tcg", "file:/tmp/s.log", "tap,id=n0,fds=3:4,vhost=off",
		"virtio-net-pci,netdev=n0,romfile=,mac=52:54:00:ab:cd:ef,mq=on,vectors=6,host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off",
		"napitap.ip=10.9.0.2/24 napitap.gw=10.9.0.1 napitap.mac=52:54:00:ab:cd:ef",
		"name=opt/napitap/script,string=echo a,,b",
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("QEMUArgs lacks %q:\n%s", want, joined)
		}
	}
	one := strings.Join(QEMUArgs("/k", "/i", "tap,id=n0,fds=3,vhost=off", 1, Guest{}, "/tmp/s.log", false), " ")
	for _, bad := range []string{"mq=on", "host_tso4", "-fw_cfg", "napitap.ip"} {
		if strings.Contains(one, bad) {
			t.Errorf("single-queue QEMUArgs has %q: %s", bad, one)
		}
	}
}

func TestDomainXML(t *testing.T) {
	g := Guest{IP: "10.9.0.2/24", Gateway: "10.9.0.1", MAC: "52:54:00:AB:CD:EF", Script: "echo a,b && test 1 -lt 2"}
	full := Domain{Name: "napitap-d", Kernel: "/k", Initrd: "/i", Guest: g, Tap: "tap0", Queues: 2, SerialPath: "/tmp/s.log", ScriptPath: "/tmp/script.sh", NoGuestTSO: true}
	cases := []struct {
		name    string
		d       Domain
		want    []string
		notWant []string
	}{
		{
			"a multiqueue NIC on a tap libvirt opens by name, with the guest's kernel command line and script",
			full,
			[]string{
				`<domain type="qemu">`, `<vcpu>2</vcpu>`, `<kernel>/k</kernel>`, `<initrd>/i</initrd>`,
				`<cmdline>console=ttyS0 quiet loglevel=4 panic=-1 rdinit=/init no_timer_check napitap.ip=10.9.0.2/24 napitap.gw=10.9.0.1 napitap.mac=52:54:00:ab:cd:ef</cmdline>`,
				`<interface type="ethernet">`, `<mac address="52:54:00:ab:cd:ef">`, `<target dev="tap0" managed="no">`,
				`<model type="virtio">`, `<driver name="qemu" queues="2">`, `<host tso4="off" tso6="off" ecn="off" ufo="off">`,
				`<sysinfo type="fwcfg">`, `<entry name="opt/napitap/script" file="/tmp/script.sh">`,
				`<serial type="file">`, `<source path="/tmp/s.log">`,
			},
			nil,
		},
		{
			"one queue and no script or MAC leave those elements out",
			Domain{Name: "napitap-d", Kernel: "/k", Initrd: "/i", Tap: "tap0", SerialPath: "/tmp/s.log"},
			[]string{`<vcpu>1</vcpu>`, `<driver name="qemu">`},
			[]string{"queues=", "<sysinfo", "<mac", "<host", "napitap.ip"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			x, err := tc.d.XML()
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(x, w) {
					t.Errorf("domain XML lacks %s:\n%s", w, x)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(x, w) {
					t.Errorf("domain XML has %s:\n%s", w, x)
				}
			}
			// libvirt's own schema (libvirt-clients' virt-xml-validate runs
			// libxml2-utils' xmllint).
			for _, tool := range []string{"virt-xml-validate", "xmllint"} {
				if _, err := exec.LookPath(tool); err != nil {
					if os.Getenv("CI") == "true" {
						t.Fatalf("%s is missing (hack/deps.sh installs it), and CI=true forbids skipping the schema check", tool)
					}
					t.Skipf("%s is missing: run hack/deps.sh", tool)
				}
			}
			f := filepath.Join(t.TempDir(), "domain.xml")
			if err := os.WriteFile(f, []byte(x), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("virt-xml-validate", f, "domain").CombinedOutput(); err != nil {
				t.Errorf("virt-xml-validate: %v: %s\n%s", err, out, x)
			}
		})
	}
	for _, bad := range []Domain{
		{Name: "napitap-d"},
		{Name: "napitap-d", Kernel: "/k", Initrd: "/i", Guest: g, Tap: "tap0", SerialPath: "/tmp/s.log"},
	} {
		if _, err := bad.XML(); err == nil {
			t.Errorf("%+v gave XML: a domain needs a kernel, tap and serial path, and a script a file", bad)
		}
	}
}

func TestArtifactsCached(t *testing.T) {
	nstest.RequireRoot(t)
	dir := cacheDir(t)
	start := time.Now()
	k1, i1, err := Artifacts(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	start = time.Now()
	k2, i2, err := Artifacts(dir)
	if err != nil {
		t.Fatal(err)
	}
	second := time.Since(start)
	if k1 != k2 || i1 != i2 {
		t.Errorf("second Artifacts = %s, %s; first = %s, %s", k2, i2, k1, i1)
	}
	if second > 200*time.Millisecond {
		t.Errorf("cached Artifacts took %v", second)
	}
	info, _ := os.ReadFile(filepath.Join(filepath.Dir(k1), "INFO"))
	t.Logf("first call %v, second %v\n%s", first.Round(time.Millisecond), second.Round(time.Microsecond), info)
}

// openQueue opens one queue of tap name in the calling thread's netns.
func openQueue(name string, flags uint16) (*os.File, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun for %s: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(flags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF %s flags %#x: %w", name, flags, err)
	}
	return os.NewFile(uintptr(fd), "tun:"+name), nil
}

func TestBootPingOverNAPIQueueFds(t *testing.T) {
	nstest.RequireRoot(t)
	kernel, initrd, err := Artifacts(cacheDir(t))
	if err != nil {
		t.Fatal(err)
	}
	netns := nstest.New(t, "vm")
	const tap = "napivm0"
	const flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR | unix.IFF_MULTI_QUEUE | unix.IFF_NAPI

	var queues []*os.File
	closeQueues := func() {
		for _, q := range queues {
			q.Close()
		}
		queues = nil
	}
	t.Cleanup(closeQueues)
	t.Cleanup(func() {
		err := netns.Do(func(ns.NetNS) error {
			l, err := netlink.LinkByName(tap)
			if err != nil {
				return nil // gone already
			}
			return netlink.LinkDel(l)
		})
		if err != nil {
			t.Errorf("delete tap %s in netns %s: %v", tap, netns.Name, err)
		}
	})
	err = netns.Do(func(ns.NetNS) error {
		for i := range 2 {
			q, err := openQueue(tap, flags)
			if err != nil {
				return fmt.Errorf("queue %d: %w", i, err)
			}
			queues = append(queues, q)
		}
		if err := unix.IoctlSetPointerInt(int(queues[0].Fd()), unix.TUNSETVNETHDRSZ, 12); err != nil {
			return fmt.Errorf("TUNSETVNETHDRSZ 12 on %s: %w", tap, err)
		}
		if err := unix.IoctlSetInt(int(queues[0].Fd()), unix.TUNSETPERSIST, 1); err != nil {
			return fmt.Errorf("TUNSETPERSIST on %s: %w", tap, err)
		}
		l, err := netlink.LinkByName(tap)
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.77.0.1/24")
		if err := netlink.AddrAdd(l, addr); err != nil {
			return fmt.Errorf("add 10.77.0.1/24 to %s: %w", tap, err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", tap, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("tap %s in netns %s: %v", tap, netns.Name, err)
	}

	serial := filepath.Join(t.TempDir(), "serial.log")
	argv := QEMUArgs(kernel, initrd, "tap,id=n0,fds=3:4,vhost=off", 2, Guest{
		IP:     "10.77.0.2/24",
		MAC:    "52:54:00:12:34:56",
		Script: "ping -c 3 10.77.0.1",
	}, serial, false)
	start := time.Now()
	vm, err := Start(argv, queues, serial)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := vm.Stop(); err != nil {
			t.Errorf("stop VM: %v", err)
		}
	})
	closeQueues() // QEMU has its own copies

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := vm.WaitFor(ctx, MarkerUp); err != nil {
		t.Fatal(err)
	}
	up := time.Since(start)
	if err := vm.WaitFor(ctx, MarkerDone+"0"); err != nil {
		t.Fatal(err)
	}
	done := time.Since(start)
	if err := vm.Wait(ctx); err != nil {
		t.Errorf("after %s: %v", MarkerDone, err)
	}
	exited := time.Since(start)
	t.Logf("guest up after %v, script done after %v, QEMU exited after %v", up.Round(time.Millisecond), done.Round(time.Millisecond), exited.Round(time.Millisecond))
	if testing.Verbose() {
		t.Logf("serial:\n%s", vm.Serial())
	}
}
