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
	r := onAThread(t, func() (int, error) { return openPidfd(unix.Gettid()) })
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

// TestAThreadWithAFileTableOfItsOwnIsPinnedOnlyByAThreadPidfd: after
// unshare(CLONE_FILES) a thread's fd numbers are not its process's. A
// PIDFD_THREAD pidfd (Linux 6.9) reaches its table; before, no pidfd does,
// and openPidfd refuses rather than hand the agent the leader's fd of the
// caller's number.
func TestAThreadWithAFileTableOfItsOwnIsPinnedOnlyByAThreadPidfd(t *testing.T) {
	r := onAThread(t, func() (int, error) {
		if err := unix.Unshare(unix.CLONE_FILES); err != nil {
			return -1, err
		}
		return openPidfd(unix.Gettid())
	})
	threads := true
	if fd, err := unix.PidfdOpen(os.Getpid(), pidfdThread); err == nil {
		unix.Close(fd)
	} else if errors.Is(err, unix.EINVAL) {
		threads = false
	}
	switch {
	case threads && r.err != nil:
		t.Errorf("with PIDFD_THREAD, openPidfd of a thread with its own file table: %v", r.err)
	case threads:
		unix.Close(r.pidfd)
	case r.err == nil:
		unix.Close(r.pidfd)
		t.Errorf("without PIDFD_THREAD, openPidfd of a thread with its own file table gave a pidfd of its process")
	default:
		t.Logf("no PIDFD_THREAD (Linux < 6.9): refused: %v", r.err)
	}
}

type threadResult struct {
	tid, pidfd int
	err        error
}

// onAThread runs fn on a thread that does not lead the process, which
// stays until the test ends (as a caller waits in its call while the agent
// works), and returns fn's result with the thread's tid.
func onAThread(t *testing.T, fn func() (int, error)) threadResult {
	t.Helper()
	res := make(chan threadResult, 1)
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	for range 10 {
		go func() {
			// Locked for good: the runtime ends the thread with the
			// goroutine. One that got the main thread keeps it, so that
			// the next goroutine cannot.
			runtime.LockOSThread()
			if unix.Gettid() == os.Getpid() {
				res <- threadResult{tid: unix.Gettid()}
				<-hold
				return
			}
			fd, err := fn()
			res <- threadResult{unix.Gettid(), fd, err}
			<-hold
		}()
		if r := <-res; r.tid != os.Getpid() {
			return r
		}
	}
	t.Fatal("no goroutine ran on a thread but the main one")
	return threadResult{}
}
