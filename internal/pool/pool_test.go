package pool

import (
	"errors"
	"math"
	"net/netip"
	"strings"
	"testing"
)

func TestParseRangeSets(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantErr  string // substring naming the field; empty for success
		sizes    []uint64
		first    []string
		last     []string
		reserved string
	}{
		{name: "v4 defaults", in: `[[{"subnet":"10.1.0.0/24"}]]`, sizes: []uint64{254}, first: []string{"10.1.0.1"}, last: []string{"10.1.0.254"}, reserved: "10.1.0.1"},
		{name: "v6 defaults", in: `[[{"subnet":"fd00::/120"}]]`, sizes: []uint64{255}, first: []string{"fd00::1"}, last: []string{"fd00::ff"}},
		{name: "v6 /64 saturates", in: `[[{"subnet":"fd00::/64"}]]`, sizes: []uint64{math.MaxUint64}, first: []string{"fd00::1"}},
		{name: "start end gateway", in: `[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20","gateway":"10.1.0.10"}]]`, sizes: []uint64{11}, first: []string{"10.1.0.10"}, last: []string{"10.1.0.20"}, reserved: "10.1.0.10"},
		{name: "multi range and dual stack", in: `[[{"subnet":"10.1.0.0/30"},{"subnet":"10.2.0.0/30"}],[{"subnet":"fd00::/126"}]]`, sizes: []uint64{4, 3}, first: []string{"10.1.0.1", "fd00::1"}, last: []string{"10.2.0.2", "fd00::3"}},
		{name: "not json", in: `{`, wantErr: "ranges:"},
		{name: "empty", in: `[]`, wantErr: "ranges: empty"},
		{name: "empty set", in: `[[]]`, wantErr: "ranges[0]: empty"},
		{name: "missing subnet", in: `[[{"rangeStart":"10.0.0.1"}]]`, wantErr: "ranges[0][0].subnet: missing"},
		{name: "bad cidr", in: `[[{"subnet":"10.0.0.0/33"}]]`, wantErr: "ranges[0][0].subnet: \"10.0.0.0/33\" is not a CIDR"},
		{name: "host bits", in: `[[{"subnet":"10.0.0.1/24"}]]`, wantErr: "host bits set; use 10.0.0.0/24"},
		{name: "too small", in: `[[{"subnet":"10.0.0.0/31"}]]`, wantErr: "too small"},
		{name: "start outside", in: `[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.1.1"}]]`, wantErr: "ranges[0][0].rangeStart"},
		{name: "start is network", in: `[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.0"}]]`, wantErr: "rangeStart"},
		{name: "end is broadcast", in: `[[{"subnet":"10.0.0.0/24","rangeEnd":"10.0.0.255"}]]`, wantErr: "rangeEnd"},
		{name: "end before start", in: `[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.9","rangeEnd":"10.0.0.5"}]]`, wantErr: "before rangeStart"},
		{name: "bad gateway", in: `[[{"subnet":"10.0.0.0/24","gateway":"10.9.0.1"}]]`, wantErr: "gateway: 10.9.0.1 is not in subnet"},
		{name: "gateway family", in: `[[{"subnet":"10.0.0.0/24","gateway":"fd00::1"}]]`, wantErr: "gateway"},
		{name: "bad addr", in: `[[{"subnet":"10.0.0.0/24","rangeStart":"ten"}]]`, wantErr: "rangeStart: \"ten\" is not an IP address"},
		{name: "overlap", in: `[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.0.0.0/25"}]]`, wantErr: "overlaps ranges[0][0]"},
		{name: "mixed family", in: `[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]`, wantErr: "mixes address families"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sets, err := ParseRangeSets([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.Is(err, ErrInvalidRange) {
					t.Fatalf("err = %v, want ErrInvalidRange containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, set := range sets {
				if got := set.Size(); got != tt.sizes[i] {
					t.Errorf("set %d size = %d, want %d", i, got, tt.sizes[i])
				}
				a, ok := set.Addr(0)
				if !ok || a.String() != tt.first[i] {
					t.Errorf("set %d first = %v, want %s", i, a, tt.first[i])
				}
				if tt.last != nil {
					a, ok := set.Addr(set.Size() - 1)
					if !ok || a.String() != tt.last[i] {
						t.Errorf("set %d last = %v, want %s", i, a, tt.last[i])
					}
					if _, ok := set.Addr(set.Size()); ok {
						t.Errorf("set %d: Addr past end succeeded", i)
					}
				}
			}
			if tt.reserved != "" && !sets[0].Reserved(netip.MustParseAddr(tt.reserved)) {
				t.Errorf("gateway %s not reserved", tt.reserved)
			}
		})
	}
}

func TestOffsetRoundTrip(t *testing.T) {
	sets, err := ParseRangeSets([]byte(`[[{"subnet":"10.1.0.0/29"},{"subnet":"10.3.0.0/30"}],[{"subnet":"fd00::/125"}]]`))
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range sets {
		for off := uint64(0); off < set.Size(); off++ {
			a, ok := set.Addr(off)
			if !ok {
				t.Fatalf("Addr(%d) failed", off)
			}
			back, ok := set.Offset(a)
			if !ok || back != off {
				t.Fatalf("Offset(%s) = %d,%v want %d", a, back, ok, off)
			}
		}
	}
	if sets[0].Contains(netip.MustParseAddr("10.1.0.7")) {
		t.Error("broadcast 10.1.0.7 counted as usable")
	}
	if sets[0].Contains(netip.MustParseAddr("fd00::1")) {
		t.Error("v6 address in v4 set")
	}
}

// FuzzParseRangeSets: any input either parses into sets whose every address round-trips
// and lies in its subnet, or fails with ErrInvalidRange; it never panics.
func FuzzParseRangeSets(f *testing.F) {
	for _, s := range []string{
		`[[{"subnet":"10.1.0.0/24"}]]`,
		`[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.10","rangeEnd":"10.1.0.20","gateway":"10.1.0.1"}]]`,
		`[[{"subnet":"fd00::/64"}],[{"subnet":"10.0.0.0/16"}]]`,
		`[[{"subnet":"::ffff:10.0.0.0/120"}]]`,
		`[[{"subnet":"10.0.0.0/8","rangeEnd":"10.0.0.1"}]]`,
		`[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`,
		`[[{"subnet":"usePodCidr"}],[{"subnet":"fd00::/64"}]]`,
	} {
		f.Add([]byte(s))
	}
	podCIDRs := []netip.Prefix{netip.MustParsePrefix("10.244.3.0/24"), netip.MustParsePrefix("fd00:244:3::/64")}
	f.Fuzz(func(t *testing.T, data []byte) {
		sets, err := ParseRangeSets(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidRange) {
				t.Fatalf("error not ErrInvalidRange: %v", err)
			}
			return
		}
		if HasPodCIDR(sets) {
			if Validate(sets) == nil {
				t.Fatal("Validate accepted a placeholder")
			}
			if sets, err = Resolve(sets, podCIDRs); err != nil {
				return // the podCIDRs overlap a concrete range: refused, as it must be
			}
			if HasPodCIDR(sets) {
				t.Fatal("Resolve left a placeholder")
			}
		}
		for _, set := range sets {
			n := set.Size()
			if n == 0 {
				t.Fatal("empty set accepted")
			}
			for _, off := range []uint64{0, n / 2, n - 1} {
				a, ok := set.Addr(off)
				if !ok {
					t.Fatalf("Addr(%d) of %d failed", off, n)
				}
				r, ok := set.RangeOf(a)
				if !ok || !r.Subnet.Contains(a) {
					t.Fatalf("%s not in its range", a)
				}
				if n < math.MaxUint64 {
					back, ok := set.Offset(a)
					if !ok || back != off {
						t.Fatalf("Offset(%s)=%d want %d", a, back, off)
					}
				}
			}
		}
	})
}
