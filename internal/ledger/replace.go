package ledger

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/pool"
)

// replaceRanges gives the node-mode pool ps the range sets ranges within c
// (AllocateRequest.ReplaceRanges):
//
//   - a new set equal to one of the pool's keeps that set's state (fresh cursor,
//     released addresses and their reuse delay), under its new index;
//   - any other new set starts unused; it must not overlap an address the pool holds
//     or keeps free (the pool's cursor through the set could not account for it), so
//     such a change is refused with ErrPoolConflict;
//   - an old set that is not kept leaves the pool: its free addresses are forgotten
//     (their history stays), and when leases still hold addresses in it, it becomes a
//     retired set (PoolRecord.Retired) until the last of them is released.
//
// Retired sets stay as they are. The whole change is one transaction with whatever
// the operation does next (the allocation that asked for it).
func (c *change) replaceRanges(ps *poolState, ranges []pool.RangeSet) error {
	l := c.l
	network := ps.rec.Network
	if err := pool.Validate(ranges); err != nil {
		return err
	}
	if err := l.checkDisjoint(network, ranges); err != nil {
		return err
	}
	kept := make([]int, len(ranges)) // the old index of each new set, or -1
	isKept := make([]bool, len(ps.sets))
	for j, set := range ranges {
		kept[j] = -1
		for i, s := range ps.sets {
			if !isKept[i] && pool.Equal([]pool.RangeSet{s.set}, []pool.RangeSet{set}) {
				kept[j], isKept[i] = i, true
				break
			}
		}
	}
	for j, set := range ranges {
		if kept[j] >= 0 {
			continue
		}
		if a, ok := ps.usedIn(set); ok {
			return fmt.Errorf("%w: network %q: its ranges %v cannot become %v: new range set %s overlaps %s, which the pool holds or keeps free; a changed range set must be disjoint from the addresses in use (release the leases of %q first, or use another network name)",
				ErrPoolConflict, network, pool.SetsString(ps.rec.Ranges), pool.SetsString(ranges), set.String(), a, network)
		}
	}

	c.touchPool(ps)
	oldSets, oldHeld := ps.sets, ps.retiredHeld
	c.onUndo(func() { ps.sets, ps.retiredHeld = oldSets, oldHeld })
	sets := make([]*setState, len(ranges))
	next := make([]uint64, len(ranges))
	for j, set := range ranges {
		i := kept[j]
		if i < 0 {
			sets[j] = newSetState(set)
			continue
		}
		sets[j], next[j] = ps.sets[i], ps.rec.NextFresh[i]
		if i != j {
			for _, it := range sets[j].index {
				it.f.Set = j
				c.onUndo(func() { it.f.Set = i })
				f := it.f
				c.write(func(tx Tx) error { return tx.PutFree(f) })
			}
		}
	}
	retired := append([]pool.RangeSet(nil), ps.rec.Retired...)
	held := append([]int(nil), ps.retiredHeld...)
	for i, s := range ps.sets {
		if isKept[i] {
			continue
		}
		for a := range s.index {
			c.write(func(tx Tx) error { return tx.DeleteFree(network, a) })
		}
		n := 0
		for a := range ps.held {
			if s.set.Contains(a) {
				n++
			}
		}
		if n > 0 {
			retired, held = append(retired, s.set), append(held, n)
		}
	}
	if len(retired) == 0 {
		retired = nil
	}
	old := pool.SetsString(ps.rec.Ranges)
	ps.sets, ps.retiredHeld = sets, held
	ps.rec.Ranges, ps.rec.NextFresh, ps.rec.Retired = ranges, next, retired
	ps.rec.RangeChanges++
	now := pool.SetsString(ranges)
	still := pool.SetsString(retired)
	c.onCommit(func(at time.Time) {
		l.logAt(at, slog.LevelWarn, "pool ranges replaced", "network", network, "from", old, "to", now, "retired", still)
	})
	return nil
}

// usedIn returns an address of set that the pool holds (in a lease) or keeps free.
func (ps *poolState) usedIn(set pool.RangeSet) (netip.Addr, bool) {
	for a := range ps.held {
		if set.Contains(a) {
			return a, true
		}
	}
	for _, s := range ps.sets {
		for a := range s.index {
			if set.Contains(a) {
				return a, true
			}
		}
	}
	return netip.Addr{}, false
}
