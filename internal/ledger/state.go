package ledger

import (
	"time"
)

// ReleaseIfCreated releases the lease of attachment k with reason, but only when the
// attachment still holds the very lease that was observed: one created at created.
// A lease that was released and allocated again under the same key in the meantime
// is a different holder and is kept. It returns the released lease and whether one
// was released. The reconciler releases through it, so evidence gathered about one
// holder never releases another.
func (l *Ledger) ReleaseIfCreated(k Key, created time.Time, reason Reason, detail string) (released Lease, ok bool, err error) {
	return l.releaseIf(k, reason, detail, func(ls *Lease) bool { return ls.Created.Equal(created) }, nil)
}

// ReleaseCreatedBefore frees the lease of k only when it was created before t: a DEL
// that was spooled at t must not release a lease the attachment got after it (a
// container ID re-used, a runtime retrying ADD after the DEL). A lease created at or
// after t is kept, and ok is false.
func (l *Ledger) ReleaseCreatedBefore(k Key, t time.Time, reason Reason, detail string) (released Lease, ok bool, err error) {
	return l.releaseIf(k, reason, detail, func(ls *Lease) bool { return ls.Created.Before(t) }, nil)
}
