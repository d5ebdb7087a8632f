package ledgertest

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
)

// testWantedAddress: a requested address is given when it is free, and refused with
// ErrAddressUnavailable (nothing allocated) when it is held, reserved, excluded,
// outside the pool or still in another pod's reuse delay; the lease and its history
// keep Why; the books balance after a restart.
func testWantedAddress(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	opts := ledger.Options{Clock: clk, ReuseDelay: time.Minute}
	opts.Logger = TestLogger(t)
	l, err := ledger.Open(st, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24","gateway":"10.9.0.1"}],[{"subnet":"fd09::/120"}]]`)
	want := []netip.Addr{netip.MustParseAddr("10.9.0.200"), netip.MustParseAddr("fd09::20")}
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Pod: ledger.Pod{UID: "ua"}, Ranges: r, Want: want, Why: "requested by ipledger.io/ip"})
	if err != nil {
		t.Fatal(err)
	}
	if ls.IPs[0].Addr() != want[0] || ls.IPs[1].Addr() != want[1] || ls.Why != "requested by ipledger.io/ip" {
		t.Fatalf("lease %v why %q, want %v why requested", ls.IPs, ls.Why, want)
	}
	// the ordinary picks go on below and around it
	for i := range 3 {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprint("p", i)), Ranges: r})
		if err != nil || ls.IPs[0].Addr() == want[0] {
			t.Fatalf("plain allocation %d: %v %v", i, ls.IPs, err)
		}
	}
	before := l.Leases("")
	for _, c := range []struct {
		name string
		want []netip.Addr
		ex   []netip.Prefix
		says string
	}{
		{"held", []netip.Addr{want[0]}, nil, "held by"},
		{"gateway", []netip.Addr{netip.MustParseAddr("10.9.0.1")}, nil, "gateway"},
		{"outside", []netip.Addr{netip.MustParseAddr("10.8.0.5")}, nil, "outside every range"},
		{"excluded", []netip.Addr{netip.MustParseAddr("10.9.0.100")}, []netip.Prefix{netip.MustParsePrefix("10.9.0.96/28")}, "reserved"},
		{"two of a family", []netip.Addr{netip.MustParseAddr("10.9.0.50"), netip.MustParseAddr("10.9.0.51")}, nil, "one family"},
		{"second family held", []netip.Addr{netip.MustParseAddr("10.9.0.50"), want[1]}, nil, "held by"},
	} {
		_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("bad"), Ranges: r, Want: c.want, Exclude: c.ex})
		if !errors.Is(err, ledger.ErrAddressUnavailable) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: err = %v, want ErrAddressUnavailable saying %q", c.name, err, c.says)
		}
	}
	if after := l.Leases(""); len(after) != len(before) {
		t.Fatalf("refused requests left leases: %d before, %d after", len(before), len(after))
	}
	if _, ok, err := l.Release(Key("a"), ledger.ReasonDEL, ""); !ok || err != nil {
		t.Fatal(ok, err)
	}
	h, err := l.History("net", want[0])
	if err != nil || len(h) != 1 || h[0].Why != "requested by ipledger.io/ip" {
		t.Fatalf("history %+v %v, want one release with the lease's why", h, err)
	}
	// another pod inside the reuse delay: refused; the same pod: given back
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Pod: ledger.Pod{UID: "ub"}, Ranges: r, Want: want[:1]}); !errors.Is(err, ledger.ErrAddressUnavailable) || !strings.Contains(err.Error(), "reuse delay") {
		t.Fatalf("another pod inside the reuse delay: %v", err)
	}
	if ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a2"), Pod: ledger.Pod{UID: "ua"}, Ranges: r, Want: want[:1]}); err != nil || ls.IPs[0].Addr() != want[0] {
		t.Fatalf("the same pod again: %v %v", ls.IPs, err)
	}
	// after a restart (the first ledger is audited here, not at the end)
	Audit(t, l)
	l2 := Open(t, reopen(), opts)
	if ls, ok := l2.Lease(Key("a2")); !ok || ls.IPs[0].Addr() != want[0] {
		t.Fatalf("after reopen: %v %v", ls, ok)
	}
	// the addresses the pool has not handed out are still handed out, each once
	seen := map[netip.Addr]bool{}
	for _, ls := range l2.Leases("") {
		seen[ls.IPs[0].Addr()] = true
	}
	for i := 0; ; i++ {
		ls, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprint("f", i)), Ranges: r})
		if errors.Is(err, ledger.ErrPoolExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if a := ls.IPs[0].Addr(); seen[a] {
			t.Fatalf("%s handed out twice", a)
		} else {
			seen[a] = true
		}
	}
	if len(seen) != 253 {
		t.Fatalf("%d addresses handed out in all, want 253 (a /24 less network, gateway, broadcast)", len(seen))
	}
}

// testExclude: no allocation hands out an excluded address, whether fresh, free or
// the pod's own last one; a lease already holding one keeps it; once the exclusion
// is lifted the addresses are handed out again (nothing is lost from the pool).
func testExclude(t *testing.T, newStore Factory) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprint("cluster=", cluster), func(t *testing.T) {
			st, _ := newStore(t)
			clk := NewClock()
			l := Open(t, st, ledger.Options{Clock: clk, ReuseDelay: time.Minute})
			r := Ranges(t, `[[{"subnet":"10.6.0.0/26"}]]`)
			if cluster {
				if err := l.DeclareCluster("net", r, []int{26}); err != nil {
					t.Fatal(err)
				}
				if err := l.AddBlock("net", pfx("10.6.0.0/26"), 1); err != nil {
					t.Fatal(err)
				}
			}
			// the pod's address is taken before the reservation
			own, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("own"), Pod: ledger.Pod{UID: "u1"}, Ranges: r})
			if err != nil {
				t.Fatal(err)
			}
			ex := []netip.Prefix{netip.MustParsePrefix("10.6.0.8/29"), netip.PrefixFrom(own.IPs[0].Addr(), 32)}
			isEx := func(a netip.Addr) bool { return ex[0].Contains(a) || ex[1].Contains(a) }
			if _, ok := l.Lease(Key("own")); !ok {
				t.Fatal("lease gone")
			}
			if _, ok, err := l.Release(Key("own"), ledger.ReasonDEL, ""); !ok || err != nil {
				t.Fatal(ok, err)
			}
			clk.Advance(time.Hour)
			n := 0
			for i := 0; ; i++ {
				ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprint("c", i)), Pod: ledger.Pod{UID: "u1"}, Ranges: r, Exclude: ex})
				if errors.Is(err, ledger.ErrPoolExhausted) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if isEx(ls.IPs[0].Addr()) {
					t.Fatalf("allocation %d got excluded %s", i, ls.IPs[0])
				}
				n++
				if i%5 == 4 { // churn: release and let the delay pass
					if _, _, err := l.Release(Key(fmt.Sprint("c", i)), ledger.ReasonDEL, ""); err != nil {
						t.Fatal(err)
					}
					n--
					clk.Advance(2 * time.Minute)
				}
			}
			if want := 61 - 9; n != want {
				t.Fatalf("%d addresses held at exhaustion, want %d (61 usable less 9 excluded)", n, want)
			}
			// lifted: the excluded ones come back
			for i := range 9 {
				ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprint("x", i)), Ranges: r})
				if err != nil {
					t.Fatalf("after lifting the exclusion, allocation %d: %v", i, err)
				}
				if !isEx(ls.IPs[0].Addr()) {
					t.Fatalf("after lifting, got %s, want one of the formerly excluded", ls.IPs[0])
				}
			}
		})
	}
}
