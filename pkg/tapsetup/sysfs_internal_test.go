package tapsetup

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// TestNAPIKnobsReachThePodsSysfsEitherWay writes the knobs through the path
// the probe picks, on a real 4-queue NAPI tap with every queue attached,
// and reads them back through the other path, so that each path is proven
// by one it does not share code with.
func TestNAPIKnobsReachThePodsSysfsEitherWay(t *testing.T) {
	nstest.RequireRoot(t)
	mountAPI := hasMountAPI(t)
	cases := []struct {
		name        string
		fsopenErr   error // nil: the kernel's own fsopen
		wantMounted bool  // the knobs go through a /sys mounted in a mount namespace of a thread's own
	}{
		{"this kernel's fsopen picks a detached mount if it has one", nil, !mountAPI},
		{"a kernel without fsopen (before 5.2) gets a mounted /sys", unix.ENOSYS, true},
		{"a seccomp profile refusing fsopen gets a mounted /sys", unix.EPERM, true},
	}
	// ApplyNAPIKnobs finds the netns by its path, ApplyNAPIKnobsHere is
	// already in it.
	entries := []struct {
		name string
		do   func(netnsPath string, fn func(sys string) error) error
	}{
		{"by the netns's path", inNetnsSysfs},
		{"on the caller's thread", func(_ string, fn func(sys string) error) error { return inThreadNetnsSysfs(fn) }},
	}
	for _, tc := range cases {
		for _, entry := range entries {
			t.Run(tc.name+", "+entry.name, func(t *testing.T) {
				if tc.fsopenErr != nil {
					fsopen = func(string, int) (int, error) { return -1, tc.fsopenErr }
					t.Cleanup(func() { fsopen = unix.Fsopen })
				}
				pod := nstest.New(t, "sysfs")
				const name = "napitest0"
				gro, deferIRQs := uint64(20_000), uint32(2)
				pod.Run(t, func() error {
					_, queues, err := Create(Spec{Name: name, Queues: 4, Flags: QueueFlags{MultiQueue: true, VnetHdr: true, NAPI: true}})
					if err != nil {
						return err
					}
					defer CloseQueues(queues)
					defer DeleteTap(name, "")

					// While every queue is attached (DESIGN.md fact 9).
					var via string
					err = entry.do(pod.Path(), func(sys string) error {
						via = sys
						return applyNAPIKnobsIn(filepath.Join(sys, "class/net", name), NAPIKnobs{Threaded: true, GROFlushTimeout: &gro, DeferHardIRQs: &deferIRQs})
					})
					if err != nil {
						return err
					}
					if mounted := via == "/sys"; mounted != tc.wantMounted {
						t.Errorf("the knobs went through %q; want a mounted /sys: %v", via, tc.wantMounted)
					}

					// Read back the other way.
					fsopen = unix.Fsopen
					read := func(sys string) error {
						a, err := ReadSysfsDir(filepath.Join(sys, "class/net", name))
						if err != nil {
							return err
						}
						if !a.Threaded || a.GROFlushTimeout != gro || a.DeferHardIRQs != deferIRQs {
							t.Errorf("read back through %q: threaded %v, gro_flush_timeout %d, napi_defer_hard_irqs %d; want true, %d, %d",
								sys, a.Threaded, a.GROFlushTimeout, a.DeferHardIRQs, gro, deferIRQs)
						}
						return nil
					}
					if via == "/sys" {
						if !mountAPI {
							t.Log("no mount API here: read back through a mounted /sys too")
							return mountedSysfs(pod.Path(), read)
						}
						return withNetNS(pod.Path(), func() error { return detachedSysfs(read) })
					}
					return mountedSysfs(pod.Path(), read)
				})
			})
		}
	}
}

// hasMountAPI asks the kernel whether fsopen works for sysfs here.
func hasMountAPI(t *testing.T) bool {
	fd, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		t.Logf("fsopen(sysfs): %v", err)
		return false
	}
	unix.Close(fd)
	return true
}

// TestADetachedSysfsShowsTheThreadsNetns: the mount is of the netns the
// calling thread is in, not of the process's.
func TestADetachedSysfsShowsTheThreadsNetns(t *testing.T) {
	nstest.RequireRoot(t)
	if !hasMountAPI(t) {
		if os.Getenv("CI") == "true" {
			t.Fatal("fsopen(sysfs) fails on this kernel, and CI=true forbids skipping")
		}
		t.Skip("no mount API")
	}
	pod := nstest.New(t, "sysfs")
	var names []string
	err := withNetNS(pod.Path(), func() error {
		return detachedSysfs(func(sys string) error {
			entries, err := os.ReadDir(filepath.Join(sys, "class/net"))
			for _, e := range entries {
				names = append(names, e.Name())
			}
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "lo" {
		t.Errorf("a fresh pod netns's detached sysfs lists %v, want only lo", names)
	}
}
