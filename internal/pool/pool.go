// Package pool holds address ranges in the host-local format: a network's pool is a
// list of range sets, each range set a list of ranges of one address family, and an
// attachment gets one address from every range set.
//
// Addresses are numbered by an offset within their range set so that allocation never
// scans: offset 0 is the first usable address of the first range.
package pool

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sort"
	"strings"
)

// ErrInvalidRange is returned (wrapped, with the field and the fix) for any range or
// range set that cannot be used.
var ErrInvalidRange = errors.New("invalid range")

// Range is one host-local style range. Subnet is required; RangeStart and RangeEnd
// default to the first and last usable address of the subnet (the network address and,
// for IPv4, the broadcast address are never usable); Gateway defaults to the subnet's
// first address, as in host-local, and is never handed out.
type Range struct {
	Subnet     netip.Prefix `json:"subnet"`
	RangeStart netip.Addr   `json:"rangeStart,omitzero"`
	RangeEnd   netip.Addr   `json:"rangeEnd,omitzero"`
	Gateway    netip.Addr   `json:"gateway,omitzero"`
	// PodCIDR, 4 or 6, marks a placeholder: the config's subnet was PodCIDRv4 or
	// PodCIDRv6, which the agent resolves to its Node's spec.podCIDRs of that
	// family (Resolve) before anything is allocated; the other fields are then
	// zero. A pool never holds a placeholder: Validate refuses one.
	PodCIDR int `json:"usePodCidr,omitzero"`
}

// Placeholders of a range's subnet (Calico's host-local convention): this node's
// Kubernetes podCIDR of the family. One conflist then serves every node.
const (
	PodCIDRv4 = "usePodCidr"
	PodCIDRv6 = "usePodCidrIPv6"
)

// ErrNoPodCIDR is returned (wrapped, naming the family) by Resolve when the node has
// no podCIDR of a family a placeholder asks for.
var ErrNoPodCIDR = errors.New("no podCIDR")

// RangeSet is a list of ranges of one address family; an attachment gets one address
// from it.
type RangeSet []Range

// rawRange is the JSON form, parsed by hand so that errors name the field.
type rawRange struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart,omitzero"`
	RangeEnd   string `json:"rangeEnd,omitzero"`
	Gateway    string `json:"gateway,omitzero"`
}

// ParseRangeSets parses and validates the `ranges` field of an IPAM config
// ([[{"subnet": ...}]]) and returns canonical range sets: defaults filled in, each
// range checked, no overlap between any two ranges of the pool.
func ParseRangeSets(data []byte) ([]RangeSet, error) {
	raw, err := decodeRaw(data) // json.Unmarshal, by hand for the common shape
	if err != nil {
		return nil, fmt.Errorf("%w: ranges: %v (want [[{\"subnet\": \"10.0.0.0/24\"}]])", ErrInvalidRange, err)
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("%w: ranges: empty; give at least one range set, e.g. [[{\"subnet\": \"10.0.0.0/24\"}]]", ErrInvalidRange)
	}
	sets := make([]RangeSet, 0, len(raw))
	for i, rs := range raw {
		if len(rs) == 0 {
			return nil, fmt.Errorf("%w: ranges[%d]: empty range set; give at least one range", ErrInvalidRange, i)
		}
		set := make(RangeSet, 0, len(rs))
		for j, rr := range rs {
			r, err := parseRange(rr, fmt.Sprintf("ranges[%d][%d]", i, j))
			if err != nil {
				return nil, err
			}
			set = append(set, r)
		}
		sets = append(sets, set)
	}
	if err := checkPlaceholders(sets); err != nil {
		return nil, err
	}
	// The concrete ranges are checked now; placeholders once the agent resolved them.
	if c := concrete(sets); len(c) > 0 || !HasPodCIDR(sets) {
		if err := Validate(c); err != nil {
			return nil, err
		}
	}
	return sets, nil
}

