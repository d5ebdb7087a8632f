package ledger

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"time"

	"github.com/ipledger/ipledger/internal/pool"
)

// ensurePool returns the pool of network, creating it (within c) from ranges when it
// does not exist. ranges may be nil to require an existing pool. An existing pool
// with other ranges has them replaced with replace (replaceRanges); otherwise, or
// when replaceRanges refuses, it starts again as a node-mode pool of ranges if no
// lease is live in it, and is refused if one is (replacePool).
func (c *change) ensurePool(network string, ranges []pool.RangeSet, replace bool) (*poolState, error) {
	l := c.l
	if ps := l.pools[network]; ps != nil {
		if ranges != nil && !pool.Equal(ps.rec.Ranges, ranges) {
			if replace && ps.rec.BlockBits == nil {
				err := c.replaceRanges(ps, ranges)
				// replaceRanges refuses before it changes anything; a pool
				// without live leases may start again instead
				if err == nil || len(ps.held) > 0 || !errors.Is(err, ErrPoolConflict) {
					return ps, err
				}
			}
			if err := c.replacePool(ps, ranges, nil); err != nil {
				return nil, err
			}
		}
		return ps, nil
	}
	if ranges == nil {
		return nil, fmt.Errorf("%w: %q has no pool; an ADD with its ranges creates it", ErrUnknownNetwork, network)
	}
	if err := pool.Validate(ranges); err != nil {
		return nil, err
	}
	if err := l.checkDisjoint(network, ranges); err != nil {
		return nil, err
	}
	rec := PoolRecord{Network: network, Ranges: ranges, Created: l.opts.Clock.Now().UTC(), NextFresh: make([]uint64, len(ranges))}
	ps, err := newPoolState(rec)
	if err != nil {
		return nil, err
	}
	l.pools[network] = ps
	c.onUndo(func() { delete(l.pools, network) })
	c.touchPool(ps)
	return ps, nil
}

// AllocateRequest asks for the addresses of one attachment.
type AllocateRequest struct {
	Key   Key
	Pod   Pod
	NetNS NetNS
	// Ranges of the network's pool; the pool is created on first use and a later
	// request with other ranges fails with ErrPoolConflict. Nil uses the existing pool.
	Ranges []pool.RangeSet
	// ReplaceRanges lets Ranges replace the ranges of an existing node-mode pool
	// instead of conflicting with them: the ranges stand for something that can
	// change under live leases (the node's Kubernetes podCIDR). New allocations come
	// from the new ranges; leases in the old ones are kept, and released as usual
	// (see PoolRecord.Retired). An attachment that holds a lease gets it back
	// whatever its ranges (ADD is idempotent).
	ReplaceRanges bool
	// Supersede names leases (of the same pod) to release, reason superseded, in the
	// same transaction before allocating, so the pod may keep its address. Whatever
	// lease such an attachment holds when the request is applied is released; prefer
	// SupersedeHolders.
	Supersede []Key
	// SupersedeHolders names the leases to supersede by the holder that was judged
	// (attachment and creation time): one whose attachment holds another lease by the
	// time the request is applied (released and allocated again meanwhile) is kept.
	SupersedeHolders []Holder
	// LogLater, when set, receives the allocation's log lines instead of their being
	// written before Allocate returns (see LogLines).
	LogLater *LogLines
	// Why is recorded with the lease and its history (Lease.Why): how its
	// addresses were chosen.
	Why string
	// Want asks for these addresses, at most one per range set (a pod's
	// ipledger.io/ip): each must lie in a range set of the pool, be neither a
	// network, broadcast or gateway address nor excluded, nor held, nor kept for a
	// StatefulSet pod, nor released by another pod less than the reuse delay ago,
	// and in cluster mode lie in an active block of the node. Otherwise the
	// allocation fails with ErrAddressUnavailable and nothing changes. Range sets
	// without a requested address are picked as usual. With Sticky, see there.
	Want []netip.Addr
	// Sticky says Want are a StatefulSet pod's own addresses, which the caller
	// settled in the datastore: each one withheld (kept) in an active block of the
	// node, or, in a cluster-scoped pool, one outside the node's blocks that the
	// caller borrowed from another node's block through the datastore (recorded in
	// Lease.Borrowed). One that cannot be given fails with ErrAddressUnavailable.
	Sticky bool
	// Exclude are addresses no allocation of this request hands out (reservations):
	// the ledger skips them (those its fresh cursor passes become free addresses that
	// stay unused while excluded). A lease already holding one keeps it.
	Exclude []netip.Prefix
	// Pool names the ledger pool to allocate from when it is not the network's own
	// (a named pool of cluster mode, a pool record of its own whose name cannot be a
	// network name); Ranges are then that pool's. The lease records it (Lease.Pool)
	// and its release returns the addresses there. Empty: the network's pool.
	Pool string
}

