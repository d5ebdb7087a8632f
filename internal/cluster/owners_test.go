package cluster_test

import (
	"context"
	"testing"
	"time"
)

// TestWatchOwnersSeesOtherNetworks: a node that has not set up a network (no pod of
// it yet) hears at once that another node claimed a block of it, so its node
// network routes the block without waiting for its resync.
func TestWatchOwnersSeesOtherNetworks(t *testing.T) {
	c := newMemCluster(t)
	a := c.agent("a", nil, nil)
	b := c.agent("b", ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`), []int{28})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.m.WatchOwners(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	changed := func(what string) {
		t.Helper()
		select {
		case <-a.m.BlocksChanged():
		case <-time.After(10 * time.Second):
			t.Fatalf("no BlocksChanged within 10s: %s", what)
		}
	}
	changed("the watch running")
	p := mustClaim(t, b)
	changed("b claimed " + p.String())
	owners, err := a.m.Owners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range owners {
		if o.Prefix == p && o.Owner == "b" {
			return
		}
	}
	t.Fatalf("a's Owners %v: no block %s of b", owners, p)
}
