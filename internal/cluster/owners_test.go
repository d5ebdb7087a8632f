package cluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/memstore"
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

// routesSeen stands for the route reconciler: it keeps the last desired routes.
type routesSeen struct {
	mu   sync.Mutex
	last []nodenet.Route
}

func (r *routesSeen) Sync(desired []nodenet.Route) (routes.Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = desired
	return routes.Report{Unchanged: len(desired)}, nil
}

func (r *routesSeen) routes() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprint(r.last)
}

// staticNodes is a Node list that never changes.
type staticNodes []nodenet.Node

func (n staticNodes) Synced() bool             { return true }
func (n staticNodes) Nodes() []nodenet.Node    { return n }
func (n staticNodes) Changed() <-chan struct{} { return nil }

// TestNodeNetworkReadsWatchedBlocks: cluster mode's node-network controller reads
// the blocks' owners from the copy WatchOwners keeps, not with a LIST of every
// block record per reconciliation (ipledger_block_lists_total stays put through
// resyncs and another node's claim, whose route still follows at once); once that
// watch has ended, the copy is not trusted and Owners lists again.
func TestNodeNetworkReadsWatchedBlocks(t *testing.T) {
	c := newMemCluster(t)
	a := c.agent("a", nil, nil)
	b := c.agent("b", ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`), []int{28})
	mustClaim(t, b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.m.WatchOwners(ctx); close(done) }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			<-done
		}
	})
	changed := func(what string) {
		t.Helper()
		select {
		case <-a.m.BlocksChanged():
		case <-time.After(10 * time.Second):
			t.Fatalf("no BlocksChanged within 10s: %s", what)
		}
	}
	changed("the watch running")
	rt := &routesSeen{}
	nodes := staticNodes{{Name: "a", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}, {Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}}
	ctl, err := controller.New(controller.Config{Self: "a", Nodes: nodes, Blocks: a.m, Routes: rt, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	lists := a.m.Counts().BlockLists
	for range 10 {
		ctl.Reconcile(ctx)
	}
	want := "[10.0.0.0/28 via 192.0.2.2 (node b)]"
	if got := rt.routes(); got != want {
		t.Fatalf("routes after 10 reconciliations: %s, want %s", got, want)
	}
	p := mustClaim(t, b)
	changed("b claimed " + p.String())
	ctl.Reconcile(ctx)
	want = "[10.0.0.0/28 via 192.0.2.2 (node b) 10.0.0.16/28 via 192.0.2.2 (node b)]"
	if got := rt.routes(); got != want {
		t.Fatalf("routes after b claimed %s: %s, want %s", p, got, want)
	}
	if n := a.m.Counts().BlockLists - lists; n != 0 {
		t.Fatalf("%d LISTs of the blocks by 11 reconciliations with the watch running, want 0", n)
	}

	cancel()
	<-done
	stopped = true
	ctl.Reconcile(ctx)
	if n := a.m.Counts().BlockLists - lists; n != 1 {
		t.Fatalf("%d LISTs by a reconciliation after the watch ended, want 1 (the copy is no longer trusted)", n)
	}
	if got := rt.routes(); got != want {
		t.Fatalf("routes listed after the watch ended: %s, want %s", got, want)
	}
}

// TestRoutesFollowBlockOwnership: another node's agent stopped cleanly (its node
// lease released, as at each step of a DaemonSet rollout) keeps its blocks, so its
// running pods stay routed from here past the lease's TTL, with either source of
// nodes: the node leases of the etcd datastore (LeaseNodes, which keeps the node's
// last published addresses) and the Kubernetes Nodes of the Kubernetes datastore
// (whose Node object outlives the agent). The route goes only when the blocks are
// reclaimed after the quarantine.
func TestRoutesFollowBlockOwnership(t *testing.T) {
	for _, src := range []string{"etcd node leases", "kubernetes Nodes"} {
		t.Run(src, func(t *testing.T) {
			c := newMemCluster(t)
			withAddr := func(name, addr string, r []pool.RangeSet, bits []int) *agent {
				o := c.opts(name)
				o.Addrs = []netip.Addr{netip.MustParseAddr(addr)}
				return c.agentOn(name, memstore.New(), o, r, bits)
			}
			a := withAddr("a", "192.0.2.1", nil, nil)
			b := withAddr("b", "192.0.2.2", ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`), []int{28})
			blk := mustClaim(t, b)
			ctx := context.Background()
			var nodes controller.Nodes = staticNodes{{Name: "a", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1")}}, {Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}}
			refresh := func() {}
			if src == "etcd node leases" {
				ln := a.m.LeaseNodes(time.Second)
				nodes, refresh = ln, func() { ln.Refresh(ctx) }
			}
			rt := &routesSeen{}
			ctl, err := controller.New(controller.Config{Self: "a", Nodes: nodes, Blocks: a.m, Routes: rt, Resync: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			step := func() string {
				refresh()
				ctl.Reconcile(ctx)
				return rt.routes()
			}
			want := fmt.Sprintf("[%s via 192.0.2.2 (node b)]", blk)
			if got := step(); got != want {
				t.Fatalf("routes with b's agent running: %s, want %s", got, want)
			}
			if err := b.m.Stop(ctx); err != nil {
				t.Fatal(err)
			}
			if got := step(); got != want {
				t.Fatalf("routes right after b's agent stopped: %s, want %s kept", got, want)
			}
			c.clk.Advance(ttl + time.Second)
			if err := a.m.Renew(ctx); err != nil {
				t.Fatal(err)
			}
			if got := step(); got != want {
				t.Fatalf("routes a TTL after b's agent stopped: %s, want %s kept", got, want)
			}
			for i := 0; blockRec(t, c.ds, blk.String()).Owner != ""; i++ {
				if i == 20 {
					t.Fatalf("b's block %s not reclaimed after %d sweeps", blk, i)
				}
				c.clk.Advance(ttl / 3)
				if err := a.m.Renew(ctx); err != nil {
					t.Fatal(err)
				}
				if err := a.m.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if got := step(); got != "[]" {
				t.Fatalf("routes after b's block was reclaimed: %s, want none", got)
			}
		})
	}
}
