package tapsetup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// NAPIKnobs are the tap's device-wide NAPI settings. Nil leaves a knob as
// the kernel has it.
type NAPIKnobs struct {
	Threaded        bool // only ever switched on (fact 9)
	GROFlushTimeout *uint64
	DeferHardIRQs   *uint32
}

// SysfsAttrs are a tap's attributes that only sysfs shows.
type SysfsAttrs struct {
	TunFlags        uint32
	Owner           int64 // -1: unset
	Group           int64 // -1: unset
	Threaded        bool
	GROFlushTimeout uint64
	DeferHardIRQs   uint32
}

// ApplyNAPIKnobs writes knobs for tap name in the netns at netnsPath. Call
// it only while every queue of the tap is attached: turning threaded NAPI
// on or off with a detached queue can wedge the kernel (DESIGN.md fact 9).
// It never writes 0 to threaded.
func ApplyNAPIKnobs(netnsPath, name string, knobs NAPIKnobs) error {
	if !knobs.Threaded && knobs.GROFlushTimeout == nil && knobs.DeferHardIRQs == nil {
		return nil
	}
	return inNetnsSysfs(netnsPath, func(sys string) error {
		return applyNAPIKnobsIn(filepath.Join(sys, "class/net", name), knobs)
	})
}

// ApplyNAPIKnobsHere is ApplyNAPIKnobs for tap name in the calling
// thread's netns, for a caller already there (inside ns.Do, as ADD is): the
// sysfs is mounted from this thread, so no netns is entered and no thread
// started for it, which were half of what threaded NAPI cost an ADD beside
// the write itself (issue 46). Where the mount API is missing, the
// fallback's thread enters this thread's netns.
func ApplyNAPIKnobsHere(name string, knobs NAPIKnobs) error {
	if !knobs.Threaded && knobs.GROFlushTimeout == nil && knobs.DeferHardIRQs == nil {
		return nil
	}
	return inThreadNetnsSysfs(func(sys string) error {
		return applyNAPIKnobsIn(filepath.Join(sys, "class/net", name), knobs)
	})
}

// applyNAPIKnobsIn writes knobs into dir, a /sys/class/net/<tap> directory;
// threaded last, and only ever 1.
func applyNAPIKnobsIn(dir string, knobs NAPIKnobs) error {
	if knobs.GROFlushTimeout != nil {
		if err := writeAttr(dir, "gro_flush_timeout", strconv.FormatUint(*knobs.GROFlushTimeout, 10)); err != nil {
			return err
		}
	}
	if knobs.DeferHardIRQs != nil {
		if err := writeAttr(dir, "napi_defer_hard_irqs", strconv.FormatUint(uint64(*knobs.DeferHardIRQs), 10)); err != nil {
			return err
		}
	}
	if knobs.Threaded {
		if err := writeAttr(dir, "threaded", "1"); err != nil {
			return err
		}
	}
	return nil
}

