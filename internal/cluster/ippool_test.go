package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// putPool writes an IPPool's spec as an operator does (kubectl apply, etcdctl put).
func putPool(t *testing.T, ds datastore.Store, name, spec string) {
	t.Helper()
	if _, err := ds.Create(context.Background(), cluster.PoolKey(name), []byte(spec)); err != nil {
		t.Fatalf("create IPPool %s: %v", name, err)
	}
}

func labels(l map[string]string) cluster.NodeLabels {
	return func(context.Context) (map[string]string, error) { return l, nil }
}

// allocPool allocates attachment cid of network "net" from IPPool p.
func (a *agent) allocPool(p cluster.IPPool, cid string) (ledger.Lease, error) {
	ls, _, err := a.m.Allocate(context.Background(), ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, Pool: p.Name, Ranges: p.Ranges, Why: "pool " + p.Name})
	return ls, err
}

// A named pool's blocks are claimed, given back and shown like a network's: two
// nodes serving network "net" from IPPool blue each claim blue's blocks (records
// under blocks/blue/), their leases keep the key of "net", DEL returns the address
// to blue, and an empty block of blue is given back after the grace.
func TestNamedPoolBlocks(t *testing.T) { forBackends(t, testNamedPoolBlocks) }

func testNamedPoolBlocks(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	putPool(t, c.ds, "blue", `{"ranges":[[{"subnet":"10.50.0.0/24"}]],"blockSize":28}`)
	a := c.agent("node-a", ranges(t, v4), []int{26})
	b := c.agent("node-b", ranges(t, v4), []int{26})
	pa, err := a.m.EnsurePool(ctx, "blue", nil)
	if err != nil {
		t.Fatal(err)
	}
	if pa.BlockBits[0] != 28 || pa.Ranges[0][0].Subnet.String() != "10.50.0.0/24" {
		t.Fatalf("IPPool blue read as %+v, want 10.50.0.0/24 in /28 blocks", pa)
	}
	pb, err := b.m.EnsurePool(ctx, "blue", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 { // 20 addresses: two /28 blocks (the first lacks .0 and the gateway .1)
		ls, err := a.allocPool(pa, fmt.Sprint("a", i))
		if err != nil {
			t.Fatal(err)
		}
		if !netip.MustParsePrefix("10.50.0.0/24").Contains(ls.IPs[0].Addr()) || ls.Pool != "blue" || ls.Key.Network != "net" {
			t.Fatalf("lease %+v, want an address of blue under network net", ls)
		}
	}
	lb, err := b.allocPool(pb, "b0")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(a.l.Blocks("blue")); n != 2 {
		t.Fatalf("node-a holds %d blocks of blue, want 2", n)
	}
	if len(a.l.Blocks("net")) != 0 {
		t.Fatalf("node-a claimed blocks of net: %+v", a.l.Blocks("net"))
	}
	bb := b.l.Blocks("blue")
	if len(bb) != 1 || !bb[0].Prefix.Contains(lb.IPs[0].Addr()) {
		t.Fatalf("node-b blocks of blue %+v, lease %v", bb, lb.IPs)
	}
	for _, blk := range a.l.Blocks("blue") {
		if rec := blockRec(t, c.ds, blk.Prefix.String()); rec.Owner != "node-a" || rec.Network != "blue" {
			t.Fatalf("block record %+v, want node-a's block of blue", rec)
		}
		if blk.Prefix.Overlaps(bb[0].Prefix) {
			t.Fatalf("node-a's block %s and node-b's %s overlap", blk.Prefix, bb[0].Prefix)
		}
	}
	// the pool's ranges are the cluster's pod ranges too (not masqueraded)
	prs, err := a.m.PoolRanges(ctx)
	if err != nil || !containsPrefix(prs, "10.50.0.0/24") {
		t.Fatalf("PoolRanges %v %v, want blue's 10.50.0.0/24 among them", prs, err)
	}
	// DEL by the attachment's key gives the address back to blue
	for i := range 20 {
		a.release(t, fmt.Sprint("a", i))
	}
	if ps, err := a.l.Pool("blue"); err != nil || ps.InUse != 0 {
		t.Fatalf("pool blue after every DEL: %+v %v", ps, err)
	}
	for range 3 {
		for _, n := range []*agent{a, b} {
			if err := n.m.Renew(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.m.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		c.clk.Advance(time.Minute)
	}
	if n := len(a.l.Blocks("blue")); n != 1 {
		t.Fatalf("after the grace node-a holds %d blocks of blue, want its last one kept and the other given back", n)
	}
	free := 0
	bs, err := cluster.ReadBlocks(ctx, c.ds)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range bs {
		if r.Network == "blue" && r.Owner == "" {
			free++
		}
	}
	if free != 1 {
		t.Fatalf("%d free blocks of blue in the datastore, want the one given back: %+v", free, bs)
	}
}

func containsPrefix(ps []netip.Prefix, s string) bool {
	for _, p := range ps {
		if p.String() == s {
			return true
		}
	}
	return false
}

// A pool the node may not use, or that does not exist, or whose spec is bad, is
// refused with a message naming it and the fix, and nothing changes: no block
// record, no ledger pool.
func TestNamedPoolRefusals(t *testing.T) { forBackends(t, testNamedPoolRefusals) }

func testNamedPoolRefusals(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	putPool(t, c.ds, "green", `{"ranges":[[{"subnet":"10.60.0.0/24"}]],"nodeSelector":{"zone":"a"}}`)
	putPool(t, c.ds, "podcidr", `{"ranges":[[{"subnet":"usePodCidr"}]]}`)
	putPool(t, c.ds, "noranges", `{"blockSize":26}`)
	putPool(t, c.ds, "big", `{"ranges":[[{"subnet":"10.70.0.0/24"}]],"blockSize":40}`)
	putPool(t, c.ds, "overlap", `{"ranges":[[{"subnet":"10.20.0.128/25"}]]}`)
	b := c.agent("node-b", ranges(t, v4), []int{26})
	if _, err := b.alloc(t, "d0"); err != nil { // the default pool, for the overlap
		t.Fatal(err)
	}
	before, _, err := c.ds.List(ctx, cluster.BlocksPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pool   string
		labels cluster.NodeLabels
		is     error
		says   string
	}{
		{"green", labels(map[string]string{"zone": "b"}), cluster.ErrPoolNotForNode, "IPPool green selects nodes labelled zone=a; node node-b is not one (its labels: zone=b)"},
		{"green", labels(nil), cluster.ErrPoolNotForNode, "node node-b is not one (its labels: none)"},
		{"green", nil, cluster.ErrPoolNotForNode, "cannot read its Node's labels"},
		{"purple", nil, cluster.ErrNoPool, `no IPPool named "purple" exists; create it`},
		{"Bad_Name", nil, cluster.ErrBadPool, `pool name "Bad_Name": want a DNS label`},
		{"podcidr", nil, cluster.ErrBadPool, "IPPool podcidr: spec.ranges: usePodCidr"},
		{"noranges", nil, cluster.ErrBadPool, "IPPool noranges: spec.ranges is missing"},
		{"big", nil, cluster.ErrBadPool, "IPPool big: spec: invalid range: blockSize: 40 is an IPv6 prefix length"},
		{"overlap", nil, ledger.ErrPoolConflict, `IPPool overlap: `},
	} {
		_, err := b.m.EnsurePool(ctx, tc.pool, tc.labels)
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("pool %s: %v, want %v saying %q", tc.pool, err, tc.is, tc.says)
		}
		if _, err := b.l.Pool(tc.pool); !errors.Is(err, ledger.ErrUnknownNetwork) {
			t.Errorf("pool %s refused, yet the ledger has it: %v", tc.pool, err)
		}
	}
	after, _, err := c.ds.List(ctx, cluster.BlocksPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("refusals changed the block records:\n%v\n%v", before, after)
	}
	// a node the selector names is served
	a := c.agent("node-a", nil, nil)
	g, err := a.m.EnsurePool(ctx, "green", labels(map[string]string{"zone": "a", "x": "y"}))
	if err != nil {
		t.Fatal(err)
	}
	if ls, err := a.allocPool(g, "g0"); err != nil || !netip.MustParsePrefix("10.60.0.0/24").Contains(ls.IPs[0].Addr()) {
		t.Fatalf("node-a in zone a: %+v %v, want an address of green", ls, err)
	}
	// a CNI network named like an IPPool is refused (one record, one name)
	if err := a.m.EnsureNetwork(ctx, "green", ranges(t, `[[{"subnet":"10.80.0.0/24"}]]`), []int{26}); !errors.Is(err, cluster.ErrPoolMismatch) {
		t.Fatalf("network named like IPPool green: %v, want ErrPoolMismatch", err)
	}
}
