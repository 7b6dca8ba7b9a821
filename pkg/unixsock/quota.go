package unixsock

import "sync"

// UIDQuota counts what a daemon serves its tenants (connections, seccomp
// listeners), so that no tenant can take it all. A tenant is a peer uid,
// root's included: a pod's root, with no capability or with every one in a
// user namespace of its own, is one like any other. napitapd's equal
// (pkg/peer's judgement: the plugin, runc, the kubelet's runtime) is no
// tenant and is never refused: it could stop napitapd anyway.
type UIDQuota struct {
	Max       int // every tenant together
	MaxPerUID int // one tenant; less than Max

	mu      sync.Mutex
	tenants int // counted for tenants
	equals  int // counted for napitapd's equals
	perUID  map[uint32]int
}

// Admit counts one in for a peer of uid, napitapd's equal or a tenant, or
// says why the tenant may not have one.
func (q *UIDQuota) Admit(uid uint32, napitapd bool) (bool, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case napitapd:
		q.equals++
		return true, ""
	case q.perUID[uid] >= q.MaxPerUID:
		return false, "the uid is at its own limit"
	case q.tenants >= q.Max:
		return false, "tenants are at their shared limit"
	}
	if q.perUID == nil {
		q.perUID = map[uint32]int{}
	}
	q.perUID[uid]++
	q.tenants++
	return true, ""
}

// Done counts out one that Admit counted in.
func (q *UIDQuota) Done(uid uint32, napitapd bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if napitapd {
		q.equals--
		return
	}
	q.tenants--
	if q.perUID[uid]--; q.perUID[uid] == 0 {
		delete(q.perUID, uid)
	}
}

// Counted is how many are counted in, for tenants and for napitapd's
// equals.
func (q *UIDQuota) Counted() (tenants, equals int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.tenants, q.equals
}
