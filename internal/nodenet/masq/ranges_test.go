package masq

import (
	"net/netip"
	"slices"
	"testing"
)

func TestRanges(t *testing.T) {
	tests := []struct {
		name string
		in   []string
		v4   bool
		want []string // what reads back, as prefixes
		// elems is the number of set elements written
		elems int
	}{
		{"adjacent merge", []string{"10.244.1.0/24", "10.244.0.0/24"}, true, []string{"10.244.0.0/23"}, 2},
		{"nested and duplicate", []string{"10.0.0.0/8", "10.244.0.0/16", "10.0.0.0/8"}, true, []string{"10.0.0.0/8"}, 2},
		{"disjoint, unaligned union", []string{"10.0.1.0/24", "10.0.2.0/24", "192.168.0.0/16"}, true, []string{"10.0.1.0/24", "10.0.2.0/24", "192.168.0.0/16"}, 4},
		{"top of the space has no end element", []string{"255.255.255.0/24", "10.0.0.0/8"}, true, []string{"10.0.0.0/8", "255.255.255.0/24"}, 3},
		{"the whole space", []string{"0.0.0.0/0"}, true, []string{"0.0.0.0/0"}, 1},
		{"other family and invalid ignored", []string{"fd00::/8", "10.1.2.3/32"}, true, []string{"10.1.2.3/32"}, 2},
		{"IPv6", []string{"fd00:244::/64", "fd00:244:0:1::/64", "ffff::/16"}, false, []string{"fd00:244::/63", "ffff::/16"}, 3},
		{"empty", nil, true, nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var in []netip.Prefix
			for _, s := range tt.in {
				in = append(in, netip.MustParsePrefix(s))
			}
			in = append(in, netip.Prefix{})
			elems := elements(mergeRanges(in, tt.v4))
			if len(elems) != tt.elems {
				t.Errorf("%d elements, want %d", len(elems), tt.elems)
			}
			// Elements come back from the kernel in any order.
			slices.Reverse(elems)
			var got []string
			for _, r := range rangesOf(elems, tt.v4) {
				for _, p := range r.prefixes() {
					got = append(got, p.String())
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("read back %v, want %v", got, tt.want)
			}
		})
	}
}
