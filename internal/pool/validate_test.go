package pool

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
)

// manyRanges returns n disjoint canonical IPv4 /24 ranges, in reverse address order
// (a sort-free check would have to compare each with all before it).
func manyRanges(t testing.TB, n int) RangeSet {
	t.Helper()
	set := make(RangeSet, 0, n)
	for i := n - 1; i >= 0; i-- {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 100 + byte(i>>8), byte(i), 0}), 24)
		r, err := Range{Subnet: p}.Canonical("r")
		if err != nil {
			t.Fatal(err)
		}
		set = append(set, r)
	}
	return set
}

func canon(t *testing.T, subnet, start, end string) Range {
	t.Helper()
	r := Range{Subnet: netip.MustParsePrefix(subnet)}
	if start != "" {
		r.RangeStart = netip.MustParseAddr(start)
	}
	if end != "" {
		r.RangeEnd = netip.MustParseAddr(end)
	}
	c, err := r.Canonical("r")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestValidateOverlapAndBounds: overlaps anywhere in the pool (within a set, across
// sets, a range inside another, out of order) are found and named; non-canonical
// ranges a crafted request could carry are refused; the counts are bounded.
func TestValidateOverlapAndBounds(t *testing.T) {
	a := canon(t, "10.1.0.0/24", "10.1.0.10", "10.1.0.100")
	b := canon(t, "10.1.0.0/24", "10.1.0.101", "10.1.0.200")
	inside := canon(t, "10.1.0.0/24", "10.1.0.50", "10.1.0.60")
	touching := canon(t, "10.1.0.0/24", "10.1.0.100", "10.1.0.150")
	v6 := canon(t, "fd00::/64", "", "")
	v6b := canon(t, "fd00::/120", "", "")
	bad := a
	bad.RangeEnd = netip.MustParseAddr("10.1.0.5") // before its start
	cases := []struct {
		name string
		sets []RangeSet
		want string // substring of the error; "" for valid
	}{
		{"disjoint", []RangeSet{{a, b}, {v6}}, ""},
		{"inside, same set", []RangeSet{{a, b, inside}}, "ranges[0][2]: 10.1.0.50-10.1.0.60 overlaps ranges[0][0]"},
		{"inside, listed first", []RangeSet{{inside, b, a}}, "ranges[0][2]: 10.1.0.10-10.1.0.100 overlaps ranges[0][0]"},
		{"one shared address", []RangeSet{{a}, {touching}}, "ranges[1][0]: 10.1.0.100-10.1.0.150 overlaps ranges[0][0]"},
		{"v6 across sets", []RangeSet{{v6}, {v6b}}, "ranges[1][0]"},
		{"not canonical", []RangeSet{{bad}}, "ranges[0][0]"},
		{"too many sets", make([]RangeSet, MaxRangeSets+1), "at most 16"},
		{"too many ranges", []RangeSet{manyRanges(t, MaxRanges+1)}, "at most 256"},
		{"many ranges, disjoint", []RangeSet{manyRanges(t, MaxRanges)}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := Validate(c.sets)
			if c.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidRange) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Validate: %v, want ErrInvalidRange containing %q", err, c.want)
			}
		})
	}
}

// BenchmarkValidate shows Validate's cost growing as n log n with the number of
// ranges, listed in reverse order (compare ns/op across sizes: 4x the ranges costs
// about 4x, not 16x).
func BenchmarkValidate(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		set := manyRanges(b, n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if err := Validate([]RangeSet{set}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
