package cluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// TestLeaseNodes: the node list of the etcd datastore is the nodes with a live
// lease and the addresses they published with it; a node whose lease expires
// leaves it (and Changed says so); a failed list changes nothing.
func TestLeaseNodes(t *testing.T) {
	c := newMemCluster(t)
	withAddrs := func(name string, addrs ...string) *agent {
		o := c.opts(name)
		for _, a := range addrs {
			o.Addrs = append(o.Addrs, netip.MustParseAddr(a))
		}
		return c.agentOn(name, memstore.New(), o, nil, nil)
	}
	a := withAddrs("a", "192.0.2.1", "2001:db8::1")
	b := withAddrs("b", "192.0.2.2")
	withAddrs("c") // an agent that publishes no address (an older release)
	ctx := context.Background()
	ln := a.m.LeaseNodes(time.Second)
	if ln.Synced() {
		t.Fatal("synced before the first list")
	}
	changed := func(want bool) {
		t.Helper()
		select {
		case <-ln.Changed():
			if !want {
				t.Fatal("Changed fired with nothing changed")
			}
		default:
			if want {
				t.Fatal("Changed did not fire")
			}
		}
	}
	want := func(nodes ...nodenet.Node) {
		t.Helper()
		if got := ln.Nodes(); fmt.Sprint(got) != fmt.Sprint(nodes) {
			t.Fatalf("Nodes() = %v, want %v", got, nodes)
		}
	}
	na := nodenet.Node{Name: "a", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")}}
	nb := nodenet.Node{Name: "b", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.2")}}
	nc := nodenet.Node{Name: "c"}
	if !ln.Refresh(ctx) || !ln.Synced() {
		t.Fatal("the first list failed")
	}
	changed(true)
	want(na, nb, nc)
	ln.Refresh(ctx)
	changed(false)

	// b renews; a and c stop: past the TTL, b alone (with a) is listed
	for range 3 {
		c.clk.Advance(ttl / 3)
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := b.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}
	c.clk.Advance(time.Second)
	ln.Refresh(ctx)
	changed(true)
	want(na, nb)

	// the datastore cut off: the list stands, b's expiry counts again from the
	// list after
	a.ds.cut.Store(true)
	if ln.Refresh(ctx) {
		t.Fatal("a list through a cut connection succeeded")
	}
	changed(false)
	want(na, nb)
	a.ds.cut.Store(false)
	c.clk.Advance(ttl / 2)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	ln.Refresh(ctx)
	want(na, nb)
	c.clk.Advance(ttl)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	ln.Refresh(ctx)
	changed(true)
	want(na)
}

// TestLeaseNodesKeepBlockOwners: a node whose agent stopped cleanly (its lease
// released, as at every DaemonSet rollout) or died stays in the node list, with the
// addresses it published last, for as long as it owns a block, past the lease's
// TTL: its running pods stay routed. Once its blocks are reclaimed it owns none and
// leaves the list. While the owners cannot be read, it is kept.
func TestLeaseNodesKeepBlockOwners(t *testing.T) {
	c := newMemCluster(t)
	withAddrs := func(name, addr string, r []pool.RangeSet, bits []int) *agent {
		o := c.opts(name)
		o.Addrs = []netip.Addr{netip.MustParseAddr(addr)}
		return c.agentOn(name, memstore.New(), o, r, bits)
	}
	a := withAddrs("a", "192.0.2.1", nil, nil)
	b := withAddrs("b", "192.0.2.2", ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`), []int{28})
	d := withAddrs("d", "192.0.2.4", nil, nil) // owns no block
	blk := mustClaim(t, b)
	ctx := context.Background()
	ln := a.m.LeaseNodes(time.Second)
	want := func(what string, nodes ...string) {
		t.Helper()
		ln.Refresh(ctx)
		if got := fmt.Sprint(ln.Nodes()); got != fmt.Sprint(nodes) {
			t.Fatalf("%s: Nodes() = %s, want %s", what, got, nodes)
		}
	}
	nb := "{b [192.0.2.2] []}"
	want("every lease live", "{a [192.0.2.1] []}", nb, "{d [192.0.2.4] []}")
	if err := b.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	want("b and d stopped cleanly", "{a [192.0.2.1] []}", nb)
	for range 2 {
		c.clk.Advance(ttl)
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}
	want("b's lease gone for two TTLs", "{a [192.0.2.1] []}", nb)

	// the quarantine over, a reclaims b's block: b owns none and leaves the list
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
	want("b's block reclaimed", "{a [192.0.2.1] []}")
}

// TestLeaseNodesKeepWhenOwnersUnknown: a node without a live lease is not dropped
// on a failed read of the blocks' owners.
func TestLeaseNodesKeepWhenOwnersUnknown(t *testing.T) {
	c := newMemCluster(t)
	o := c.opts("a")
	o.Addrs = []netip.Addr{netip.MustParseAddr("192.0.2.1")}
	a := c.agentOn("a", memstore.New(), o, nil, nil)
	o = c.opts("b")
	o.Addrs = []netip.Addr{netip.MustParseAddr("192.0.2.2")}
	b := c.agentOn("b", memstore.New(), o, nil, nil)
	ctx := context.Background()
	ln := a.m.LeaseNodes(time.Second)
	ln.Refresh(ctx)
	if err := b.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// the leases listed, the blocks not: a's block LIST fails
	a.ds.failLists.Store(true)
	if !ln.Refresh(ctx) {
		t.Fatal("the leases' list failed")
	}
	if got := fmt.Sprint(ln.Nodes()); got != "[{a [192.0.2.1] []} {b [192.0.2.2] []}]" {
		t.Fatalf("Nodes() with the owners unknown: %s, want b kept", got)
	}
	a.ds.failLists.Store(false)
	ln.Refresh(ctx)
	if got := fmt.Sprint(ln.Nodes()); got != "[{a [192.0.2.1] []}]" {
		t.Fatalf("Nodes() once the owners are known (b owns no block): %s", got)
	}
}
