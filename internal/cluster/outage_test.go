package cluster_test

import (
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/memds"
)

// The whole datastore away for longer than lease TTL + quarantine, with leases that
// the server never expires (Kubernetes Leases; here the store's clock stands still):
// when it is back, a node that was alive all along keeps its block even when another
// agent sweeps before it has renewed. Neither could renew; an observer that could not
// look has no evidence that the other died.
func TestOutageReclaimsNoLiveNode(t *testing.T) {
	ds := memds.New(clocktest.New())
	c := newCluster(t, clocktest.New(), ds, func() datastore.Store { return ds.Open() })
	r := ranges(t, `[[{"subnet":"10.41.0.0/25"}]]`)
	a := c.agent("node-a", r, []int{26})
	b := c.agent("node-b", r, []int{26})
	a.mustAlloc(t, "pod-a")
	b.mustAlloc(t, "pod-b")
	step := func(ag *agent) {
		_ = ag.m.Renew(ctx)
		_ = ag.m.Sweep(ctx)
	}
	step(a)
	step(b)
	a.ds.cut.Store(true)
	b.ds.cut.Store(true)
	for range 10 {
		c.clk.Advance(3 * time.Second)
		step(a)
		step(b)
	}
	a.ds.cut.Store(false)
	b.ds.cut.Store(false)
	step(b) // b is back first and sweeps before a renews
	if rec := blockRec(t, ds, "10.41.0.0/26"); rec.Owner != "node-a" {
		t.Fatalf("a live node's block after a datastore outage: %+v; an observer that could not look reclaimed it", rec)
	}
	step(a)
	a.mustAlloc(t, "pod-a2")
}
