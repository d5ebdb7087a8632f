package ledger

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
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

// replacePool gives network's pool ps the ranges and block sizes of a config that
// differs from it (other ranges, or node mode <-> cluster mode: blockBits nil for a
// node-mode pool), within c. It is refused with ErrPoolConflict while a lease holds
// an address of the pool (its ranges or its retired sets) or a block withholds one,
// and while an address released into the pool's free list that the new ranges
// include is within its reuse delay (the new pool does not know it was released).
// Otherwise the pool starts again under the new config: the old ranges' free
// addresses and the blocks are forgotten (deleted from the store), the counters carry
// over so that the books still balance (allocations = releases + live), the history
// stays (every release keeps its record), and PoolRecord.Replaced records what the
// pool was and why it was replaced.
func (c *change) replacePool(ps *poolState, ranges []pool.RangeSet, blockBits []int) error {
	l := c.l
	network := ps.rec.Network
	if len(ps.held) > 0 {
		return ps.liveConflict(ranges, blockBits)
	}
	withheld := 0
	for _, s := range ps.sets {
		for _, b := range s.order {
			withheld += len(b.withheld)
		}
	}
	if withheld > 0 {
		return fmt.Errorf("%w: network %q is %s and its blocks withhold %d addresses (borrowed by another node or kept for a StatefulSet pod); a config for the same network name must keep it (%s) until they are given back, or use another network name",
			ErrPoolConflict, network, shapeOf(ps.rec.Ranges, ps.rec.BlockBits), withheld, shapeOf(ranges, blockBits))
	}
	if err := pool.Validate(ranges); err != nil {
		return err
	}
	if err := l.checkDisjoint(network, ranges); err != nil {
		return err
	}
	if n, wait := ps.cooling(ranges, l.opts.Clock.Mono(), l.opts.ReuseDelay); n > 0 {
		return fmt.Errorf("%w: network %q: %d of its addresses were released less than the reuse delay (%v) ago and lie in the new ranges %v, which would hand them out at once; the pool is replaced once they have waited it out (retry in %v)",
			ErrPoolConflict, network, n, l.opts.ReuseDelay, pool.SetsString(ranges), wait.Round(time.Millisecond))
	}
	now := l.opts.Clock.Now().UTC()
	reason := replaceReason(ps.rec.BlockBits, blockBits, pool.Equal(ps.rec.Ranges, ranges))
	rec := PoolRecord{
		Network: network, Ranges: ranges, Created: ps.rec.Created, NextFresh: make([]uint64, len(ranges)),
		Seq: ps.rec.Seq, Allocations: ps.rec.Allocations, Releases: ps.rec.Releases,
		BlockBits: slices.Clone(blockBits), RangeChanges: ps.rec.RangeChanges + 1,
		Replaced: &PoolReplacement{At: now, FromRanges: ps.rec.Ranges, FromBlockBits: slices.Clone(ps.rec.BlockBits), Reason: reason},
	}
	fresh, err := newPoolState(rec)
	if err != nil {
		return fmt.Errorf("%w: network %q: %w", ErrPoolConflict, network, err)
	}
	c.touchPool(ps)
	for _, s := range ps.sets {
		for a := range s.index {
			c.write(func(tx Tx) error { return tx.DeleteFree(network, a) })
		}
		for _, b := range s.order {
			b.removed = true
			c.onUndo(func() { b.removed = false })
			prefix := b.rec.Prefix
			c.write(func(tx Tx) error { return tx.DeleteBlock(network, prefix) })
		}
	}
	oldSets, oldHeld := ps.sets, ps.retiredHeld
	c.onUndo(func() { ps.sets, ps.retiredHeld = oldSets, oldHeld })
	ps.rec, ps.sets, ps.retiredHeld = rec, fresh.sets, fresh.retiredHeld
	from, to := shapeOf(rec.Replaced.FromRanges, rec.Replaced.FromBlockBits), shapeOf(ranges, blockBits)
	c.onCommit(func(at time.Time) {
		l.logAt(at, slog.LevelWarn, "pool replaced", "network", network, "from", from, "to", to, "reason", reason)
	})
	return nil
}

// cooling counts the free addresses of ps inside ranges that are still within their
// reuse delay at mono, and returns the longest wait left.
func (ps *poolState) cooling(ranges []pool.RangeSet, mono, delay time.Duration) (n int, wait time.Duration) {
	for _, s := range ps.sets {
		for a, it := range s.index {
			left := delay - (mono - it.mono)
			if left <= 0 {
				continue
			}
			for _, set := range ranges {
				if set.Contains(a) {
					n, wait = n+1, max(wait, left)
					break
				}
			}
		}
	}
	return n, wait
}

// liveConflict is the error refusing to give ps, which live leases hold, another
// config: it names how many leases hold it and how to find them.
func (ps *poolState) liveConflict(ranges []pool.RangeSet, blockBits []int) error {
	network := ps.rec.Network
	leases := map[Key]bool{}
	for _, ls := range ps.held {
		leases[ls.Key] = true
	}
	return fmt.Errorf("%w: network %q is %s and %d live leases hold %d of its addresses; a config for the same network name must keep it (not %s) while a lease is live: release every lease of %q first (list them with `ipledgerctl leases --network %s`), or use another network name for a new pool",
		ErrPoolConflict, network, shapeOf(ps.rec.Ranges, ps.rec.BlockBits), len(leases), len(ps.held), shapeOf(ranges, blockBits), network, network)
}

