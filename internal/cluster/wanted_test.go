package cluster_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// A pod's own address (ipledger.io/ip) outside the node's blocks: its block is
// claimed by one compare-and-swap when never claimed or free, and the address is
// the pod's; an address in a block another node owns is refused naming the owner,
// and nothing changes (block records, the node's leases).
func TestWantedAddressClaimsItsBlock(t *testing.T) { forBackends(t, testWantedAddressClaimsItsBlock) }

func testWantedAddressClaimsItsBlock(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("node-a", ranges(t, v4), []int{26})
	b := c.agent("node-b", ranges(t, v4), []int{26})
	a.mustAlloc(t, "a0") // node-a's first block
	aBlock := a.l.Blocks("net")[0].Prefix
	free := netip.MustParsePrefix("10.20.0.128/26")
	if _, err := c.ds.Create(ctx, cluster.BlockKey("net", free), mustJSON(t, cluster.BlockRecord{Network: "net", CIDR: free, Set: 0, Epoch: 3})); err != nil {
		t.Fatal(err)
	}
	want := func(cid, addr string) (ledger.Lease, error) {
		ls, _, err := b.m.Allocate(ctx, ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, Want: []netip.Addr{netip.MustParseAddr(addr)}, Why: "requested by ipledger.io/ip"})
		return ls, err
	}
	for _, tc := range []struct{ addr, block string }{{"10.20.0.200", "10.20.0.192/26"}, {"10.20.0.130", "10.20.0.128/26"}} {
		ls, err := want("b-"+tc.addr, tc.addr)
		if err != nil || ls.IPs[0].Addr().String() != tc.addr {
			t.Fatalf("node-b asks for %s: %+v %v", tc.addr, ls, err)
		}
		if rec := blockRec(t, c.ds, tc.block); rec.Owner != "node-b" {
			t.Fatalf("block %s: %+v, want node-b's", tc.block, rec)
		}
	}
	if rec := blockRec(t, c.ds, "10.20.0.128/26"); rec.Epoch != 4 {
		t.Fatalf("the free block was taken at epoch %d, want 4 (one CAS on epoch 3)", rec.Epoch)
	}
	before, _, err := c.ds.List(ctx, cluster.BlocksPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	leases := len(b.l.Leases(""))
	_, err = want("b-taken", "10.20.0.10")
	if !errors.Is(err, ledger.ErrAddressUnavailable) || !errors.Is(err, cluster.ErrBlockOwned) ||
		!strings.Contains(err.Error(), fmt.Sprintf("10.20.0.10 is in block %s, which node node-a owns", aBlock)) {
		t.Fatalf("address of node-a's block: %v, want ErrBlockOwned naming node-a", err)
	}
	after, _, err := c.ds.List(ctx, cluster.BlocksPrefix(""))
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(after) != fmt.Sprint(before) || len(b.l.Leases("")) != leases {
		t.Fatalf("the refusal changed something: blocks %v -> %v, leases %d -> %d", before, after, leases, len(b.l.Leases("")))
	}
}