// ReadSysfs reads the sysfs attributes of tap name in the netns at netnsPath.
func ReadSysfs(netnsPath, name string) (*SysfsAttrs, error) {
	var a *SysfsAttrs
	err := inNetnsSysfs(netnsPath, func(sys string) (err error) {
		a, err = ReadSysfsDir(filepath.Join(sys, "class/net", name))
		return err
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// ReadSysfsDir reads the attributes from dir, a /sys/class/net/<tap>
// directory. A NAPI knob the kernel does not have (threaded before 5.12,
// napi_defer_hard_irqs before 5.10) reads as the kernel's behaviour, off or
// 0: CHECK compares only the knobs a config sets, and STATUS and ADD refuse
// a config that sets one the kernel lacks.
func ReadSysfsDir(dir string) (*SysfsAttrs, error) {
	read := func(attr string, base, bits int, optional bool) (int64, error) {
		raw, err := os.ReadFile(filepath.Join(dir, attr))
		if optional && errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", attr, err)
		}
		s := strings.TrimSpace(string(raw))
		var v int64
		if base == 16 {
			var u uint64
			u, err = strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, bits)
			v = int64(u)
		} else {
			v, err = strconv.ParseInt(s, base, bits)
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", attr, err)
		}
		return v, nil
	}
	var vals [6]int64
	for i, attr := range []struct {
		name       string
		base, bits int
		optional   bool
	}{{"tun_flags", 16, 32, false}, {"owner", 10, 64, false}, {"group", 10, 64, false},
		{"threaded", 10, 8, true}, {"gro_flush_timeout", 10, 64, true}, {"napi_defer_hard_irqs", 10, 64, true}} {
		v, err := read(attr.name, attr.base, attr.bits, attr.optional)
		if err != nil {
			return nil, err
		}
		vals[i] = v
	}
	return &SysfsAttrs{TunFlags: uint32(vals[0]), Owner: vals[1], Group: vals[2], Threaded: vals[3] != 0,
		GROFlushTimeout: uint64(vals[4]), DeferHardIRQs: uint32(vals[5])}, nil
}

func writeAttr(dir, attr, value string) error {
	if err := os.WriteFile(filepath.Join(dir, attr), []byte(value), 0); err != nil {
		return fmt.Errorf("write %s=%s: %w", attr, value, err)
	}
	return nil
}

// inNetnsSysfs runs fn with the path of a sysfs of the netns at netnsPath.
// /sys shows the devices of the netns that mounted it, so the tap's
// attributes need a sysfs of the pod's own. Where the kernel has the mount
// API (fsopen, Linux 5.2+) that sysfs is a detached mount, made from the pod
// netns and attached nowhere; elsewhere, or where fsopen is refused (a
// seccomp profile, say), a private mount namespace gets it on /sys.
// netlink cannot stand in: tun adds its NAPIs with netif_napi_add_tx, which
// gives them no NAPI ID, so the netdev family's napi-get never lists them
// and napi-set cannot name them (napi-set would also set one NAPI, and not
// the device's defaults that the queues a runtime attaches later inherit).
func inNetnsSysfs(netnsPath string, fn func(sys string) error) error {
	err := withNetNS(netnsPath, func() error { return detachedSysfs(fn) })
	if errors.Is(err, errNoMountAPI) {
		err = mountedSysfs(netnsPath, fn)
	}
	if err != nil {
		return fmt.Errorf("netns %s: %w", netnsPath, err)
	}
	return nil
}

// inThreadNetnsSysfs is inNetnsSysfs for the calling thread's netns.
func inThreadNetnsSysfs(fn func(sys string) error) error {
	err := detachedSysfs(fn)
	if errors.Is(err, errNoMountAPI) {
		// The thread stays locked in its netns (ns.Do) while the fallback's
		// own thread enters it by this path.
		self := fmt.Sprintf("/proc/%d/task/%d/ns/net", os.Getpid(), unix.Gettid())
		err = mountedSysfs(self, fn)
	}
	return err
}

// errNoMountAPI marks a kernel, or a seccomp profile, without fsopen,
// fsconfig or fsmount for sysfs: what makes inNetnsSysfs fall back.
var errNoMountAPI = errors.New("no detached sysfs mount")

// fsopen is unix.Fsopen; tests play older kernels and seccomp profiles
// with it.
var fsopen = unix.Fsopen

// detachedSysfs runs fn with a sysfs of the calling thread's netns, mounted
// nowhere: fsmount gives a file descriptor of the mount, reached through
// /proc/self/fd, and closing it unmounts it. Nothing is unshared and no path
// changes, so the thread needs no namespaces of its own.
func detachedSysfs(fn func(sys string) error) error {
	fsfd, err := fsopen("sysfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("%w: fsopen sysfs: %w", errNoMountAPI, err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("%w: fsconfig sysfs: %w", errNoMountAPI, err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("%w: fsmount sysfs: %w", errNoMountAPI, err)
	}
	defer unix.Close(mnt)
	return fn("/proc/self/fd/" + strconv.Itoa(mnt))
}

// mountedSysfs runs fn with /sys mounted from inside the netns at
// netnsPath, in a private mount namespace of a thread that exits afterwards.
func mountedSysfs(netnsPath string, fn func(sys string) error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the Go runtime ends this thread with the goroutine.
		// Except the main thread, which it parks instead; so the thread goes
		// back to its own namespaces first, and a parked main thread pins no
		// pod netns.
		runtime.LockOSThread()
		errc <- func() error {
			restore, err := saveNamespaces()
			if err != nil {
				return err
			}
			defer restore()
			netns, err := ns.GetNS(netnsPath)
			if err != nil {
				return err
			}
			defer netns.Close()
			if err := netns.Set(); err != nil {
				return fmt.Errorf("enter netns %s: %w", netnsPath, err)
			}
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("unshare mount namespace: %w", err)
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
				return fmt.Errorf("make mounts private: %w", err)
			}
			if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_NOSUID|unix.MS_NOEXEC|unix.MS_NODEV, ""); err != nil {
				return fmt.Errorf("mount sysfs for netns %s: %w", netnsPath, err)
			}
			return fn("/sys")
		}()
	}()
	return <-errc
}

// saveNamespaces returns a func that puts the calling thread back into its
// current mount and network namespaces.
func saveNamespaces() (func(), error) {
	mnt, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("save mount namespace: %w", err)
	}
	net, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(mnt)
		return nil, fmt.Errorf("save network namespace: %w", err)
	}
	return func() {
		_ = unix.Setns(mnt, unix.CLONE_NEWNS)
		_ = unix.Setns(net, unix.CLONE_NEWNET)
		unix.Close(mnt)
		unix.Close(net)
	}, nil
}

func withNetNS(netnsPath string, fn func() error) error {
	return ns.WithNetNSPath(netnsPath, func(ns.NetNS) error { return fn() })
}
