package seccompagent

import "sync"

// Target is a tap the agent gives NAPI queues to, as napitap configured it.
type Target struct {
	// Key names the attachment in logs, e.g. "<containerID>/net1".
	Key        string
	NAPI       bool
	NAPIFrags  bool
	MultiQueue bool
	// Mark is the ifalias napitap gave the tap (tapsetup.OwnerAlias); a
	// link of the name without it is left to the kernel. Empty: unchecked.
	Mark string
}

// Registry tells the agent which taps are napitap's. netnsID is the
// network namespace's NS_GET_ID (its cookie), the one of the caller's
// /dev/net/tun fd, which is where the kernel looks the name up.
type Registry interface {
	Lookup(netnsID uint64, tapName string) (Target, bool)
}

// RegistryFunc adapts a function to Registry.
type RegistryFunc func(netnsID uint64, tapName string) (Target, bool)

func (f RegistryFunc) Lookup(netnsID uint64, tapName string) (Target, bool) {
	return f(netnsID, tapName)
}

// MapRegistry is a Registry kept in memory; the zero value is empty and
// ready to use.
type MapRegistry struct {
	mu sync.RWMutex
	m  map[mapKey]Target
}

type mapKey struct {
	netnsID uint64
	tapName string
}

// Set makes tapName in netnsID managed as t.
func (r *MapRegistry) Set(netnsID uint64, tapName string, t Target) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[mapKey]Target{}
	}
	r.m[mapKey{netnsID, tapName}] = t
}

// Delete forgets tapName in netnsID.
func (r *MapRegistry) Delete(netnsID uint64, tapName string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, mapKey{netnsID, tapName})
}

func (r *MapRegistry) Lookup(netnsID uint64, tapName string) (Target, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.m[mapKey{netnsID, tapName}]
	return t, ok
}
