package nodesenv

import (
	"net/netip"
	"testing"
)

func TestCovering(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want string
	}{
		{[]string{"10.244.0.0/16"}, "10.244.0.0/16"},
		{[]string{"10.244.0.0/16", "10.245.0.0/16"}, "10.244.0.0/15"},
		{[]string{"10.244.0.0/16", "10.244.7.0/24"}, "10.244.0.0/16"},
		{[]string{"10.244.7.0/24", "10.244.0.0/16"}, "10.244.0.0/16"},
		{[]string{"10.244.0.0/16", "10.250.0.0/16"}, "10.240.0.0/12"},
		{[]string{"10.244.0.0/16", "10.245.0.0/16", "10.246.0.0/24"}, "10.244.0.0/14"},
	} {
		var ps []netip.Prefix
		for _, s := range c.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		got := Covering(ps...)
		if got.String() != c.want {
			t.Errorf("Covering(%v) = %s, want %s", c.in, got, c.want)
		}
		for _, p := range ps {
			if !got.Contains(p.Addr()) || got.Bits() > p.Bits() {
				t.Errorf("Covering(%v) = %s does not cover %s", c.in, got, p)
			}
		}
	}
}

// The cluster-mode conformance run's second pool must be a pool the agents
// accept beside deploy/cluster's: no overlap.
func TestSecondPoolBesideClusterPool(t *testing.T) {
	if SecondPool.Overlaps(ClusterPool) {
		t.Fatalf("SecondPool %s overlaps ClusterPool %s: pools must not overlap", SecondPool, ClusterPool)
	}
}