// poolNetwork is the ledger pool the request allocates from.
func (req AllocateRequest) poolNetwork() string {
	if req.Pool != "" {
		return req.Pool
	}
	return req.Key.Network
}

// Holder identifies one lease: an attachment and the time its lease was created. A
// lease released and allocated again under the same key is another holder.
type Holder struct {
	Key     Key       `json:"key"`
	Created time.Time `json:"created"`
}

// HolderOf returns the holder identity of ls.
func HolderOf(ls Lease) Holder { return Holder{Key: ls.Key, Created: ls.Created} }

// MaxSupersede bounds how many leases one request may supersede.
const MaxSupersede = 64

// Validate checks every field of the request before it joins a group commit, so that
// a bad request fails alone with an error naming the field and its limit.
func (req AllocateRequest) Validate() error {
	if err := req.Key.Validate(); err != nil {
		return err
	}
	if err := req.Pod.Validate(); err != nil {
		return err
	}
	if err := req.NetNS.Validate(); err != nil {
		return err
	}
	if req.Ranges != nil {
		if err := pool.Validate(req.Ranges); err != nil {
			return err
		}
	}
	if n := len(req.Supersede) + len(req.SupersedeHolders); n > MaxSupersede {
		return fmt.Errorf("%w: supersede: %d leases; at most %d", ErrInvalidAttachment, n, MaxSupersede)
	}
	for _, k := range req.Supersede {
		if err := k.Validate(); err != nil {
			return fmt.Errorf("supersede: %w", err)
		}
	}
	for _, h := range req.SupersedeHolders {
		if err := h.Key.Validate(); err != nil {
			return fmt.Errorf("supersede: %w", err)
		}
	}
	if req.Pool != "" {
		if err := boundedText("pool", req.Pool, MaxNetworkLen); err != nil {
			return err
		}
	}
	return req.validChoice()
}

