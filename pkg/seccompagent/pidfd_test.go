package seccompagent

import (
	"errors"
	"os"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTheAgentPinsACallerThreadThatDoesNotLeadItsProcess: a VMM's
// TUNSETIFF may come from any of its threads (Cloud Hypervisor's vmm
// thread makes its devices). With PIDFD_THREAD (Linux 6.9) the agent pins
// that thread; before, pidfd_open refuses a thread that does not lead its
// group (EINVAL), and the agent pins its process, whose fds pidfd_getfd
// takes all the same. Before this fallback such a caller was left to the
// kernel on 6.1, without NAPI and without a word.
func TestTheAgentPinsACallerThreadThatDoesNotLeadItsProcess(t *testing.T) {
	type result struct {
		tid, pidfd int
		err        error
	}
	res := make(chan result, 1)
	hold := make(chan struct{})
	defer close(hold)
	var r result
	for range 10 {
		go func() {
			// A thread of its own until the test ends. One that got the
			// main thread, the leader, keeps it, so that the next one
			// cannot.
			runtime.LockOSThread()
			if unix.Gettid() == os.Getpid() {
				res <- result{tid: unix.Gettid()}
				<-hold
				return
			}
			fd, err := openPidfd(unix.Gettid())
			res <- result{unix.Gettid(), fd, err}
			<-hold // the caller waits in its call while the agent works
		}()
		if r = <-res; r.tid != os.Getpid() {
			break
		}
	}
	if r.tid == os.Getpid() {
		t.Fatal("no goroutine ran on a thread but the main one")
	}
	threads := true
	if fd, err := unix.PidfdOpen(os.Getpid(), pidfdThread); err == nil {
		unix.Close(fd)
	} else if errors.Is(err, unix.EINVAL) {
		threads = false
	}
	if r.err != nil {
		t.Fatalf("openPidfd of thread %d (PIDFD_THREAD: %v): %v", r.tid, threads, r.err)
	}
	defer unix.Close(r.pidfd)
	if !threads {
		t.Logf("no PIDFD_THREAD (Linux < 6.9): thread %d pinned by a pidfd of its process %d", r.tid, os.Getpid())
		if _, err := unix.PidfdOpen(r.tid, 0); !errors.Is(err, unix.EINVAL) {
			t.Errorf("pidfd_open of a thread that does not lead its group: %v, want EINVAL (what the fallback is for)", err)
		}
	}
	// The caller's fds are within reach, as decide takes them.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dup, err := unix.PidfdGetfd(r.pidfd, int(f.Fd()), 0)
	if err != nil {
		t.Fatalf("pidfd_getfd through the pidfd of thread %d: %v", r.tid, err)
	}
	unix.Close(dup)
	if g, err := threadGroup(r.tid); err != nil || g != os.Getpid() {
		t.Errorf("threadGroup(%d) = %d, %v; want %d", r.tid, g, err, os.Getpid())
	}
}