// HasPodCIDR reports whether any range of sets is a podCIDR placeholder.
func HasPodCIDR(sets []RangeSet) bool {
	for _, set := range sets {
		for _, r := range set {
			if r.PodCIDR != 0 {
				return true
			}
		}
	}
	return false
}

// concrete is sets without the range sets that are placeholders.
func concrete(sets []RangeSet) []RangeSet {
	if !HasPodCIDR(sets) {
		return sets
	}
	var out []RangeSet
	for _, set := range sets {
		if len(set) > 0 && set[0].PodCIDR == 0 {
			out = append(out, set)
		}
	}
	return out
}

// checkPlaceholders: a placeholder is alone in its range set (the set is the
// node's podCIDR of that family), and at most one range set asks for each family.
func checkPlaceholders(sets []RangeSet) error {
	var seen [7]bool
	for i, set := range sets {
		for j, r := range set {
			if r.PodCIDR == 0 {
				continue
			}
			if len(set) != 1 {
				return fmt.Errorf("%w: ranges[%d][%d].subnet: %s must be the only range of its range set; put other ranges in a range set of their own", ErrInvalidRange, i, j, placeholderName(r.PodCIDR))
			}
			if seen[r.PodCIDR] {
				return fmt.Errorf("%w: ranges[%d][%d].subnet: %s appears in two range sets; a node has one podCIDR per family", ErrInvalidRange, i, j, placeholderName(r.PodCIDR))
			}
			seen[r.PodCIDR] = true
		}
	}
	return nil
}

func placeholderName(family int) string {
	if family == 6 {
		return PodCIDRv6
	}
	return PodCIDRv4
}

// Resolve returns sets with each placeholder replaced by the range of the whole
// podCIDR of its family (the first of that family in podCIDRs: Kubernetes gives a
// Node at most one per family), validated as a pool. A family no podCIDR has fails
// with ErrNoPodCIDR. Sets without placeholders come back unchanged.
func Resolve(sets []RangeSet, podCIDRs []netip.Prefix) ([]RangeSet, error) {
	if !HasPodCIDR(sets) {
		return sets, nil
	}
	out := make([]RangeSet, len(sets))
	for i, set := range sets {
		if len(set) != 1 || set[0].PodCIDR == 0 {
			out[i] = set
			continue
		}
		fam := set[0].PodCIDR
		var found netip.Prefix
		for _, p := range podCIDRs {
			if p.Addr().Unmap().Is4() == (fam == 4) {
				found = p
				break
			}
		}
		if !found.IsValid() {
			return nil, fmt.Errorf("%w: ranges[%d][0].subnet: %s, and the node has no IPv%d podCIDR", ErrNoPodCIDR, i, placeholderName(fam), fam)
		}
		r, err := Range{Subnet: found.Masked()}.Canonical(fmt.Sprintf("ranges[%d][0] (podCIDR %s)", i, found))
		if err != nil {
			return nil, err
		}
		out[i] = RangeSet{r}
	}
	if err := Validate(out); err != nil {
		return nil, err
	}
	return out, nil
}

func parseAddr(s, field string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, nil
	}
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%w: %s: %q is not an IP address", ErrInvalidRange, field, s)
	}
	return a.Unmap(), nil
}

