package seccompagent

import (
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/napitap/napitap/internal/nstest"
)

// TestANodesWorthOfVMMsOfOneUIDLaunchedAtOnceAreAllServed: a node's
// max-pods (the kubelet's default, 110) VM pods whose VMMs all run as one
// uid (KubeVirt's qemu is 107) and each hand their listener over, as
// `napitapctl launch` does, all at once: the quotas that keep one uid of
// the socket's group from locking root out must not refuse any of them.
func TestANodesWorthOfVMMsOfOneUIDLaunchedAtOnceAreAllServed(t *testing.T) {
	nstest.RequireRoot(t)
	const vmms, uid = 110, 107
	ta := startAgent(t, slog.LevelWarn)
	openToAll(t, ta.socket)
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) }) // first: the threads end, then the agent closes
	var wg sync.WaitGroup
	var mu sync.Mutex
	var refused []string
	for i := range vmms {
		wg.Add(1)
		nstest.OnThreadThatEnds(func() {
			err := func() error {
				// This thread alone, never back: it ends with the test.
				if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, uid, uid, uid); errno != 0 {
					return errno
				}
				if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, uid, uid, uid); errno != 0 {
					return errno
				}
				l, err := installFilter(filterFlags)
				if err != nil {
					return err
				}
				defer unix.Close(l)
				pid := unix.Gettid()
				return SendListener(ta.socket, l, &specs.ContainerProcessState{
					Version: specs.Version, Fds: []string{specs.SeccompFdName}, Pid: pid, Metadata: launchMetadata,
					State: specs.State{Version: specs.Version, ID: "vmm-" + strconv.Itoa(i), Status: specs.StateCreating, Pid: pid},
				})
			}()
			if err != nil {
				mu.Lock()
				refused = append(refused, err.Error())
				mu.Unlock()
			}
			wg.Done()
			<-hold
		})
	}
	wg.Wait()
	if len(refused) > 0 {
		t.Errorf("%d of %d VMMs of uid %d launched at once were refused, the first: %s", len(refused), vmms, uid, refused[0])
	}
	if n := ta.agent.Listeners(); n != vmms {
		t.Errorf("the agent serves %d listeners, want %d", n, vmms)
	}
	if log := ta.log.String(); strings.Contains(log, "refused") {
		t.Logf("agent log:\n%s", log)
	}
}
