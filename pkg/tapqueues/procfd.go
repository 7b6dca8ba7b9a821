package tapqueues

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// tunFile is a process's fd that is a tun file attached to a tap.
type tunFile struct {
	fd  int
	tap string // fdinfo's "iff:"
}

// tunFilesOf lists pid's tun files attached to a tap; false if pid's fds
// could not be read (not if it is gone).
//
// /proc/PID/fd and /proc/PID/fdinfo are the process owner's alone (mode
// 0500; a dumpable task's owner is its euid), so a root without
// CAP_DAC_READ_SEARCH, as napitapd's container is
// (deploy/base/daemonset.yaml), cannot list those of a non-root VMM: QEMU
// as KubeVirt's 107 was invisible to napitapctl queues run there. It then
// reads them as their owner, on a thread whose filesystem uid is the
// owner's for the call: setfsuid changes the calling thread alone, needs
// CAP_SETUID, and keeps CAP_SYS_PTRACE, which the fd links, fdinfo and
// pidfd_getfd ask for.
func tunFilesOf(pid int) ([]tunFile, bool) {
	files, err := readTunFiles(pid)
	if errors.Is(err, fs.ErrPermission) {
		var st unix.Stat_t
		if unix.Stat(fmt.Sprintf("/proc/%d", pid), &st) == nil && int(st.Uid) != os.Geteuid() {
			files, err = asFSOwner(int(st.Uid), func() ([]tunFile, error) { return readTunFiles(pid) })
		}
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil, true // gone meanwhile
	}
	return files, err == nil
}

func readTunFiles(pid int) ([]tunFile, error) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []tunFile
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(dir + "/" + e.Name()); err != nil || target != "/dev/net/tun" {
			continue // closed meanwhile, or not tun
		}
		if tap := attachedTo(pid, fd); tap != "" {
			files = append(files, tunFile{fd, tap})
		}
	}
	return files, nil
}

// asFSOwner runs fn on a thread of its own whose filesystem uid is uid. A
// thread that could not go back to its own stays locked and ends with its
// goroutine, as the Go runtime does with a locked thread.
func asFSOwner(uid int, fn func() ([]tunFile, error)) ([]tunFile, error) {
	type result struct {
		files []tunFile
		err   error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		own, err := unix.SetfsuidRetUid(uid)
		if err != nil {
			runtime.UnlockOSThread()
			done <- result{nil, fmt.Errorf("setfsuid %d: %w", uid, err)}
			return
		}
		var r result
		if now, _ := unix.SetfsuidRetUid(-1); now != uid { // -1: no change, the current one
			r.err = fmt.Errorf("setfsuid %d: %w", uid, fs.ErrPermission)
		} else {
			r.files, r.err = fn()
		}
		if back, _ := unix.SetfsuidRetUid(own); back == uid || back == own {
			if now, _ := unix.SetfsuidRetUid(-1); now == own {
				runtime.UnlockOSThread()
			}
		}
		done <- r
	}()
	r := <-done
	return r.files, r.err
}

// attachedTo is the tap a tun file is attached to, as its fdinfo says
// ("iff:" is there only once it is attached).
func attachedTo(pid, fd int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/fdinfo/%d", pid, fd))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "iff:"); ok {
			return strings.TrimSpace(name)
		}
	}
	return ""
}