// shapeOf describes a pool's config for a message.
func shapeOf(ranges []pool.RangeSet, blockBits []int) string {
	if blockBits == nil {
		return "a node-mode pool of " + pool.SetsString(ranges)
	}
	return fmt.Sprintf("a cluster-wide pool of %s in blocks of /%v", pool.SetsString(ranges), blockBits)
}

// replaceReason says why a pool without live leases was replaced.
func replaceReason(from, to []int, sameRanges bool) string {
	switch {
	case from == nil && to != nil:
		return "no live lease; node mode to cluster mode"
	case from != nil && to == nil:
		return "no live lease; cluster mode to node mode"
	case !sameRanges:
		return "no live lease; ranges changed"
	default:
		return "no live lease; block size changed"
	}
}

// SetClusterRanges gives network's cluster-scoped pool the range sets ranges in
// place: as many sets as it has, each of the same family and block size. A range
// added can have blocks added in it (AddBlock) from then on; a range left out must
// hold no block of the node any more (the block manager drains such blocks first:
// DrainBlock, RemoveBlock) nor any address the pool holds or keeps free, and every
// block the node holds must keep its addresses (no range added or removed may
// share a block with one that stays). Anything else is refused with
// ErrPoolConflict and nothing changes. Leases, blocks, free addresses and their
// history are kept; PoolRecord.RangeChanges counts the change.
func (l *Ledger) SetClusterRanges(network string, ranges []pool.RangeSet) error {
	if err := pool.Validate(ranges); err != nil {
		return err
	}
	return l.do(func(c *change) error {
		ps := l.pools[network]
		if ps == nil {
			return fmt.Errorf("%w: %q", ErrUnknownNetwork, network)
		}
		if ps.rec.BlockBits == nil {
			return fmt.Errorf("%w: network %q is a node-mode pool; its ranges change with AllocateRequest.ReplaceRanges", ErrPoolConflict, network)
		}
		if pool.Equal(ps.rec.Ranges, ranges) {
			return nil
		}
		if len(ranges) != len(ps.sets) {
			return fmt.Errorf("%w: network %q has %d range sets; new ranges %v have %d (a range set cannot be added or removed in place)", ErrPoolConflict, network, len(ps.sets), pool.SetsString(ranges), len(ranges))
		}
		for i, s := range ps.sets {
			set := ranges[i]
			if set[0].Subnet.Addr().BitLen() != s.set[0].Subnet.Addr().BitLen() {
				return fmt.Errorf("%w: network %q range set %d is %s; %s is of the other family", ErrPoolConflict, network, i, s.set.String(), set.String())
			}
			if err := set.CheckBlockBits(s.bits, fmt.Sprintf("blockSize (range set %d)", i)); err != nil {
				return err
			}
			for _, b := range s.order {
				if !pool.Equal([]pool.RangeSet{set.Clip(b.rec.Prefix)}, []pool.RangeSet{b.clip}) {
					return fmt.Errorf("%w: network %q: block %s (%s) would hold other addresses under ranges %s; a range added or removed must not share a block with one that stays",
						ErrPoolConflict, network, b.rec.Prefix, b.rec.State, set.String())
				}
			}
			for a := range s.index {
				if !set.Contains(a) {
					return fmt.Errorf("%w: network %q: free address %s lies outside new ranges %s", ErrPoolConflict, network, a, set.String())
				}
			}
		}
		for a, ls := range ps.held {
			if i := ps.setOf(a); i >= 0 && !ranges[i].Contains(a) && !slices.Contains(ls.Borrowed, a) {
				return fmt.Errorf("%w: network %q: %s, held by %s, lies outside new ranges %s; drain its block first", ErrPoolConflict, network, a, ls.Key, pool.SetsString(ranges))
			}
		}
		if err := l.checkDisjoint(network, ranges); err != nil {
			return err
		}
		c.touchPool(ps)
		oldRanges, oldChanges := ps.rec.Ranges, ps.rec.RangeChanges
		type saved struct {
			set          pool.RangeSet
			size, usable uint64
		}
		olds := make([]saved, len(ps.sets))
		for i, s := range ps.sets {
			olds[i] = saved{s.set, s.size, s.usable}
			fresh := newSetState(ranges[i])
			s.set, s.size, s.usable = fresh.set, fresh.size, fresh.usable
		}
		c.onUndo(func() {
			ps.rec.Ranges, ps.rec.RangeChanges = oldRanges, oldChanges
			for i, s := range ps.sets {
				s.set, s.size, s.usable = olds[i].set, olds[i].size, olds[i].usable
			}
		})
		ps.rec.Ranges = ranges
		ps.rec.RangeChanges++
		from, to := pool.SetsString(oldRanges), pool.SetsString(ranges)
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelInfo, "cluster pool ranges changed", "network", network, "from", from, "to", to)
		})
		return nil
	})
}
