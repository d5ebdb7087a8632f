package cluster_test

import (
	"context"
	"net/netip"
	"slices"
	"testing"
)

// TestPoolRanges: every network's ranges, whether this node set the network up
// or holds a block of it.
func TestPoolRanges(t *testing.T) {
	c := newMemCluster(t)
	a := c.agent("a", nil, nil)
	c.agent("b", ranges(t, `[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00:10::/64"}]]`), []int{28, 124})
	got, err := a.m.PoolRanges(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24"), netip.MustParsePrefix("fd00:10::/64")}
	if !slices.Equal(got, want) {
		t.Errorf("PoolRanges %v, want %v", got, want)
	}
}