func parseRange(rr rawRange, field string) (Range, error) {
	var r Range
	switch strings.TrimSpace(rr.Subnet) {
	case PodCIDRv4, PodCIDRv6:
		r.PodCIDR = 4
		if strings.TrimSpace(rr.Subnet) == PodCIDRv6 {
			r.PodCIDR = 6
		}
		if rr.RangeStart != "" || rr.RangeEnd != "" || rr.Gateway != "" {
			return r, fmt.Errorf("%w: %s: subnet %s takes no rangeStart, rangeEnd or gateway (the whole podCIDR is the range); drop them, or give the subnet as a CIDR", ErrInvalidRange, field, rr.Subnet)
		}
		return r, nil
	}
	if rr.Subnet == "" {
		return r, fmt.Errorf("%w: %s.subnet: missing; give a CIDR such as \"10.0.0.0/24\"", ErrInvalidRange, field)
	}
	p, err := netip.ParsePrefix(strings.TrimSpace(rr.Subnet))
	if err != nil {
		return r, fmt.Errorf("%w: %s.subnet: %q is not a CIDR (want e.g. \"10.0.0.0/24\")", ErrInvalidRange, field, rr.Subnet)
	}
	r.Subnet = p
	if r.RangeStart, err = parseAddr(rr.RangeStart, field+".rangeStart"); err != nil {
		return r, err
	}
	if r.RangeEnd, err = parseAddr(rr.RangeEnd, field+".rangeEnd"); err != nil {
		return r, err
	}
	if r.Gateway, err = parseAddr(rr.Gateway, field+".gateway"); err != nil {
		return r, err
	}
	return r.Canonical(field)
}

