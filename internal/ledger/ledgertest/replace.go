package ledgertest

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// testReplaceRanges: a request with ReplaceRanges (a changed podCIDR) replaces the
// ranges of a node-mode pool under live leases. New allocations come from the new
// ranges; the old lease is kept, idempotent ADD gives it back, it survives a restart,
// its range set is retired (shown in the pool's status, disjoint from other networks)
// and goes with its release, whose history is kept and whose address is not kept
// free. A range set that stays keeps its cursor and reuse delay wherever it moves;
// one overlapping an address in use is refused; without ReplaceRanges a change is
// still a conflict. Every ledger is audited at the end (Open).
func testReplaceRanges(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	opts := ledger.Options{Clock: clk, ReuseDelay: time.Hour}
	l, err := ledger.Open(st, opts)
	if err != nil {
		t.Fatal(err)
	}
	rA := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	rB := Ranges(t, `[[{"subnet":"10.10.0.0/24"}]]`)
	alloc := func(l *ledger.Ledger, cid string, r []pool.RangeSet, replace bool) (ledger.Lease, bool, error) {
		return l.Allocate(ledger.AllocateRequest{Key: Key(cid), Pod: ledger.Pod{UID: "uid-" + cid}, Ranges: r, ReplaceRanges: replace})
	}
	mustAlloc := func(l *ledger.Ledger, cid string, r []pool.RangeSet, in ...string) ledger.Lease {
		t.Helper()
		ls, _, err := alloc(l, cid, r, true)
		if err != nil {
			t.Fatalf("allocate %s: %v", cid, err)
		}
		if len(ls.IPs) != len(in) {
			t.Fatalf("allocate %s: %v, want one address in each of %v", cid, ls.IPs, in)
		}
		for i, p := range ls.IPs {
			if !netip.MustParsePrefix(in[i]).Contains(p.Addr()) {
				t.Fatalf("allocate %s: %v, want one address in each of %v", cid, ls.IPs, in)
			}
		}
		return ls
	}
	retired := func(l *ledger.Ledger, want string) {
		t.Helper()
		ps, err := l.Pool("net")
		if err != nil {
			t.Fatal(err)
		}
		got := []string{}
		for _, r := range ps.Retired {
			got = append(got, r.Ranges.String()+"="+strconv.Itoa(r.Leases))
		}
		if strings.Join(got, " ") != want {
			t.Fatalf("retired sets %v, want %q", got, want)
		}
	}

	old := mustAlloc(l, "a", rA, "10.9.0.0/24")
	mustAlloc(l, "b", rA, "10.9.0.0/24")
	if _, _, err := l.Release(Key("b"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := alloc(l, "x", rB, false); !errors.Is(err, ledger.ErrPoolConflict) {
		t.Fatalf("other ranges without ReplaceRanges: %v, want ErrPoolConflict", err)
	}
	mustAlloc(l, "c", rB, "10.10.0.0/24")
	retired(l, "10.9.0.0/24(10.9.0.1-10.9.0.254)=1")
	if got, existed, err := alloc(l, "a", rB, true); err != nil || !existed || got.IPs[0] != old.IPs[0] {
		t.Fatalf("ADD again of the old lease: %v existed %v (%v), want %v back", got.IPs, existed, err, old.IPs)
	}
	for _, f := range l.FreeAddresses("net") {
		if rA[0].Contains(f.IP) {
			t.Fatalf("%s of the old ranges is still free in the pool", f.IP)
		}
	}
	// the retired set is still the pool's: no other network may take it
	other := ledger.AllocateRequest{Key: ledger.Key{Network: "other", ContainerID: "o", IfName: "eth0"}, Ranges: rA}
	if _, _, err := l.Allocate(other); !errors.Is(err, ledger.ErrPoolConflict) {
		t.Fatalf("another network on the retired range: %v, want ErrPoolConflict", err)
	}
	// a new set overlapping an address in use
	if _, _, err := alloc(l, "y", Ranges(t, `[[{"subnet":"10.9.0.0/23"}]]`), true); !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), "overlaps") {
		t.Fatalf("ranges over the retired lease: %v, want ErrPoolConflict saying overlaps", err)
	}
	Audit(t, l)

	if l, err = ledger.Open(reopen(), opts); err != nil {
		t.Fatal(err)
	}
	retired(l, "10.9.0.0/24(10.9.0.1-10.9.0.254)=1")
	// dual stack: the IPv4 set stays, with its cursor (.1 is the gateway, c holds .2)
	rB6 := Ranges(t, `[[{"subnet":"10.10.0.0/24"}],[{"subnet":"fd00:10::/120"}]]`)
	d := mustAlloc(l, "d", rB6, "10.10.0.0/24", "fd00:10::/120")
	if d.IPs[0].Addr() != netip.MustParseAddr("10.10.0.3") {
		t.Fatalf("d got %v, want 10.10.0.3 after c's 10.10.0.2", d.IPs)
	}
	if _, _, err := l.Release(Key("d"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	// the sets swap places: d's released address keeps waiting out its reuse delay
	r6B := Ranges(t, `[[{"subnet":"fd00:10::/120"}],[{"subnet":"10.10.0.0/24"}]]`)
	e := mustAlloc(l, "e", r6B, "fd00:10::/120", "10.10.0.0/24")
	if e.IPs[1].Addr() != netip.MustParseAddr("10.10.0.4") {
		t.Fatalf("e got %v, want 10.10.0.4 (10.10.0.3 waits out the reuse delay)", e.IPs)
	}
	clk.Advance(2 * time.Hour)
	d2 := mustAlloc(l, "d", r6B, "fd00:10::/120", "10.10.0.0/24")
	if d2.IPs[1].Addr() != netip.MustParseAddr("10.10.0.3") {
		t.Fatalf("d again got %v, want its own 10.10.0.3 back", d2.IPs)
	}
	Audit(t, l)

	// the old lease's DEL releases it: history kept, address not free, set gone
	if _, ok, err := l.Release(Key("a"), ledger.ReasonDEL, "pod deleted"); err != nil || !ok {
		t.Fatalf("release of the old lease: %v %v", ok, err)
	}
	retired(l, "")
	h, err := l.History("net", old.IPs[0].Addr())
	if err != nil || len(h) != 1 || h[0].Reason != ledger.ReasonDEL || h[0].Key != Key("a") {
		t.Fatalf("history of %s: %+v (%v), want a's DEL", old.IPs[0].Addr(), h, err)
	}
	for _, f := range l.FreeAddresses("net") {
		if rA[0].Contains(f.IP) {
			t.Fatalf("released %s of a retired set is kept free", f.IP)
		}
	}
	if _, _, err := l.Allocate(other); err != nil {
		t.Fatalf("another network on the range no longer retired: %v", err)
	}
	Audit(t, l)
	l = Open(t, reopen(), opts)
	retired(l, "")
	if _, ok, err := l.Release(Key("c"), ledger.ReasonDEL, ""); err != nil || !ok {
		t.Fatalf("release of c after the changes: %v %v", ok, err)
	}
}
