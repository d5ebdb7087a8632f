package ledger

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/pool"
)

// Addresses the operator chooses: an allocation may ask for given addresses
// (AllocateRequest.Want, a pod's ipledger.io/ip) and keep others out of every pick
// (AllocateRequest.Exclude, the reservations). Both are decided inside the
// allocation's own transaction, against the books as they are then.

// excluded reports whether a lies in one of ex.
func excluded(ex []netip.Prefix, a netip.Addr) bool {
	for _, p := range ex {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// validChoice checks the request's Why, Want and Exclude.
func (req AllocateRequest) validChoice() error {
	if err := boundedText("why", req.Why, MaxWhyLen); err != nil {
		return err
	}
	if len(req.Exclude) > MaxExclude {
		return fmt.Errorf("%w: exclude: %d prefixes; at most %d", ErrInvalidAttachment, len(req.Exclude), MaxExclude)
	}
	for _, p := range req.Exclude {
		if !p.IsValid() || p.Addr().Zone() != "" {
			return fmt.Errorf("%w: exclude: %q is not an address prefix", ErrInvalidAttachment, p)
		}
	}
	if len(req.Want) > pool.MaxRangeSets {
		return fmt.Errorf("%w: requested addresses: %d; at most one per range set", ErrInvalidAttachment, len(req.Want))
	}
	for i, a := range req.Want {
		if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
			return fmt.Errorf("%w: requested address %q is not an IPv4 or IPv6 address", ErrAddressUnavailable, a)
		}
		for _, b := range req.Want[:i] {
			if a.BitLen() == b.BitLen() {
				return fmt.Errorf("%w: requested addresses %s and %s are of one family; ask for at most one address per family", ErrAddressUnavailable, b, a)
			}
		}
	}
	return nil
}

// wantFor returns, for every range set of ps, the requested address inside it (the
// zero Addr when none); a requested address inside no range set is refused.
func wantFor(ps *poolState, want []netip.Addr) ([]netip.Addr, error) {
	out := make([]netip.Addr, len(ps.sets))
	for _, a := range want {
		i := ps.setOf(a)
		if i < 0 {
			return nil, fmt.Errorf("%w: requested address %s is outside every range of network %q (%s)", ErrAddressUnavailable, a, ps.rec.Network, pool.SetsString(ps.rec.Ranges))
		}
		if out[i].IsValid() {
			return nil, fmt.Errorf("%w: requested addresses %s and %s are in one range set of network %q; ask for at most one per range set", ErrAddressUnavailable, out[i], a, ps.rec.Network)
		}
		out[i] = a
	}
	return out, nil
}

// neverReleased is the monotonic reading of a free address no pod held: past every
// reuse delay.
const neverReleased = time.Duration(math.MinInt64 / 2)

// neverUsed reports whether f is a free address the fresh cursor passed without
// handing it out (excluded, or passed for a requested address): release sequence 0,
// no release time. It has no release in its history.
func (f Free) neverUsed() bool { return f.Seq == 0 && f.ReleasedAt.IsZero() }

// neverUsed makes a of range set s a free address that was never handed out (it is
// below a fresh cursor now, so the books must account for it): it counts as released
// at the beginning of time.
func (c *change) neverUsed(ps *poolState, s *setState, set int, a netip.Addr) {
	f := Free{Network: ps.rec.Network, IP: a, Set: set}
	s.addFree(f, neverReleased)
	c.onUndo(func() { s.removeFree(s.index[a]) })
	c.write(func(tx Tx) error { return tx.PutFree(f) })
}

// pickWanted takes the requested address a of range set i for the pod uid, or
// says why it cannot (ErrAddressUnavailable).
func (c *change) pickWanted(ps *poolState, i int, a netip.Addr, uid string, mono time.Duration, ex []netip.Prefix) (netip.Addr, error) {
	s := ps.sets[i]
	network := ps.rec.Network
	if s.set.Reserved(a) {
		return netip.Addr{}, fmt.Errorf("%w: requested address %s is the network, broadcast or gateway address of network %q", ErrAddressUnavailable, a, network)
	}
	if excluded(ex, a) {
		return netip.Addr{}, fmt.Errorf("%w: requested address %s is reserved (excluded from every pod)", ErrAddressUnavailable, a)
	}
	if ls, held := ps.held[a]; held {
		who := ls.Key.String()
		if ls.Pod.Name != "" {
			who = "pod " + ls.Pod.Namespace + "/" + ls.Pod.Name + " (" + who + ")"
		}
		return netip.Addr{}, fmt.Errorf("%w: requested address %s is held by %s", ErrAddressUnavailable, a, who)
	}
	set, size, next := s.set, s.size, (*uint64)(nil)
	var b *blockState
	if s.bits != 0 {
		b = s.blockOf(a)
		if b == nil || b.rec.State != BlockActive {
			return netip.Addr{}, fmt.Errorf("%w: requested address %s is in no block this node owns and can prove", ErrAddressUnavailable, a)
		}
		if b.withheld[a] {
			return netip.Addr{}, fmt.Errorf("%w: requested address %s is kept for a StatefulSet pod (a sticky address); ask for another", ErrAddressUnavailable, a)
		}
		c.saveBlock(b)
		set, size, next = b.clip, b.size, &b.rec.NextFresh
	} else {
		c.touchPool(ps)
		next = &ps.rec.NextFresh[i]
	}
	if it, free := s.index[a]; free {
		if it.parked {
			return netip.Addr{}, fmt.Errorf("%w: requested address %s is in a block this node cannot hand out from now", ErrAddressUnavailable, a)
		}
		if it.f.LastUID != uid && mono-it.mono < c.l.opts.ReuseDelay {
			return netip.Addr{}, fmt.Errorf("%w: requested address %s was released by another pod less than the reuse delay (%s) ago; ask again later", ErrAddressUnavailable, a, c.l.opts.ReuseDelay)
		}
		return c.takeFree(s, it), nil
	}
	off, ok := set.Offset(a)
	if !ok || off >= size {
		return netip.Addr{}, fmt.Errorf("%w: requested address %s is outside the ranges of network %q", ErrAddressUnavailable, a, network)
	}
	if off < *next {
		// below the cursor every address but the reserved ones is held or free
		return netip.Addr{}, fmt.Errorf("%w: requested address %s of network %q is neither held nor free (run ipledgerctl audit)", ErrCorrupt, a, network)
	}
	// The addresses the cursor passes on its way to a become free ones never used,
	// so that the books still account for everything below it.
	for ; *next < off; *next++ {
		x, ok := set.Addr(*next)
		if !ok || set.Reserved(x) {
			continue
		}
		if _, h := ps.held[x]; h {
			continue
		}
		if _, f := s.index[x]; f {
			continue
		}
		if b != nil && b.withheld[x] {
			continue
		}
		c.neverUsed(ps, s, i, x)
	}
	*next = off + 1
	return a, nil
}

// topEligible is the least recently released free address of s past the reuse delay
// and not excluded, or nil. Usually the heap's top; when the top is excluded it scans.
func (c *change) topEligible(s *setState, mono time.Duration, ex []netip.Prefix) *freeItem {
	ok := func(it *freeItem) bool { return mono-it.mono >= c.l.opts.ReuseDelay && !excluded(ex, it.f.IP) }
	top := s.free.top()
	switch {
	case top == nil:
		return nil
	case ok(top):
		return top
	case !excluded(ex, top.f.IP):
		return nil // the least recently released one is still in its reuse delay
	}
	var best *freeItem
	for _, it := range s.free {
		if ok(it) && (best == nil || it.f.Seq < best.f.Seq) {
			best = it
		}
	}
	return best
}

// fresh is s.nextFresh that turns every excluded address it meets into a free one
// never used (accounted below the cursor, handed out once no longer excluded).
func (c *change) fresh(ps *poolState, i int, set pool.RangeSet, size uint64, next *uint64, ex []netip.Prefix) (netip.Addr, bool) {
	s := ps.sets[i]
	for {
		a, ok := s.nextFresh(ps.held, set, size, next)
		if !ok || !excluded(ex, a) {
			return a, ok
		}
		c.neverUsed(ps, s, i, a)
	}
}
