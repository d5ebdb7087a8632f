package pool

import (
	"fmt"
	"net/netip"
	"testing"
)

// Blocks are carved in address order, only where the ranges have a usable address,
// jumping over the space between ranges; Clip cuts a set to a block.
func TestNextBlockAndClip(t *testing.T) {
	cases := []struct {
		ranges string
		bits   int
		want   string // every block, then usable addresses of each
	}{
		{`[[{"subnet":"10.0.0.0/24"}]]`, 26, "[10.0.0.0/26:62 10.0.0.64/26:64 10.0.0.128/26:64 10.0.0.192/26:63]"},
		{`[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.70","rangeEnd":"10.0.0.130"}]]`, 26, "[10.0.0.64/26:58 10.0.0.128/26:3]"},
		{`[[{"subnet":"10.0.0.0/30"},{"subnet":"10.9.0.0/29"}]]`, 29, "[10.0.0.0/29:1 10.9.0.0/29:5]"},
		{`[[{"subnet":"10.0.0.0/30","gateway":"10.0.0.2"}]]`, 30, "[10.0.0.0/30:1]"},
		{`[[{"subnet":"fd00::/120"}]]`, 122, "[fd00::/122:62 fd00::40/122:64 fd00::80/122:64 fd00::c0/122:64]"},
	}
	for _, tc := range cases {
		sets, err := ParseRangeSets([]byte(tc.ranges))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		var from netip.Addr
		for i := 0; i < 100; i++ {
			p, ok := sets[0].NextBlock(tc.bits, from)
			if !ok {
				break
			}
			got = append(got, fmt.Sprintf("%s:%d", p, sets[0].Clip(p).Usable()))
			from = LastAddr(p).Next()
		}
		if fmt.Sprint(got) != tc.want {
			t.Errorf("%s /%d: blocks %v, want %s", tc.ranges, tc.bits, got, tc.want)
		}
	}
}

func TestCheckBlockBits(t *testing.T) {
	sets, _ := ParseRangeSets([]byte(`[[{"subnet":"10.0.0.0/16"}],[{"subnet":"fd00::/64"}]]`))
	for _, c := range []struct {
		set, bits int
		ok        bool
	}{{0, 26, true}, {0, 16, true}, {0, 30, true}, {0, 31, false}, {0, 15, false}, {1, 122, true}, {1, 127, false}, {1, 26, false}} {
		if err := sets[c.set].CheckBlockBits(c.bits, "blockSize"); (err == nil) != c.ok {
			t.Errorf("set %d /%d: %v", c.set, c.bits, err)
		}
	}
}
