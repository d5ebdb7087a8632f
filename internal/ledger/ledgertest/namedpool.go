package ledgertest

import (
	"net/netip"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
)

// testNamedPool: an attachment of network "net" allocated from another pool (a
// named pool: AllocateRequest.Pool) holds an address of that pool under its own
// key; DEL of the key returns the address to that pool (free there, history
// there), the network's own pool is untouched, and all of it survives a reopen.
func testNamedPool(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	opts := ledger.Options{Clock: clk, ReuseDelay: time.Minute}
	opts.Logger = TestLogger(t)
	l, err := ledger.Open(st, opts) // audited by hand: a reopen replaces it
	if err != nil {
		t.Fatal(err)
	}
	def := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	blue := Ranges(t, `[[{"subnet":"10.50.0.0/29"}]]`)
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("d"), Ranges: def}); err != nil {
		t.Fatal(err)
	}
	b, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Pool: "blue", Ranges: blue, Why: "pool blue"})
	if err != nil {
		t.Fatal(err)
	}
	if b.IPs[0].String() != "10.50.0.2/29" || b.Pool != "blue" || b.PoolNetwork() != "blue" || b.Key.Network != "net" {
		t.Fatalf("lease from pool blue: %+v, want 10.50.0.2/29 of pool blue under network net", b)
	}
	// a pool that overlaps the network's is refused, like any two pools
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("x"), Pool: "red", Ranges: Ranges(t, `[[{"subnet":"10.9.0.128/25"}]]`)}); err == nil {
		t.Fatal("a pool overlapping the network's ranges was created")
	}
	// idempotent: the attachment gets its lease back whatever the request's pool
	if again, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: def}); err != nil || !existed || again.IPs[0] != b.IPs[0] {
		t.Fatalf("ADD again: %+v existed=%v err=%v, want the same lease", again, existed, err)
	}
	Audit(t, l)
	if l, err = ledger.Open(reopen(), opts); err != nil {
		t.Fatal(err)
	}
	if got, ok := l.Lease(Key("b")); !ok || got.Pool != "blue" {
		t.Fatalf("after reopen: %+v (%v), want the lease of pool blue", got, ok)
	}
	if _, ok, err := l.Release(Key("b"), ledger.ReasonDEL, ""); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	h, err := l.History("blue", netip.MustParseAddr("10.50.0.2"))
	if err != nil || len(h) != 1 || h[0].Key != Key("b") {
		t.Fatalf("history of 10.50.0.2 in pool blue: %+v %v, want b's release", h, err)
	}
	ps, err := l.Pool("blue")
	if err != nil || ps.InUse != 0 || ps.Free != 1 {
		t.Fatalf("pool blue after the release: %+v %v, want nothing in use, one free", ps, err)
	}
	if ps, err := l.Pool("net"); err != nil || ps.InUse != 1 || ps.Free != 0 {
		t.Fatalf("pool net: %+v %v, want d's one address used", ps, err)
	}
	Audit(t, l)
	Open(t, reopen(), opts) // audited at the end
}
