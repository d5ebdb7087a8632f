package pool

import (
	"fmt"
	"net/netip"
)

// Blocks: in cluster mode a pool's range sets are split into aligned blocks of one
// prefix length per range set, and a node allocates only inside the blocks it owns.

// LastAddr returns the last address of p (all host bits set).
func LastAddr(p netip.Prefix) netip.Addr { return lastAddr(p.Masked()) }

// Clip returns the part of the set inside p: its ranges cut to p (gateways kept as
// they are, so Reserved still tells them apart), nil when they do not meet. Offsets in
// the result (Addr, Offset, Size) number the block's own addresses.
func (s RangeSet) Clip(p netip.Prefix) RangeSet {
	p = p.Masked()
	first, last := p.Addr(), lastAddr(p)
	var out RangeSet
	for _, r := range s {
		if r.RangeStart.BitLen() != first.BitLen() || r.RangeEnd.Less(first) || last.Less(r.RangeStart) {
			continue
		}
		c := r
		if c.RangeStart.Less(first) {
			c.RangeStart = first
		}
		if last.Less(c.RangeEnd) {
			c.RangeEnd = last
		}
		out = append(out, c)
	}
	return out
}

// Usable is the number of addresses of the set that can be handed out: its size less
// the gateways inside it (saturating like Size).
func (s RangeSet) Usable() uint64 {
	n := s.Size()
	seen := map[netip.Addr]bool{}
	for _, r := range s {
		if r.Gateway.IsValid() && !seen[r.Gateway] && s.Contains(r.Gateway) && n > 0 && n != ^uint64(0) {
			seen[r.Gateway] = true
			n--
		}
	}
	return n
}

// NextBlock returns the first block of prefix length bits that starts at or after
// from and holds at least one usable address of the set (an address of a range that
// is not a gateway), in address order; false when there is none. Iterate with
// from = LastAddr(previous).Next(). It never enumerates empty space: it jumps to the
// next range when a block past the current one would not meet it.
func (s RangeSet) NextBlock(bits int, from netip.Addr) (netip.Prefix, bool) {
	if len(s) == 0 {
		return netip.Prefix{}, false
	}
	// ranges in address order (a set's ranges need not be sorted)
	order := make([]Range, len(s))
	copy(order, s)
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && order[j].RangeStart.Less(order[j-1].RangeStart); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	for _, r := range order {
		if !from.IsValid() || from.BitLen() != r.RangeStart.BitLen() {
			from = r.RangeStart
		}
		if r.RangeEnd.Less(from) {
			continue
		}
		start := from
		if start.Less(r.RangeStart) {
			start = r.RangeStart
		}
		for {
			b, err := start.Prefix(bits)
			if err != nil {
				return netip.Prefix{}, false
			}
			if c := s.Clip(b); c.Usable() > 0 {
				return b, true
			}
			last := lastAddr(b)
			if !last.Less(r.RangeEnd) {
				break
			}
			start = last.Next()
		}
		from = r.RangeEnd.Next()
		if !from.IsValid() {
			return netip.Prefix{}, false
		}
	}
	return netip.Prefix{}, false
}

// CheckBlockBits checks that bits is a usable block prefix length for the set: of its
// family, at least 4 addresses (two host bits), at most 2^16 addresses. field names
// the config key in errors.
func (s RangeSet) CheckBlockBits(bits int, field string) error {
	if len(s) == 0 {
		return fmt.Errorf("%w: %s: empty range set", ErrInvalidRange, field)
	}
	bl := s[0].Subnet.Addr().BitLen()
	if bits < bl-16 || bits > bl-2 {
		fam := "IPv4"
		if bl == 128 {
			fam = "IPv6"
		}
		return fmt.Errorf("%w: %s: /%d blocks for the %s range set %s; use a prefix length from %d to %d (default %d)", ErrInvalidRange, field, bits, fam, s.String(), bl-16, bl-2, bl-6)
	}
	return nil
}