// Allocate gives the attachment one address from every range set of its network's
// pool. It is idempotent: an attachment that already holds a lease gets that lease
// back (existed is true) and nothing changes.
func (l *Ledger) Allocate(req AllocateRequest) (lease Lease, existed bool, err error) {
	if err := req.Validate(); err != nil {
		return Lease{}, false, err
	}
	err = l.doLater(func(c *change) error {
		if ls, ok := l.leases[req.Key]; ok {
			if ps := l.pools[req.poolNetwork()]; req.Ranges != nil && req.poolNetwork() == ls.PoolNetwork() && !req.ReplaceRanges && !pool.Equal(ps.rec.Ranges, req.Ranges) {
				return ps.liveConflict(req.Ranges, nil)
			}
			lease, existed = cloneLease(ls), true
			return nil
		}
		ps, err := c.ensurePool(req.poolNetwork(), req.Ranges, req.ReplaceRanges)
		if err != nil {
			return err
		}
		now := l.opts.Clock.Now().UTC()
		mono := l.opts.Clock.Mono()
		supersede := func(k Key, judged func(*Lease) bool) error {
			if k == req.Key {
				return nil
			}
			if ls, ok := l.leases[k]; ok && judged(ls) {
				return c.release(k, ReasonSuperseded, "superseded by "+req.Key.ContainerID, now, mono)
			}
			return nil
		}
		for _, k := range req.Supersede {
			if err := supersede(k, func(*Lease) bool { return true }); err != nil {
				return err
			}
		}
		for _, h := range req.SupersedeHolders {
			if err := supersede(h.Key, func(ls *Lease) bool { return ls.Created.Equal(h.Created) }); err != nil {
				return err
			}
		}
		if ps.rec.BlockBits != nil && l.guard != nil {
			if err := l.guard(req.poolNetwork()); err != nil {
				return fmt.Errorf("network %q: allocation refused: %w", req.poolNetwork(), err)
			}
		}
		want, err := wantFor(ps, req.Want)
		if err != nil {
			return err
		}
		ls := &Lease{Key: req.Key, Pod: req.Pod, NetNS: req.NetNS, Created: now, State: StateActive, Why: req.Why}
		if req.Pool != req.Key.Network {
			ls.Pool = req.Pool
		}
		if l.opts.Boot != nil {
			if id, since, ok := l.opts.Boot.Boot(); ok {
				ls.BootID, ls.SinceBoot = id, since
			}
		}
		for i := range ps.sets {
			var a netip.Addr
			var err error
			switch {
			case want[i].IsValid() && req.Sticky:
				var borrowed bool
				if a, borrowed, err = c.take(ps, i, want[i]); borrowed {
					ls.Borrowed = append(ls.Borrowed, a)
				}
			case want[i].IsValid():
				a, err = c.pickWanted(ps, i, want[i], req.Pod.UID, mono, req.Exclude)
			default:
				a, err = c.pick(ps, i, req.Pod.UID, mono, req.Exclude)
			}
			if err != nil {
				return err
			}
			r, _ := ps.sets[i].set.RangeOf(a)
			ls.IPs = append(ls.IPs, netip.PrefixFrom(a, r.Subnet.Bits()))
			ps.held[a] = ls
			c.onUndo(func() { delete(ps.held, a) })
			if b := ps.sets[i].blockOf(a); b != nil {
				b.held++
				b.gen++
				c.onUndo(func() { b.held--; b.gen-- })
			}
		}
		c.touchPool(ps)
		ps.rec.Allocations += uint64(len(ls.IPs))
		l.leases[req.Key] = ls
		l.indexUID(ls)
		c.onUndo(func() { delete(l.leases, req.Key); l.unindexUID(ls) })
		lease = cloneLease(ls)
		snapshot := lease
		c.write(func(tx Tx) error { return tx.PutLease(snapshot) })
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelInfo, "allocated", "attachment", req.Key.String(), "ips", fmt.Sprint(snapshot.IPs), "podUID", req.Pod.UID)
		})
		return nil
	}, req.LogLater)
	if err != nil {
		return Lease{}, false, err
	}
	return lease, existed, nil
}

// take gives the wanted address w of range set i (AllocateRequest.Want): a free or
// withheld address of an active block of the node, or (borrowed) one outside the
// node's blocks of a cluster-scoped pool.
func (c *change) take(ps *poolState, i int, w netip.Addr) (a netip.Addr, borrowed bool, err error) {
	if other := ps.held[w]; other != nil {
		return netip.Addr{}, false, fmt.Errorf("%w: %s is held by %s", ErrAddressUnavailable, w, other.Key)
	}
	s := ps.sets[i]
	if s.set.Reserved(w) {
		return netip.Addr{}, false, fmt.Errorf("%w: %s is reserved (network or gateway address)", ErrAddressUnavailable, w)
	}
	if s.bits == 0 {
		if it := s.index[w]; it != nil {
			return c.takeFree(s, it), false, nil
		}
		return netip.Addr{}, false, fmt.Errorf("%w: %s is not free", ErrAddressUnavailable, w)
	}
	b := s.blockOf(w)
	switch {
	case b == nil:
		return w, true, nil
	case b.rec.State != BlockActive:
		return netip.Addr{}, false, fmt.Errorf("%w: %s is in block %s, %s", ErrAddressUnavailable, w, b.rec.Prefix, b.rec.State)
	case b.withheld[w]:
		return w, false, nil
	}
	if it := s.index[w]; it != nil && !it.parked {
		return c.takeFree(s, it), false, nil
	}
	return netip.Addr{}, false, fmt.Errorf("%w: %s is neither free nor kept in block %s", ErrAddressUnavailable, w, b.rec.Prefix)
}

// takeFree hands out the free address it (removing it from s's free list, undone
// with the change) and deletes its free record at commit.
func (c *change) takeFree(s *setState, it *freeItem) netip.Addr {
	s.removeFree(it)
	f, m := it.f, it.mono
	c.onUndo(func() { s.addFree(f, m) })
	c.write(func(tx Tx) error { return tx.DeleteFree(f.Network, f.IP) })
	return f.IP
}

