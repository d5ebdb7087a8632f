package ledgertest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
)

// testClusterRangesLive: a cluster-scoped pool's ranges change in place
// (SetClusterRanges) under live leases. A range added takes blocks at once, the
// leases and blocks stay; a draining block (DrainBlock) hands nothing out, keeps
// its leases' addresses, keeps no released address free, and leaves with
// RemoveBlock once empty, after which the range can leave the pool. Changes that
// would move a held, free or block address out of the pool, or let a block hold
// other addresses, are refused and change nothing. All of it survives a reopen.
func testClusterRangesLive(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	l, err := ledger.Open(st, ledger.Options{Clock: clk, Logger: TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	one := Ranges(t, `[[{"subnet":"10.7.0.0/26"}]]`)
	two := Ranges(t, `[[{"subnet":"10.7.0.0/26"},{"subnet":"10.7.1.0/26"}]]`)
	onlyNew := Ranges(t, `[[{"subnet":"10.7.1.0/26"}]]`)
	if err := l.DeclareCluster("net", one, []int{26}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBlock("net", pfx("10.7.0.0/26"), 1); err != nil {
		t.Fatal(err)
	}
	alloc := func(cid string) (ledger.Lease, error) {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(cid)})
		return ls, err
	}
	var held []string
	for i := range 61 { // .0, the gateway .1 and the broadcast .63 are never handed out
		if _, err := alloc(fmt.Sprint("a", i)); err != nil {
			t.Fatal(err)
		}
		held = append(held, fmt.Sprint("a", i))
	}
	if err = l.AddBlock("net", pfx("10.7.1.0/26"), 1); !errors.Is(err, ledger.ErrUnknownBlock) {
		t.Fatalf("a block outside the ranges: %v, want ErrUnknownBlock", err)
	}
	if err := l.SetClusterRanges("net", two); err != nil {
		t.Fatalf("adding a range: %v", err)
	}
	if err := l.AddBlock("net", pfx("10.7.1.0/26"), 1); err != nil {
		t.Fatalf("a block of the added range: %v", err)
	}
	ls, err := alloc("b0")
	if err != nil || !pfx("10.7.1.0/26").Contains(ls.IPs[0].Addr()) {
		t.Fatalf("after the range was added: %+v %v, want an address of 10.7.1.0/26", ls, err)
	}
	// refused, nothing changes
	for _, bad := range []struct {
		name   string
		ranges string
	}{
		{"a range removed under its block", `[[{"subnet":"10.7.1.0/26"}]]`},
		{"a range cutting a held block", `[[{"subnet":"10.7.0.0/26","rangeStart":"10.7.0.10"},{"subnet":"10.7.1.0/26"}]]`},
		{"another family", `[[{"subnet":"fd00::/120"}]]`},
		{"a second range set", `[[{"subnet":"10.7.0.0/26"},{"subnet":"10.7.1.0/26"}],[{"subnet":"fd00::/120"}]]`},
	} {
		if err := l.SetClusterRanges("net", Ranges(t, bad.ranges)); !errors.Is(err, ledger.ErrPoolConflict) {
			t.Errorf("%s: %v, want ErrPoolConflict", bad.name, err)
		}
	}
	if p, _ := l.Pool("net"); len(p.Ranges[0]) != 2 {
		t.Fatalf("pool after refused changes: %+v", p)
	}
	// drain 10.7.0.0/26: nothing more from it, its leases keep their addresses
	if err := l.DrainBlock("net", pfx("10.7.0.0/26")); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.Release(Key("a0"), ledger.ReasonDEL, ""); !ok || err != nil {
		t.Fatal(ok, err)
	}
	for _, f := range l.FreeAddresses("net") {
		if pfx("10.7.0.0/26").Contains(f.IP) {
			t.Fatalf("released address %s of a draining block kept free", f.IP)
		}
	}
	for i := range 63 {
		ls, err := alloc(fmt.Sprint("c", i))
		if err != nil {
			if capacitySet(t, err) != 0 {
				t.Fatal(err)
			}
			break
		}
		if pfx("10.7.0.0/26").Contains(ls.IPs[0].Addr()) {
			t.Fatalf("allocation %d from the draining block: %v", i, ls.IPs)
		}
	}
	if err := l.RemoveBlock("net", pfx("10.7.0.0/26")); !errors.Is(err, ledger.ErrBlockInUse) {
		t.Fatalf("removing the draining block with leases: %v, want ErrBlockInUse", err)
	}
	if err := l.SetClusterRanges("net", onlyNew); !errors.Is(err, ledger.ErrPoolConflict) {
		t.Fatalf("removing the range while its block is held: %v", err)
	}
	Audit(t, l)
	l = Open(t, reopen(), ledger.Options{Clock: clk})
	for _, b := range l.Blocks("net") {
		if b.Prefix == pfx("10.7.0.0/26") && (b.State != ledger.BlockDraining || b.Used != 60) {
			t.Fatalf("after reopen the draining block is %+v, want draining with 60 leases", b)
		}
	}
	if err := l.ResumeBlock("net", pfx("10.7.0.0/26"), 1); err != nil {
		t.Fatal(err)
	}
	for _, cid := range held[1:] {
		if _, ok, err := l.Release(Key(cid), ledger.ReasonDEL, ""); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if err := l.RemoveBlock("net", pfx("10.7.0.0/26")); err != nil {
		t.Fatalf("removing the emptied draining block: %v", err)
	}
	if err := l.SetClusterRanges("net", onlyNew); err != nil {
		t.Fatalf("removing the drained range: %v", err)
	}
	if p, _ := l.Pool("net"); p.Ranges[0][0].Subnet != pfx("10.7.1.0/26") || len(p.Ranges[0]) != 1 {
		t.Fatalf("pool after the drain: %+v", p)
	}
	Audit(t, l)
}
