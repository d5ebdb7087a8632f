package ledgertest

import (
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// testModeSwitch: a network switched between node mode (a plain pool of the node's
// podCIDR) and cluster mode (a cluster-wide pool in blocks) under the same name.
// While a lease is live the switch is refused, naming how many leases hold the pool
// and how to list them. Once every lease is released the new config replaces the
// pool in one transaction: the old free addresses and blocks are gone, the history
// stays, the counters carry over (the audit balances), the replacement is recorded
// with its reason, and all of it is the same after a reopen; until the released
// addresses the new ranges include have waited out the reuse delay, the switch
// waits (it would hand them out at once).
func testModeSwitch(t *testing.T, newStore Factory) {
	node := Ranges(t, `[[{"subnet":"10.236.0.0/24"}]]`)
	cluster := Ranges(t, `[[{"subnet":"10.236.0.0/16"}]]`)
	block := netip.MustParsePrefix("10.236.0.0/26")
	bits := []int{26}
	opts := func(clk *Clock) ledger.Options { return ledger.Options{Clock: clk, ReuseDelay: time.Minute} }
	alloc := func(t *testing.T, l *ledger.Ledger, cid string, r []pool.RangeSet, replace bool) (ledger.Lease, error) {
		t.Helper()
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(cid), Pod: ledger.Pod{UID: "uid-" + cid}, Ranges: r, ReplaceRanges: replace})
		return ls, err
	}
	release := func(t *testing.T, l *ledger.Ledger, cid string) {
		t.Helper()
		if _, ok, err := l.Release(Key(cid), ledger.ReasonDEL, "pod deleted"); err != nil || !ok {
			t.Fatalf("release %s: %v %v", cid, ok, err)
		}
	}
	cooling := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), "reuse delay (1m0s)") || !strings.Contains(err.Error(), "retry in 1m0s") {
			t.Fatalf("switch right after the releases: %v, want ErrPoolConflict saying to retry once the reuse delay is over", err)
		}
	}
	refused := func(t *testing.T, err error, leases string) {
		t.Helper()
		if !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), leases+" live leases") || !strings.Contains(err.Error(), "ipledgerctl leases --network net") {
			t.Fatalf("switch under %s live leases: %v, want ErrPoolConflict naming them and `ipledgerctl leases --network net`", leases, err)
		}
	}
	// state is what a switch must keep across a reopen
	type state struct {
		pool    ledger.PoolStatus
		blocks  []string
		free    int
		history []ledger.Release
		lease   ledger.Lease
	}
	stateOf := func(t *testing.T, l *ledger.Ledger, old netip.Addr, cid string) state {
		t.Helper()
		ps, err := l.Pool("net")
		if err != nil {
			t.Fatal(err)
		}
		var s state
		s.pool = ps
		for _, b := range l.Blocks("net") {
			s.blocks = append(s.blocks, b.Prefix.String())
		}
		s.free = len(l.FreeAddresses("net"))
		if s.history, err = l.History("net", old); err != nil {
			t.Fatal(err)
		}
		s.lease, _ = l.Lease(Key(cid))
		return s
	}
	checkSwitched := func(t *testing.T, l *ledger.Ledger, s state, old netip.Addr, from []pool.RangeSet, fromBits, toBits []int, reason string) {
		t.Helper()
		ps := s.pool
		if ps.Replaced == nil || pool.SetsString(ps.Replaced.FromRanges) != pool.SetsString(from) || !slices.Equal(ps.Replaced.FromBlockBits, fromBits) || !strings.Contains(ps.Replaced.Reason, reason) {
			t.Fatalf("pool's replacement record %+v, want from %v /%v, reason %q", ps.Replaced, pool.SetsString(from), fromBits, reason)
		}
		if !slices.Equal(ps.BlockBits, toBits) {
			t.Fatalf("pool blocks /%v, want /%v", ps.BlockBits, toBits)
		}
		if ps.Allocs != 3 || ps.Releases != 2 || ps.InUse != 1 {
			t.Fatalf("pool counts allocations %d releases %d in use %d, want 3, 2 and 1", ps.Allocs, ps.Releases, ps.InUse)
		}
		if len(s.history) != 1 || s.history[0].Key != Key("a") || s.history[0].Reason != ledger.ReasonDEL {
			t.Fatalf("history of %s: %+v, want a's release kept", old, s.history)
		}
		for _, f := range l.FreeAddresses("net") {
			t.Fatalf("%s of the old pool is still free after the switch", f.IP)
		}
		rep := Audit(t, l)
		for _, p := range rep.Pools {
			if p.Network == "net" && (p.Allocations != 3 || p.Releases != 2 || p.Live != 1) {
				t.Fatalf("audit of net: %+v, want 3 allocations = 2 releases + 1 live", p)
			}
		}
	}
	reopened := func(t *testing.T, st ledger.Store, before state, old netip.Addr) {
		t.Helper()
		l := Open(t, st, opts(NewClock()))
		after := stateOf(t, l, old, "c")
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("after reopen:\n%+v\nwant\n%+v", after, before)
		}
	}

	t.Run("node-to-cluster", func(t *testing.T) {
		st, reopen := newStore(t)
		clk := NewClock()
		l, err := ledger.Open(st, opts(clk))
		if err != nil {
			t.Fatal(err)
		}
		a, err := alloc(t, l, "a", node, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := alloc(t, l, "b", node, true); err != nil {
			t.Fatal(err)
		}
		release(t, l, "a")
		refused(t, l.DeclareCluster("net", cluster, bits), "1")
		_, err = alloc(t, l, "x", Ranges(t, `[[{"subnet":"10.237.0.0/24"}]]`), false)
		refused(t, err, "1")
		release(t, l, "b")
		cooling(t, l.DeclareCluster("net", cluster, bits))
		clk.Advance(time.Minute - time.Nanosecond)
		if err := l.DeclareCluster("net", cluster, bits); !errors.Is(err, ledger.ErrPoolConflict) {
			t.Fatalf("switch 1ns before the reuse delay is over: %v, want ErrPoolConflict", err)
		}
		clk.Advance(time.Nanosecond)
		if err := l.DeclareCluster("net", cluster, bits); err != nil {
			t.Fatalf("cluster mode once no lease is live: %v", err)
		}
		if err := l.AddBlock("net", block, 1); err != nil {
			t.Fatal(err)
		}
		c, err := alloc(t, l, "c", cluster, false)
		if err != nil || !block.Contains(c.IPs[0].Addr()) || c.IPs[0].Bits() != 16 {
			t.Fatalf("allocation in cluster mode: %v %v, want an address of %s/16", c.IPs, err, block)
		}
		old := a.IPs[0].Addr()
		s := stateOf(t, l, old, "c")
		checkSwitched(t, l, s, old, node, nil, bits, "node mode to cluster mode")
		if !slices.Equal(s.blocks, []string{block.String()}) {
			t.Fatalf("blocks %v, want %s", s.blocks, block)
		}
		reopened(t, reopen(), s, old)
	})

	t.Run("cluster-to-node", func(t *testing.T) {
		st, reopen := newStore(t)
		clk := NewClock()
		l, err := ledger.Open(st, opts(clk))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.DeclareCluster("net", cluster, bits); err != nil {
			t.Fatal(err)
		}
		if err := l.AddBlock("net", block, 1); err != nil {
			t.Fatal(err)
		}
		a, err := alloc(t, l, "a", cluster, false)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := alloc(t, l, "b", cluster, false); err != nil {
			t.Fatal(err)
		}
		release(t, l, "a")
		_, err = alloc(t, l, "x", node, true)
		refused(t, err, "1")
		release(t, l, "b")
		_, err = alloc(t, l, "c", node, true)
		cooling(t, err)
		clk.Advance(time.Minute)
		c, err := alloc(t, l, "c", node, true)
		if err != nil || !node[0].Contains(c.IPs[0].Addr()) {
			t.Fatalf("allocation in node mode once no lease is live: %v %v, want an address of %v", c.IPs, err, pool.SetsString(node))
		}
		old := a.IPs[0].Addr()
		s := stateOf(t, l, old, "c")
		checkSwitched(t, l, s, old, cluster, bits, nil, "cluster mode to node mode")
		if len(s.blocks) != 0 {
			t.Fatalf("blocks %v left in a node-mode pool", s.blocks)
		}
		reopened(t, reopen(), s, old)
	})
}
