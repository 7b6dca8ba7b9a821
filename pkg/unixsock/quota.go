package unixsock

import "sync"

// UIDQuota counts what a daemon serves per peer uid (connections, seccomp
// listeners), so that one member of a socket's group cannot take it all.
// Root, napitap's own ADD, DEL and runc, has no per-uid limit, and the
// other uids together always leave it MaxPerUID.
type UIDQuota struct {
	Max       int // everything counted, root's included
	MaxPerUID int // one uid other than root; less than Max

	mu     sync.Mutex
	total  int
	others int // counted for uids other than root
	perUID map[uint32]int
}

// Admit counts one in for uid, or says why it may not have one.
func (q *UIDQuota) Admit(uid uint32) (bool, string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.total >= q.Max:
		return false, "at the limit of all"
	case uid == 0:
	case q.perUID[uid] >= q.MaxPerUID:
		return false, "the uid is at its own limit"
	case q.others >= q.Max-q.MaxPerUID:
		return false, "uids other than root are at their shared limit"
	default:
		if q.perUID == nil {
			q.perUID = map[uint32]int{}
		}
		q.perUID[uid]++
		q.others++
	}
	q.total++
	return true, ""
}

// Done counts out one that Admit counted in for uid.
func (q *UIDQuota) Done(uid uint32) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.total--
	if uid != 0 {
		q.others--
		if q.perUID[uid]--; q.perUID[uid] == 0 {
			delete(q.perUID, uid)
		}
	}
}

// Counted is how many are counted in, in all and for uids other than root.
func (q *UIDQuota) Counted() (total, others int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.total, q.others
}
