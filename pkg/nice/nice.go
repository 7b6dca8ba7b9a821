// Package nice sets the nice value of every thread of the running
// process. Linux keeps one per thread (setpriority(2) with PRIO_PROCESS
// takes a thread id) and a new thread takes its creator's, so once every
// thread has it, so do the threads the Go runtime starts later.
package nice

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Min and Max bound a nice value.
const (
	Min = -20
	Max = 19
)

// SetAll gives every thread of this process nice value n. A value below the
// thread's current one needs CAP_SYS_NICE (or RLIMIT_NICE).
func SetAll(n int) error {
	if n < Min || n > Max {
		return fmt.Errorf("nice %d: want %d..%d", n, Min, Max)
	}
	done := map[int]bool{}
	// A thread cloned during a pass took its creator's value, which may
	// not have been set yet: pass again until a pass finds none new.
	for {
		tids, err := threads()
		if err != nil {
			return err
		}
		fresh := 0
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			err := unix.Setpriority(unix.PRIO_PROCESS, tid, n)
			if err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: the thread ended
				return fmt.Errorf("setpriority(PRIO_PROCESS, thread %d, %d): %w", tid, n, err)
			}
			done[tid] = true
			fresh++
		}
		if fresh == 0 {
			return nil
		}
	}
}

// Of is thread tid's nice value, as /proc/self/task/TID/stat says (field 19).
func Of(tid int) (int, error) {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("thread %d: stat %q", tid, b)
	}
	// From field 3 (state) on: field 19 is the 17th.
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 17 {
		return 0, fmt.Errorf("thread %d: stat has %d fields", tid, len(fields)+2)
	}
	return strconv.Atoi(fields[16])
}

func threads() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, err
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}
