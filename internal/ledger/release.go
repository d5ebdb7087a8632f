package ledger

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"
)

// release frees every address of the lease k within c; now is the wall time recorded,
// mono the monotonic reading the reuse delay counts from.
func (c *change) release(k Key, reason Reason, detail string, now time.Time, mono time.Duration) error {
	l := c.l
	ls := l.leases[k]
	ps := l.pools[ls.PoolNetwork()]
	if ps == nil {
		return fmt.Errorf("%w: lease %s has no pool", ErrCorrupt, k)
	}
	c.touchPool(ps)
	for _, p := range ls.IPs {
		a := p.Addr()
		set := ps.setOf(a)
		if set < 0 {
			if err := c.releaseRetired(ps, ls, a, reason, detail, now); err != nil {
				return err
			}
			continue
		}
		ps.rec.Seq++
		f := Free{Network: ps.rec.Network, IP: a, Set: set, ReleasedAt: now, Seq: ps.rec.Seq, LastUID: ls.Pod.UID}
		if l.opts.Boot != nil {
			// read after mono: a reading later than the release's only shortens what
			// a restart counts as already waited
			if id, since, ok := l.opts.Boot.Boot(); ok {
				f.BootID, f.SinceBoot = id, since
			}
		}
		s := ps.sets[set]
		var b *blockState
		borrowed := slices.Contains(ls.Borrowed, a)
		if s.bits != 0 && !borrowed {
			if b = s.blockOf(a); b == nil {
				return fmt.Errorf("%w: lease %s holds %s outside the node's blocks", ErrCorrupt, k, a)
			}
			b.held--
			c.onUndo(func() { b.held++ })
		}
		// An address of a lost block is another node's now: its release is recorded
		// here (history, counters) but the address is not kept free.
		// A withheld address (lent to another node, kept for a pod) is not free either.
		// A borrowed address goes back to the lender's block, not to this node's.
		// An address of a draining block leaves the pool with it.
		keepFree := !borrowed && (b == nil || b.rec.State != BlockLost && b.rec.State != BlockDraining && !b.withheld[a])
		if keepFree {
			s.addFree(f, mono)
			// Undo by address, not by the item added here: a later step of the same
			// operation (a supersede ADD given the pod's old address) may have taken
			// that item and its own undo put back another one in its place.
			c.onUndo(func() { s.removeFree(s.index[a]) })
		}
		delete(ps.held, a)
		c.onUndo(func() { ps.held[a] = ls })
		ps.rec.Releases++
		r := Release{Network: ps.rec.Network, IP: a, Key: k, Pod: ls.Pod, From: ls.Created, To: now, Reason: reason, Detail: detail, Why: ls.Why, Seq: f.Seq}
		keep := l.opts.HistoryKeep
		c.write(func(tx Tx) error {
			if keepFree {
				if err := tx.PutFree(f); err != nil {
					return err
				}
			}
			return tx.AppendHistory(r, keep)
		})
		if b != nil && b.rec.State == BlockLost && b.held == 0 {
			c.dropBlock(s, b)
		}
	}
	delete(l.leases, k)
	l.unindexUID(ls)
	c.onUndo(func() { l.leases[k] = ls; l.indexUID(ls) })
	c.write(func(tx Tx) error { return tx.DeleteLease(k) })
	return nil
}

// Release frees the lease of attachment k, recording reason. Releasing an attachment
// that holds nothing succeeds with released false (a DEL is idempotent).
func (l *Ledger) Release(k Key, reason Reason, detail string) (released Lease, ok bool, err error) {
	return l.releaseIf(k, reason, detail, func(*Lease) bool { return true }, nil)
}

// ReleaseLogLater is Release, handing the release's log lines to later instead of
// writing them before it returns (see LogLines).
func (l *Ledger) ReleaseLogLater(k Key, reason Reason, detail string, later *LogLines) (released Lease, ok bool, err error) {
	return l.releaseIf(k, reason, detail, func(*Lease) bool { return true }, later)
}

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

// releaseIf releases the lease of k when cond holds for it; later as in doLater.
func (l *Ledger) releaseIf(k Key, reason Reason, detail string, cond func(*Lease) bool, later *LogLines) (released Lease, ok bool, err error) {
	if err := validRelease(reason, detail); err != nil {
		return Lease{}, false, err
	}
	err = l.doLater(func(c *change) error {
		ls, held := l.leases[k]
		if !held || !cond(ls) {
			return nil
		}
		released, ok = cloneLease(ls), true
		if err := c.release(k, reason, detail, l.opts.Clock.Now().UTC(), l.opts.Clock.Mono()); err != nil {
			return err
		}
		snapshot := released
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelInfo, "released", "attachment", k.String(), "ips", fmt.Sprint(snapshot.IPs), "reason", string(reason), "detail", detail)
		})
		return nil
	}, later)
	if err != nil {
		return Lease{}, false, err
	}
	return released, ok, nil
}

// releaseRetired releases address a of lease ls, which lies in a retired range set of
// ps (one the pool's ranges no longer include): the release is recorded in the
// history and counted, but the address is not kept free, and the retired set goes
// from the pool record with its last held address. The caller has touched ps.
func (c *change) releaseRetired(ps *poolState, ls *Lease, a netip.Addr, reason Reason, detail string, now time.Time) error {
	r := ps.retiredOf(a)
	if r < 0 {
		return fmt.Errorf("%w: lease %s holds %s outside its pool", ErrCorrupt, ls.Key, a)
	}
	ps.rec.Seq++
	ps.rec.Releases++
	delete(ps.held, a)
	c.onUndo(func() { ps.held[a] = ls })
	oldHeld := ps.retiredHeld
	c.onUndo(func() { ps.retiredHeld = oldHeld })
	held := append([]int(nil), oldHeld...)
	held[r]--
	if held[r] == 0 {
		// new slices: the record's value before this operation, which its undo
		// restores, shares the old one
		ps.rec.Retired = append(ps.rec.Retired[:r:r], ps.rec.Retired[r+1:]...)
		if len(ps.rec.Retired) == 0 {
			ps.rec.Retired = nil
		}
		held = append(held[:r:r], held[r+1:]...)
	}
	ps.retiredHeld = held
	rel := Release{Network: ls.Key.Network, IP: a, Key: ls.Key, Pod: ls.Pod, From: ls.Created, To: now, Reason: reason, Detail: detail, Why: ls.Why, Seq: ps.rec.Seq}
	keep := c.l.opts.HistoryKeep
	c.write(func(tx Tx) error { return tx.AppendHistory(rel, keep) })
	return nil
}