// Canonical checks r and fills in its defaults. field names r in errors.
func (r Range) Canonical(field string) (Range, error) {
	p := r.Subnet
	if !p.IsValid() {
		return r, fmt.Errorf("%w: %s.subnet: missing", ErrInvalidRange, field)
	}
	if p.Addr().Is4In6() {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	if p.Masked() != p {
		return r, fmt.Errorf("%w: %s.subnet: %s has host bits set; use %s", ErrInvalidRange, field, p, p.Masked())
	}
	bits := p.Addr().BitLen()
	if bits-p.Bits() < 2 {
		return r, fmt.Errorf("%w: %s.subnet: %s is too small to allocate from; use at least a /%d", ErrInvalidRange, field, p, bits-2)
	}
	r.Subnet = p
	first := p.Addr().Next()
	last := lastAddr(p)
	if p.Addr().Is4() {
		last = last.Prev() // broadcast
	}
	for _, a := range []struct {
		addr *netip.Addr
		name string
	}{{&r.RangeStart, "rangeStart"}, {&r.RangeEnd, "rangeEnd"}, {&r.Gateway, "gateway"}} {
		if a.addr.IsValid() && a.addr.Is4() != p.Addr().Is4() {
			return r, fmt.Errorf("%w: %s.%s: %s is not of the subnet's address family (%s)", ErrInvalidRange, field, a.name, *a.addr, p)
		}
	}
	if !r.RangeStart.IsValid() {
		r.RangeStart = first
	}
	if !r.RangeEnd.IsValid() {
		r.RangeEnd = last
	}
	if r.RangeStart.Less(first) || last.Less(r.RangeStart) {
		return r, fmt.Errorf("%w: %s.rangeStart: %s is outside the usable addresses of %s (%s-%s)", ErrInvalidRange, field, r.RangeStart, p, first, last)
	}
	if r.RangeEnd.Less(first) || last.Less(r.RangeEnd) {
		return r, fmt.Errorf("%w: %s.rangeEnd: %s is outside the usable addresses of %s (%s-%s)", ErrInvalidRange, field, r.RangeEnd, p, first, last)
	}
	if r.RangeEnd.Less(r.RangeStart) {
		return r, fmt.Errorf("%w: %s: rangeEnd %s is before rangeStart %s", ErrInvalidRange, field, r.RangeEnd, r.RangeStart)
	}
	if !r.Gateway.IsValid() {
		// host-local's documented default: the gateway is the subnet's first address,
		// reserved so that a bridge acting as gateway never clashes with a pod.
		r.Gateway = first
	}
	if !p.Contains(r.Gateway) {
		return r, fmt.Errorf("%w: %s.gateway: %s is not in subnet %s", ErrInvalidRange, field, r.Gateway, p)
	}
	return r, nil
}

// Limits on a pool's ranges: real configs have one or two range sets of a few
// ranges. They keep a pool's record (and a lease, one address per range set) far
// below the store's record limit.
const (
	MaxRangeSets = 16
	MaxRanges    = 256 // in all range sets together
)

// Validate checks that the pool has 1 to MaxRangeSets range sets and at most
// MaxRanges ranges, every range set non-empty and of one family, every range in
// canonical form (as Range.Canonical returns it), and that no two ranges of the pool
// overlap. It runs in O(n log n) for n ranges (it sorts, then sweeps once), so a
// crafted ranges list cannot make it slow.
func Validate(sets []RangeSet) error {
	if len(sets) == 0 {
		return fmt.Errorf("%w: ranges: empty; give at least one range set", ErrInvalidRange)
	}
	if len(sets) > MaxRangeSets {
		return fmt.Errorf("%w: ranges: %d range sets; at most %d (one per address family is usual)", ErrInvalidRange, len(sets), MaxRangeSets)
	}
	type span struct {
		lo, hi netip.Addr
		i, j   int
	}
	n := 0
	for i, set := range sets {
		if len(set) == 0 {
			return fmt.Errorf("%w: ranges[%d]: empty range set", ErrInvalidRange, i)
		}
		for j, r := range set {
			if r.PodCIDR != 0 {
				return fmt.Errorf("%w: ranges[%d][%d].subnet: %s is resolved by ipledgerd from its Node's spec.podCIDRs; run ipledgerd with --node-name (and Kubernetes credentials)", ErrInvalidRange, i, j, placeholderName(r.PodCIDR))
			}
		}
		n += len(set)
	}
	if n > MaxRanges {
		return fmt.Errorf("%w: ranges: %d ranges; at most %d in all range sets together", ErrInvalidRange, n, MaxRanges)
	}
	all := make([]span, 0, n)
	for i, set := range sets {
		v4 := set[0].Subnet.Addr().Is4()
		for j, r := range set {
			field := func() string { return fmt.Sprintf("ranges[%d][%d]", i, j) }
			if r.Subnet.Addr().Is4() != v4 {
				return fmt.Errorf("%w: %s.subnet: %s mixes address families in one range set; put IPv4 and IPv6 ranges in separate range sets", ErrInvalidRange, field(), r.Subnet)
			}
			c, err := r.Canonical("")
			if err != nil {
				_, err = r.Canonical(field())
				return err
			}
			if c != r {
				return fmt.Errorf("%w: %s: %+v is not in canonical form (want %+v)", ErrInvalidRange, field(), r, c)
			}
			all = append(all, span{r.RangeStart, r.RangeEnd, i, j})
		}
	}
	// Sorted by start, a range overlaps an earlier one exactly when it starts at or
	// before the furthest end seen so far (IPv4 sorts before IPv6, so families never
	// meet).
	sort.Slice(all, func(a, b int) bool { return all[a].lo.Less(all[b].lo) })
	far := -1
	for k, s := range all {
		if far >= 0 && all[far].lo.BitLen() == s.lo.BitLen() && !all[far].hi.Less(s.lo) {
			a, b := all[far], s
			if b.i < a.i || b.i == a.i && b.j < a.j {
				a, b = b, a
			}
			return fmt.Errorf("%w: ranges[%d][%d]: %s-%s overlaps ranges[%d][%d] (%s-%s); ranges of a pool must not overlap", ErrInvalidRange, b.i, b.j, b.lo, b.hi, a.i, a.j, a.lo, a.hi)
		}
		if far < 0 || all[far].lo.BitLen() != s.lo.BitLen() || all[far].hi.Less(s.hi) {
			far = k
		}
	}
	return nil
}

// Equal reports whether two pools have the same canonical ranges.
func Equal(a, b []RangeSet) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if a[i][j] != b[i][j] {
				return false
			}
		}
	}
	return true
}

// Size is the number of addresses from rangeStart to rangeEnd, saturating at MaxUint64.
func (r Range) Size() uint64 {
	return diff(r.RangeEnd, r.RangeStart).addOne()
}

