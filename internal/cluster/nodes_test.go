package cluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/nodenet"
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
