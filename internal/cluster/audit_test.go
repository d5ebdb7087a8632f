package cluster_test

import (
	"net/netip"
	"testing"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// The rules ipledgerctl cluster-audit relies on: an address held in two networks is
// held twice (doubles are keyed by address alone: DESIGN.md's invariant 1 allows no
// address held by two live attachments cluster-wide), and a lease left in a block
// its node's ledger holds lost is outside, marked Lost, naming the block and its
// new owner.
func TestAuditAddressAcrossNetworksAndLostBlocks(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/26")
	blocks := []cluster.BlockRecord{
		{Network: "net", CIDR: p, Owner: "a", Epoch: 3},
		{Network: "other", CIDR: p, Owner: "b", Epoch: 1},
	}
	lease := func(network, cid, ip string) ledger.Lease {
		return ledger.Lease{Key: ledger.Key{Network: network, ContainerID: cid, IfName: "eth0"}, IPs: []netip.Prefix{netip.MustParsePrefix(ip)}}
	}
	status := func(network string, epoch uint64, st ledger.BlockState) ledger.BlockStatus {
		return ledger.BlockStatus{BlockRecord: ledger.BlockRecord{Network: network, Prefix: p, Epoch: epoch, State: st}}
	}
	books := []cluster.NodeBooks{
		{Node: "a", Leases: []ledger.Lease{lease("net", "x", "10.0.0.5/24")}, Blocks: []ledger.BlockStatus{status("net", 3, ledger.BlockActive)}},
		{Node: "b", Leases: []ledger.Lease{lease("other", "y", "10.0.0.5/24")}, Blocks: []ledger.BlockStatus{status("other", 1, ledger.BlockActive)}},
	}
	rep := cluster.Audit(blocks, books)
	if rep.OK || len(rep.DoubleHeld) != 1 || len(rep.Outside) != 0 || len(rep.DoubleHeld[0].Holders) != 2 {
		t.Fatalf("one address in two networks: %+v, want it held twice and nothing outside", rep)
	}
	// c held 10.0.0.9 in net's block at epoch 2; a claimed the block at epoch 3
	books = append(books, cluster.NodeBooks{Node: "c", Leases: []ledger.Lease{lease("net", "z", "10.0.0.9/24")}, Blocks: []ledger.BlockStatus{status("net", 2, ledger.BlockLost)}})
	books[1].Leases = nil
	rep = cluster.Audit(blocks, books)
	if rep.OK || len(rep.DoubleHeld) != 0 || len(rep.Outside) != 1 {
		t.Fatalf("a lease in a lost block: %+v, want it outside", rep)
	}
	if o := rep.Outside[0]; !o.Lost || o.Current || o.Block != p || o.Owner != "a" || o.Node != "c" {
		t.Fatalf("outside %+v, want node c's lease marked lost in block %s owned by a", o, p)
	}
}

// A block's address lent to a node whose books hold no lease of it is a stale
// borrow, named with its block, owner, pod and borrower; a borrow the borrower
// holds, one lent to a node not audited (its books unknown) and one kept but not
// lent are not; none of them makes the audit fail.
func TestAuditStaleBorrows(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/26")
	a5, a6, a7, a8 := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.6"), netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8")
	blocks := []cluster.BlockRecord{{Network: "net", CIDR: p, Owner: "a", Epoch: 1, Borrows: []cluster.Borrow{
		{Addr: a5, For: "default/web/web-0", Node: "b"}, // held by b
		{Addr: a6, For: "default/web/web-1", Node: "b"}, // b holds no lease of it
		{Addr: a7, For: "default/web/web-2", Node: "z"}, // z not audited
		{Addr: a8, For: "default/web/web-3"},            // kept, not lent
	}}}
	books := []cluster.NodeBooks{
		{Node: "a", Blocks: []ledger.BlockStatus{{BlockRecord: ledger.BlockRecord{Network: "net", Prefix: p, Epoch: 1, State: ledger.BlockActive}}}},
		{Node: "b", Leases: []ledger.Lease{{Key: ledger.Key{Network: "net", ContainerID: "w0", IfName: "eth0"}, IPs: []netip.Prefix{netip.PrefixFrom(a5, 26)}, Borrowed: []netip.Addr{a5}}}},
	}
	rep := cluster.Audit(blocks, books)
	want := cluster.StaleBorrow{Network: "net", Block: p, Owner: "a", IP: a6, For: "default/web/web-1", Node: "b"}
	if !rep.OK || len(rep.StaleBorrows) != 1 || rep.StaleBorrows[0] != want {
		t.Fatalf("audit %+v, want OK with the one stale borrow %+v", rep, want)
	}
}