// Size is the number of addresses in the set, saturating at MaxUint64 (the gateway is
// counted; Reserved tells it apart).
func (s RangeSet) Size() uint64 {
	var n uint64
	for _, r := range s {
		sz := r.Size()
		if n > math.MaxUint64-sz {
			return math.MaxUint64
		}
		n += sz
	}
	return n
}

// Addr returns the address at offset off of the set, or false past its end.
func (s RangeSet) Addr(off uint64) (netip.Addr, bool) {
	for _, r := range s {
		sz := r.Size()
		if off < sz {
			return add(r.RangeStart, off), true
		}
		off -= sz
	}
	return netip.Addr{}, false
}

// Offset returns the offset of a in the set, or false if a is not in it.
func (s RangeSet) Offset(a netip.Addr) (uint64, bool) {
	var base uint64
	for _, r := range s {
		if a.Is4() == r.RangeStart.Is4() && !a.Less(r.RangeStart) && !r.RangeEnd.Less(a) {
			return base + diff(a, r.RangeStart).lo, true
		}
		base += r.Size()
	}
	return 0, false
}

// Contains reports whether a is one of the set's addresses.
func (s RangeSet) Contains(a netip.Addr) bool {
	_, ok := s.Offset(a)
	return ok
}

// Reserved reports whether a is a gateway of the set, never handed out.
func (s RangeSet) Reserved(a netip.Addr) bool {
	for _, r := range s {
		if r.Gateway == a {
			return true
		}
	}
	return false
}

// RangeOf returns the range holding a.
func (s RangeSet) RangeOf(a netip.Addr) (Range, bool) {
	for _, r := range s {
		if a.Is4() == r.RangeStart.Is4() && !a.Less(r.RangeStart) && !r.RangeEnd.Less(a) {
			return r, true
		}
	}
	return Range{}, false
}

// String prints the set as its ranges, for messages.
func (s RangeSet) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		parts[i] = fmt.Sprintf("%s(%s-%s)", r.Subnet, r.RangeStart, r.RangeEnd)
	}
	return strings.Join(parts, ",")
}

// SetsString prints range sets as [[set] [set] ...], for messages.
func SetsString(sets []RangeSet) string {
	parts := make([]string, len(sets))
	for i, set := range sets {
		parts[i] = "[" + set.String() + "]"
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// u128 is a 128-bit unsigned integer for address arithmetic.
type u128 struct{ hi, lo uint64 }

func toU128(a netip.Addr) u128 {
	b := a.As16()
	var v u128
	for i := 0; i < 8; i++ {
		v.hi = v.hi<<8 | uint64(b[i])
		v.lo = v.lo<<8 | uint64(b[i+8])
	}
	return v
}

func fromU128(v u128, is4 bool) netip.Addr {
	var b [16]byte
	for i := 7; i >= 0; i-- {
		b[i] = byte(v.hi)
		b[i+8] = byte(v.lo)
		v.hi >>= 8
		v.lo >>= 8
	}
	a := netip.AddrFrom16(b)
	if is4 {
		return a.Unmap()
	}
	return a
}

// diff returns a-b for a >= b.
func diff(a, b netip.Addr) u128 {
	x, y := toU128(a), toU128(b)
	lo := x.lo - y.lo
	borrow := uint64(0)
	if x.lo < y.lo {
		borrow = 1
	}
	return u128{x.hi - y.hi - borrow, lo}
}

// addOne returns v+1 as a uint64, saturating.
func (v u128) addOne() uint64 {
	if v.hi != 0 || v.lo == math.MaxUint64 {
		return math.MaxUint64
	}
	return v.lo + 1
}

func add(a netip.Addr, off uint64) netip.Addr {
	v := toU128(a)
	lo := v.lo + off
	if lo < v.lo {
		v.hi++
	}
	v.lo = lo
	return fromU128(v, a.Is4())
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().As16()
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	for i := bits; i < 128; i++ {
		b[i/8] |= 1 << (7 - uint(i%8))
	}
	a := netip.AddrFrom16(b)
	if p.Addr().Is4() {
		return a.Unmap()
	}
	return a
}