// nextFresh returns the first address of set at or after offset *next (below size)
// that is neither reserved, nor held (held), nor waiting in s's free list, and moves
// *next past every offset it looked at; false when there is none. The node-mode
// cursor (the pool record's) and a block's cursor both move through it.
func (s *setState) nextFresh(held map[netip.Addr]*Lease, set pool.RangeSet, size uint64, next *uint64) (netip.Addr, bool) {
	for *next < size {
		off := *next
		*next++
		a, ok := set.Addr(off)
		if !ok {
			break
		}
		if set.Reserved(a) {
			continue
		}
		if _, h := held[a]; h {
			continue
		}
		if _, free := s.index[a]; free {
			continue
		}
		if b := s.blockOf(a); b != nil && b.withheld[a] {
			continue
		}
		return a, true
	}
	return netip.Addr{}, false
}

// pick takes one address of range set i: the pod's own last address when it is free,
// else a never-used one, else the least recently released one past the reuse delay
// (measured on the monotonic clock: mono is now's reading).
func (c *change) pick(ps *poolState, i int, uid string, mono time.Duration, ex []netip.Prefix) (netip.Addr, error) {
	s := ps.sets[i]
	if s.bits != 0 {
		return c.pickBlock(ps, i, uid, mono, ex)
	}
	if uid != "" {
		var best *freeItem
		for _, it := range s.byUID[uid] {
			if !excluded(ex, it.f.IP) && (best == nil || it.f.Seq > best.f.Seq) {
				best = it
			}
		}
		if best != nil {
			return c.takeFree(s, best), nil
		}
	}
	c.touchPool(ps)
	if a, ok := c.fresh(ps, i, s.set, s.size, &ps.rec.NextFresh[i], ex); ok {
		return a, nil
	}
	if top := c.topEligible(s, mono, ex); top != nil {
		return c.takeFree(s, top), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: network %q range set %d (%s): all %d usable addresses are in use (%d more released less than the reuse delay of %s ago)",
		ErrPoolExhausted, ps.rec.Network, i, s.set.String(), s.usable, s.free.Len(), c.l.opts.ReuseDelay)
}

// checkDisjoint refuses new ranges for network's pool that overlap a range (or a
// retired range) of another network's pool: the two pools would hand out one address twice (each
// ledger key is per network). Pools are created rarely, so it sorts every range of
// every pool, O(n log n), and sweeps once, remembering the furthest end among the
// existing ranges and among the new ones: an overlapping pair is found when its
// later-starting member is reached. Overlaps between two existing pools (state
// written before this check) are left to the audit.
func (l *Ledger) checkDisjoint(network string, ranges []pool.RangeSet) error {
	type span struct {
		lo, hi  netip.Addr
		network string
		isNew   bool
	}
	var spans []span
	for n, ps := range l.pools {
		if n == network { // its own ranges, which new ones replace
			continue
		}
		for _, sets := range [][]pool.RangeSet{ps.rec.Ranges, ps.rec.Retired} {
			for _, set := range sets {
				for _, r := range set {
					spans = append(spans, span{r.RangeStart, r.RangeEnd, n, false})
				}
			}
		}
	}
	for _, set := range ranges {
		for _, r := range set {
			spans = append(spans, span{r.RangeStart, r.RangeEnd, network, true})
		}
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].lo.Less(spans[j].lo) })
	var far [2]*span // furthest-reaching existing [0] and new [1] range so far
	for i := range spans {
		s := &spans[i]
		other := 0
		if !s.isNew {
			other = 1
		}
		if o := far[other]; o != nil && o.lo.BitLen() == s.lo.BitLen() && !o.hi.Less(s.lo) {
			old, nw := o, s
			if !s.isNew {
				old, nw = s, o
			}
			return fmt.Errorf("%w: network %q: range %s-%s overlaps range %s-%s of network %q; two networks must not share addresses (each would hand them out): give %q ranges of its own, or use the network name %q",
				ErrPoolConflict, network, nw.lo, nw.hi, old.lo, old.hi, old.network, network, old.network)
		}
		mine := 0
		if s.isNew {
			mine = 1
		}
		if f := far[mine]; f == nil || f.lo.BitLen() != s.lo.BitLen() || f.hi.Less(s.hi) {
			far[mine] = s
		}
	}
	return nil
}
