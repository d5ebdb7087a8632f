package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/cluster/clustertest"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// watchPools runs every agent's WatchPools until the test ends, and waits for
// each to have listed the records once.
func watchPools(t *testing.T, agents ...*agent) {
	t.Helper()
	wctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, a := range agents {
		wg.Go(func() { a.m.WatchPools(wctx) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, a := range agents {
		select {
		case <-a.m.PoolsFollowed():
		case <-time.After(time.Minute):
			t.Fatalf("%s: the pool watch never listed", a.name)
		}
	}
}

// servePool sets IPPool name up on every agent and runs their pool watches; it
// returns the pool as each serves it.
func servePool(t *testing.T, name string, agents ...*agent) map[*agent]cluster.IPPool {
	t.Helper()
	pools := map[*agent]cluster.IPPool{}
	for _, n := range agents {
		p, err := n.m.EnsurePool(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		pools[n] = p
	}
	watchPools(t, agents...)
	return pools
}

// waitFollowed waits until cond holds for a, re-checking each time a's pool watch
// applied a record. The bound only stops a hung watch; it is not a speed test.
func waitFollowed(t *testing.T, a *agent, what string, cond func() bool) {
	t.Helper()
	bound := time.After(time.Minute)
	for !cond() {
		select {
		case <-a.m.PoolsFollowed():
		case <-bound:
			t.Fatalf("%s: %s: never seen", a.name, what)
		}
	}
}

func poolRanges(a *agent, name string) string {
	p, err := a.l.Pool(name)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, r := range p.Ranges[0] {
		out = append(out, r.Subnet.String())
	}
	return strings.Join(out, ",")
}

func in(cidr string, a netip.Addr) bool { return netip.MustParsePrefix(cidr).Contains(a) }

// A range an operator adds to an IPPool is used at once: two nodes serving the
// pool, every address of its one range handed out, follow the edit from their
// watch of the pool records (no ADD failing on a "changed spec", no restart) and
// claim their next blocks in the new range; EnsurePool returns the new ranges.
// Before, EnsurePool refused the changed spec (ErrPoolMismatch) until the agent
// restarted.
func TestPoolRangeAdded(t *testing.T) { forBackends(t, testPoolRangeAdded) }

func testPoolRangeAdded(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	putPool(t, c.ds, "blue", `{"ranges":[[{"subnet":"10.50.0.0/26"}]],"blockSize":28}`)
	a, b := c.agent("node-a", nil, nil), c.agent("node-b", nil, nil)
	pools := servePool(t, "blue", a, b)
	held := 0
	for _, n := range []*agent{a, b} {
		for i := 0; ; i++ {
			_, err := n.allocPool(pools[n], fmt.Sprintf("%s-%d", n.name, i))
			if errors.Is(err, ledger.ErrPoolExhausted) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			held++
		}
	}
	if held != 61 { // 10.50.0.0/26 but .0, the gateway .1 and the broadcast .63
		t.Fatalf("%d addresses held before the range was added, want 61", held)
	}
	clustertest.EditPool(t, c.ds, "blue", clustertest.AddRange("10.50.1.0/26"))
	for _, n := range []*agent{a, b} {
		waitFollowed(t, n, "blue grown", func() bool { return poolRanges(n, "blue") == "10.50.0.0/26,10.50.1.0/26" })
		ls, err := n.allocPool(pools[n], n.name+"-new")
		if err != nil || !in("10.50.1.0/26", ls.IPs[0].Addr()) {
			t.Fatalf("%s after the range was added: %+v %v, want an address of 10.50.1.0/26", n.name, ls, err)
		}
		p, err := n.m.EnsurePool(ctx, "blue", nil)
		if err != nil || len(p.Ranges[0]) != 2 {
			t.Fatalf("%s: EnsurePool after the edit: %+v %v", n.name, p, err)
		}
		if r := n.m.Refused(); len(r) > 0 {
			t.Fatalf("%s refused: %v", n.name, r)
		}
	}
}

// A range an operator removes from an IPPool is drained: the nodes' blocks in it
// hand out nothing more (ledger.BlockDraining), the leases in it keep their
// addresses, every new address and block comes from the ranges left, and each
// block of the removed range is given back (its record deleted, never claimed
// again) as soon as its last lease is released, after which the node's ledger
// drops the range.
func TestPoolRangeDrained(t *testing.T) { forBackends(t, testPoolRangeDrained) }

func testPoolRangeDrained(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	putPool(t, c.ds, "blue", `{"ranges":[[{"subnet":"10.50.0.0/26"},{"subnet":"10.50.1.0/26"}]],"blockSize":28}`)
	a, b := c.agent("node-a", nil, nil), c.agent("node-b", nil, nil)
	pools := servePool(t, "blue", a, b)
	old := map[string]netip.Addr{} // the leases in 10.50.0.0/26, by container
	for _, n := range []*agent{a, b} {
		for i := range 20 {
			cid := fmt.Sprintf("%s-%d", n.name, i)
			ls, err := n.allocPool(pools[n], cid)
			if err != nil {
				t.Fatal(err)
			}
			if in("10.50.0.0/26", ls.IPs[0].Addr()) {
				old[cid] = ls.IPs[0].Addr()
			}
		}
	}
	if len(old) == 0 {
		t.Fatal("no lease in 10.50.0.0/26 to drain")
	}
	clustertest.EditPool(t, c.ds, "blue", clustertest.DrainRange("10.50.0.0/26", true))
	for _, n := range []*agent{a, b} {
		waitFollowed(t, n, "blue's 10.50.0.0/26 draining", func() bool {
			for _, blk := range n.l.Blocks("blue") {
				if in("10.50.0.0/26", blk.Prefix.Addr()) && blk.State != ledger.BlockDraining {
					return false
				}
			}
			return true
		})
		for i := range 30 {
			ls, err := n.allocPool(pools[n], fmt.Sprintf("%s-new-%d", n.name, i))
			if err != nil {
				t.Fatal(err)
			}
			if !in("10.50.1.0/26", ls.IPs[0].Addr()) {
				t.Fatalf("%s: new lease %v after the drain, want 10.50.1.0/26", n.name, ls.IPs)
			}
		}
		if err := n.m.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for cid, addr := range old {
		n := a
		if strings.HasPrefix(cid, "node-b") {
			n = b
		}
		ls, ok := n.l.Lease(ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"})
		if !ok || ls.IPs[0].Addr() != addr {
			t.Fatalf("lease %s lost its address %s in the drain: %+v %v", cid, addr, ls, ok)
		}
	}
	drained := func() (n int) {
		bs, err := cluster.ReadBlocks(ctx, c.ds)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range bs {
			if r.Network == "blue" && in("10.50.0.0/26", r.CIDR.Addr()) {
				n++
			}
		}
		return n
	}
	if drained() == 0 {
		t.Fatal("the blocks of 10.50.0.0/26 that hold leases are gone already")
	}
	// the draining blocks' pods stay inside the cluster's pod ranges (never
	// masqueraded towards other pods) while the blocks exist
	prs, err := b.m.PoolRanges(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, blk := range a.l.Blocks("blue") {
		if blk.State == ledger.BlockDraining && !containsPrefix(prs, blk.Prefix.String()) {
			t.Fatalf("PoolRanges %v lacks draining block %s", prs, blk.Prefix)
		}
	}
	// node-a's leases go: its blocks there are given back at its next sweep
	for cid := range old {
		if strings.HasPrefix(cid, "node-a") {
			a.release(t, cid)
		}
	}
	if err := a.m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, blk := range a.l.Blocks("blue") {
		if in("10.50.0.0/26", blk.Prefix.Addr()) {
			t.Fatalf("node-a still holds %+v after its leases there were released", blk)
		}
	}
	if got := poolRanges(a, "blue"); got != "10.50.1.0/26" {
		t.Fatalf("node-a's ledger pool after the drain: %s, want 10.50.1.0/26", got)
	}
	for cid := range old {
		if strings.HasPrefix(cid, "node-b") {
			b.release(t, cid)
		}
	}
	if err := b.m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := drained(); n != 0 {
		t.Fatalf("%d block records of 10.50.0.0/26 left after every lease there was released", n)
	}
	// the drained range is claimed no more: the pool is full at 10.50.1.0/26's end
	for i := 0; ; i++ {
		ls, err := a.allocPool(pools[a], fmt.Sprint("fill-", i))
		if errors.Is(err, ledger.ErrPoolExhausted) {
			break
		}
		if err != nil || !in("10.50.1.0/26", ls.IPs[0].Addr()) {
			t.Fatalf("filling what is left: %+v %v", ls, err)
		}
	}
	if n := drained(); n != 0 {
		t.Fatalf("%d blocks of the drained range claimed again", n)
	}
}

// No address of a draining block is handed out again, by any node, within the
// reuse delay of its release, whatever happened to its range. A pod of node-a
// holds X in blue's range A; A is drained, and re-added before or after X is
// released: node-a's block there stays draining until it empties and is then
// given back. A node that claims it next hands its addresses out as never used,
// so node-b, filling the pool, must not get X while the reuse delay runs: the
// block stays node-a's until the delay has passed since X's release (the
// sweeps between keep it), and only then is it given back and node-b's. Before,
// the block was given back at the first sweep after X's release, and node-b got
// X at once.
func TestDrainedBlockKeepsReuseDelay(t *testing.T) {
	forBackends(t, testDrainedBlockKeepsReuseDelay)
}

func testDrainedBlockKeepsReuseDelay(t *testing.T, newC func(*testing.T) *cl) {
	const (
		rangeA = "10.50.0.0/28"
		blockA = "10.50.0.0/28"
		delay  = 5 * time.Second
		step   = 2 * time.Second // sweeps and renewals this far apart (the lease TTL is 9s)
	)
	for _, readdFirst := range []bool{true, false} {
		name := "re-added after the release"
		if readdFirst {
			name = "re-added before the release"
		}
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			c := newC(t)
			c.reuse = delay
			putPool(t, c.ds, "blue", `{"ranges":[[{"subnet":"10.50.0.0/28"},{"subnet":"10.50.1.0/28"}]],"blockSize":28}`)
			a, b := c.agent("node-a", nil, nil), c.agent("node-b", nil, nil)
			pools := servePool(t, "blue", a, b)
			ls, err := a.allocPool(pools[a], "held")
			if err != nil {
				t.Fatal(err)
			}
			x := ls.IPs[0].Addr()
			if !in(rangeA, x) {
				t.Fatalf("node-a's first address %s, want one of %s", x, rangeA)
			}
			clustertest.EditPool(t, c.ds, "blue", clustertest.DrainRange(rangeA, true))
			waitFollowed(t, a, "blue's "+rangeA+" draining", func() bool {
				bs := a.l.Blocks("blue")
				return len(bs) == 1 && bs[0].State == ledger.BlockDraining
			})
			readd := func() {
				clustertest.EditPool(t, c.ds, "blue", clustertest.AddRange(rangeA))
				waitFollowed(t, a, rangeA+" re-added", func() bool { return len(a.m.DrainedRanges("blue")) == 0 })
				waitFollowed(t, b, rangeA+" re-added", func() bool { return poolRanges(b, "blue") == "10.50.1.0/28,"+rangeA })
			}
			if readdFirst {
				readd()
			}
			a.release(t, "held")
			released := c.clk.Mono()
			if err := a.m.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if !readdFirst {
				readd()
			}
			fill := func() []netip.Addr {
				p, err := b.m.EnsurePool(ctx, "blue", nil)
				if err != nil {
					t.Fatal(err)
				}
				var got []netip.Addr
				for i := 0; ; i++ {
					ls, err := b.allocPool(p, fmt.Sprintf("fill-%d-%d", c.clk.Mono()/time.Second, i))
					if errors.Is(err, ledger.ErrPoolExhausted) {
						return got
					}
					if err != nil {
						t.Fatal(err)
					}
					got = append(got, ls.IPs[0].Addr())
				}
			}
			// tick: a step later, both agents renew and node-a sweeps
			tick := func() {
				c.clk.Advance(step)
				for _, n := range []*agent{a, b} {
					if err := n.m.Renew(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if err := a.m.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			}
			for {
				elapsed := c.clk.Mono() - released
				if got := fill(); slices.Contains(got, x) {
					t.Fatalf("node-b got %s %v after node-a released it, within the reuse delay %v (the draining block %s was given back: %+v)",
						x, elapsed, delay, blockA, blocksOf(t, c.ds, "blue"))
				}
				if rec := blockRec(t, c.ds, blockA); rec.Owner != "node-a" {
					t.Fatalf("block %s %v after its last release: %+v, want still node-a's (draining) within the reuse delay %v", blockA, elapsed, rec, delay)
				}
				if elapsed+step >= delay {
					break
				}
				tick()
			}
			// the reuse delay has passed by the next sweep: the block is given
			// back, and node-b claims it
			tick()
			if bs := a.l.Blocks("blue"); len(bs) != 0 {
				t.Fatalf("node-a still holds %+v past the reuse delay after its last release there", bs)
			}
			got := fill()
			if !slices.ContainsFunc(got, func(y netip.Addr) bool { return in(rangeA, y) }) {
				t.Fatalf("node-b got %v once node-a's draining block was given back, want addresses of re-added %s", got, rangeA)
			}
			if rec := blockRec(t, c.ds, blockA); rec.Owner != "node-b" {
				t.Fatalf("block %s after it was given back and the pool filled: %+v, want node-b's", blockA, rec)
			}
		})
	}
}

// blocksOf returns the block records of pool network.
func blocksOf(t *testing.T, ds datastore.Store, network string) []cluster.BlockRecord {
	t.Helper()
	bs, err := cluster.ReadBlocks(ctx, ds)
	if err != nil {
		t.Fatal(err)
	}
	return slices.DeleteFunc(bs, func(r cluster.BlockRecord) bool { return r.Network != network })
}

// The default pool's record is the truth, and nodes' conflists that disagree
// during a rollout cannot shrink it: a conflist that adds a range extends the
// record (by compare-and-swap: two nodes adding different ranges at once both
// land), every node serving the network follows it, a conflist that lacks a
// range changes nothing, and a range the operator moved to the record's drained
// list is not added back by a conflist that still names it; moved back (the
// drained list left empty), it is the pool's again.
func TestConflistExtendsPool(t *testing.T) { forBackends(t, testConflistExtendsPool) }

func testConflistExtendsPool(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	conf := func(subnets ...string) []pool.RangeSet {
		var rs []string
		for _, s := range subnets {
			rs = append(rs, fmt.Sprintf(`{"subnet":%q}`, s))
		}
		return ranges(t, "[["+strings.Join(rs, ",")+"]]")
	}
	a := c.agent("node-a", conf("10.20.0.0/26"), []int{28})
	nodes := []*agent{c.agent("node-b", nil, nil), c.agent("node-c", nil, nil)}
	watchPools(t, a, nodes[0], nodes[1])
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, n := range nodes {
		wg.Go(func() {
			errs[i] = n.m.EnsureNetwork(ctx, "net", conf("10.20.0.0/26", fmt.Sprintf("10.2%d.0.0/26", i+1)), []int{28})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	kv, err := c.ds.Get(ctx, cluster.PoolKey("net"))
	if err != nil {
		t.Fatal(err)
	}
	var rec cluster.PoolRecord
	if err := json.Unmarshal(kv.Value, &rec); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rec.Ranges[0] {
		got[r.Subnet.String()] = true
	}
	if len(got) != 3 || !got["10.21.0.0/26"] || !got["10.22.0.0/26"] {
		t.Fatalf("record after two conflists extended it at once: %s, want 10.20, 10.21 and 10.22", pool.SetsString(rec.Ranges))
	}
	// node-a, whose conflist has only 10.20.0.0/26, serves all three
	waitFollowed(t, a, "net grown", func() bool { return len(strings.Split(poolRanges(a, "net"), ",")) == 3 })
	if err := a.m.EnsureNetwork(ctx, "net", conf("10.20.0.0/26"), []int{28}); err != nil {
		t.Fatal(err)
	}
	for i := range 61 + 64 {
		if _, err := a.alloc(t, fmt.Sprint("p", i)); err != nil {
			t.Fatalf("allocation %d on node-a: %v", i, err)
		}
	}
	// the operator drains 10.21.0.0/26: out of ranges, into drained
	clustertest.EditPool(t, c.ds, "net", clustertest.DrainRange("10.21.0.0/26", false))
	waitFollowed(t, a, "10.21.0.0/26 draining", func() bool {
		for _, b := range a.l.Blocks("net") {
			if in("10.21.0.0/26", b.Prefix.Addr()) && b.State != ledger.BlockDraining {
				return false
			}
		}
		return true
	})
	waitFollowed(t, nodes[0], "10.21.0.0/26 out", func() bool { return !strings.Contains(poolRanges(nodes[0], "net"), "10.21.") })
	if err := nodes[0].m.EnsureNetwork(ctx, "net", conf("10.20.0.0/26", "10.21.0.0/26"), []int{28}); err != nil {
		t.Fatal(err)
	}
	kv, err = c.ds.Get(ctx, cluster.PoolKey("net"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(kv.Value), `"ranges":[[{"subnet":"10.21.0.0/26"`) || strings.Count(string(kv.Value), "10.21.0.0/26") != 1 {
		t.Fatalf("a conflist naming the drained range added it back: %s", kv.Value)
	}
	if ls, err := nodes[0].alloc(t, "b0"); err != nil || in("10.21.0.0/26", ls.IPs[0].Addr()) {
		t.Fatalf("node-b after the drain: %+v %v", ls, err)
	}
	// the operator re-adds it: back into ranges, the drained list left empty
	clustertest.EditPool(t, c.ds, "net", clustertest.UndrainRange("10.21.0.0/26"))
	waitFollowed(t, nodes[0], "10.21.0.0/26 back, or the record refused", func() bool {
		return strings.Contains(poolRanges(nodes[0], "net"), "10.21.") || len(nodes[0].m.Refused()) > 0
	})
	if r := nodes[0].m.Refused(); len(r) > 0 {
		t.Fatalf("the record with the range re-added and drained [] refused: %v", r)
	}
}

// A change of a pool that cannot be served is refused and changes nothing: the
// nodes keep serving the pool as it was (same ranges, same blocks, allocation
// goes on), Refused names the field and the fix, and restoring the spec clears it.
func TestPoolChangeRefused(t *testing.T) { forBackends(t, testPoolChangeRefused) }

func testPoolChangeRefused(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	const spec = `{"ranges":[[{"subnet":"10.50.0.0/26"}]],"blockSize":28}`
	putPool(t, c.ds, "blue", spec)
	putPool(t, c.ds, "green", `{"ranges":[[{"subnet":"10.60.0.0/24"}]]}`)
	putPool(t, c.ds, "wide", `{"ranges":[[{"subnet":"10.70.0.0/26"}]],"blockSize":24}`)
	a := c.agent("node-a", nil, nil)
	blue, err := a.m.EnsurePool(ctx, "blue", nil)
	if err != nil {
		t.Fatal(err)
	}
	wide, err := a.m.EnsurePool(ctx, "wide", nil)
	if err != nil {
		t.Fatal(err)
	}
	watchPools(t, a)
	if _, err := a.allocPool(blue, "b0"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.allocPool(wide, "w0"); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tc := range []struct {
		name, pool string
		edit       func(map[string]any)
		says       []string
	}{
		{"block size of a pool with blocks", "blue", func(s map[string]any) { s["blockSize"] = 27 },
			[]string{"IPPool blue: spec.blockSize: blocks of /[27]", "restore spec.blockSize"}},
		{"a range set added", "blue", func(s map[string]any) {
			s["ranges"] = append(s["ranges"].([]any), []any{map[string]any{"subnet": "fd50::/120"}})
		}, []string{"IPPool blue: spec.ranges: 2 range sets, it has 1", "add or remove ranges inside its set"}},
		{"a range overlapping another pool's", "blue", clustertest.AddRange("10.60.0.0/26"),
			[]string{`IPPool blue: spec.ranges: range 10.60.0.0/26 (10.60.0.1-10.60.0.62) overlaps range 10.60.0.0/24`, `pool "green"`, "ranges of their own"}},
		{"a range sharing a block with one that stays", "wide", clustertest.AddRange("10.70.0.64/26"),
			[]string{"IPPool wide: spec.ranges[0]: range 10.70.0.64/26", "shares block 10.70.0.0/24 with range 10.70.0.0/26", "align its subnet"}},
		{"a spec that does not parse", "blue", func(s map[string]any) { s["ranges"] = "10.50.0.0/26" },
			[]string{"IPPool blue: spec:"}},
	} {
		before := poolRanges(a, tc.pool)
		blocks := len(a.l.Blocks(tc.pool))
		clustertest.EditPool(t, c.ds, tc.pool, tc.edit)
		waitFollowed(t, a, tc.name+" refused", func() bool { return a.m.Refused()[tc.pool] != "" })
		why := a.m.Refused()[tc.pool]
		for _, s := range tc.says {
			if !strings.Contains(why, s) {
				t.Errorf("%s: refused with %q, want it to say %q", tc.name, why, s)
			}
		}
		if got := poolRanges(a, tc.pool); got != before || len(a.l.Blocks(tc.pool)) != blocks {
			t.Errorf("%s changed the pool: ranges %s (were %s), %d blocks (were %d)", tc.name, got, before, len(a.l.Blocks(tc.pool)), blocks)
		}
		p, err := a.m.EnsurePool(ctx, tc.pool, nil)
		if err != nil {
			t.Fatalf("%s: EnsurePool: %v, want the pool served as it was", tc.name, err)
		}
		n++
		if ls, err := a.allocPool(p, fmt.Sprint("after-", n)); err != nil || !p.Ranges[0].Contains(ls.IPs[0].Addr()) {
			t.Fatalf("%s: allocation after the refusal: %+v %v", tc.name, ls, err)
		}
		// the operator restores the spec
		clustertest.EditPool(t, c.ds, tc.pool, func(s map[string]any) {
			var orig map[string]any
			js := spec
			if tc.pool == "wide" {
				js = `{"ranges":[[{"subnet":"10.70.0.0/26"}]],"blockSize":24}`
			}
			if err := json.Unmarshal([]byte(js), &orig); err != nil {
				t.Fatal(err)
			}
			clear(s)
			for k, v := range orig {
				s[k] = v
			}
		})
		waitFollowed(t, a, tc.name+" restored", func() bool { return a.m.Refused()[tc.pool] == "" })
	}
}

// Pools change under churn: four nodes serving blue add and release addresses
// concurrently (each sweeping now and then) while an operator adds a range, then
// drains the first one. No address is ever held twice across the nodes, no
// allocation a node starts after it followed the drain comes from the drained
// range, every lease keeps its address, the drained range's blocks are all given
// back once the last lease there is released, and every node's books balance
// (the cluster audit and each ledger's audit run when the test ends).
func TestPoolChangesUnderChurn(t *testing.T) { forBackends(t, testPoolChangesUnderChurn) }

func testPoolChangesUnderChurn(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	putPool(t, c.ds, "blue", `{"ranges":[[{"subnet":"10.50.0.0/25"}]],"blockSize":28}`)
	var nodes []*agent
	for i := range 4 {
		nodes = append(nodes, c.agent(fmt.Sprint("node-", i), nil, nil))
	}
	pools := servePool(t, "blue", nodes...)
	var (
		mu       sync.Mutex
		holder   = map[netip.Addr]string{} // address -> node/container
		problems []string
		allocs   int
	)
	var drained atomic.Bool // every node has followed the drain
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w, n := range nodes {
		wg.Go(func() {
			var mine []string
			leases := map[string]netip.Addr{}
			for i := 0; ; i++ {
				select {
				case <-stop:
					for _, cid := range mine {
						mu.Lock()
						delete(holder, leases[cid])
						mu.Unlock()
						n.release(t, cid)
					}
					return
				default:
				}
				if len(mine) >= 15 || len(mine) > 0 && i%3 == 0 {
					k := (i * 7) % len(mine)
					cid := mine[k]
					mine = slices.Delete(mine, k, k+1)
					mu.Lock()
					delete(holder, leases[cid])
					mu.Unlock()
					n.release(t, cid)
					continue
				}
				after := drained.Load()
				cid := fmt.Sprintf("w%d-%d", w, i)
				ls, err := n.allocPool(pools[n], cid)
				if errors.Is(err, ledger.ErrPoolExhausted) {
					continue
				}
				mu.Lock()
				if err != nil {
					problems = append(problems, fmt.Sprintf("%s: %s: %v", n.name, cid, err))
					mu.Unlock()
					return
				}
				a := ls.IPs[0].Addr()
				if h, ok := holder[a]; ok {
					problems = append(problems, fmt.Sprintf("%s given to %s/%s while %s holds it", a, n.name, cid, h))
				}
				if after && in("10.50.0.0/25", a) {
					problems = append(problems, fmt.Sprintf("%s/%s got %s of the drained range after the drain", n.name, cid, a))
				}
				holder[a] = n.name + "/" + cid
				allocs++
				mu.Unlock()
				mine, leases[cid] = append(mine, cid), a
				if i%10 == 0 {
					if err := n.m.Sweep(ctx); err != nil {
						t.Errorf("%s: sweep: %v", n.name, err)
					}
				}
			}
		})
	}
	progress := func(more int) {
		mu.Lock()
		goal := allocs + more
		mu.Unlock()
		for {
			mu.Lock()
			done, bad := allocs >= goal, len(problems) > 0
			mu.Unlock()
			if done || bad {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	progress(200)
	clustertest.EditPool(t, c.ds, "blue", clustertest.AddRange("10.50.1.0/25"))
	for _, n := range nodes {
		waitFollowed(t, n, "blue grown", func() bool { return strings.Contains(poolRanges(n, "blue"), "10.50.1.0/25") })
	}
	progress(200)
	clustertest.EditPool(t, c.ds, "blue", clustertest.DrainRange("10.50.0.0/25", true))
	for _, n := range nodes {
		waitFollowed(t, n, "10.50.0.0/25 draining", func() bool {
			p, err := n.m.EnsurePool(ctx, "blue", nil)
			if err != nil || len(p.Ranges[0]) != 1 {
				return false
			}
			for _, b := range n.l.Blocks("blue") {
				if in("10.50.0.0/25", b.Prefix.Addr()) && b.State != ledger.BlockDraining {
					return false
				}
			}
			return true
		})
	}
	drained.Store(true)
	progress(300)
	close(stop)
	wg.Wait()
	if len(problems) > 0 {
		t.Fatalf("%d problems, first: %s", len(problems), strings.Join(problems[:min(5, len(problems))], "; "))
	}
	for _, n := range nodes {
		if err := n.m.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if p, err := n.l.Pool("blue"); err != nil || p.InUse != 0 {
			t.Fatalf("%s: pool after every release: %+v %v", n.name, p, err)
		}
		if got := poolRanges(n, "blue"); got != "10.50.1.0/25" {
			t.Errorf("%s: ledger ranges %s after the drain, want 10.50.1.0/25", n.name, got)
		}
	}
	bs, err := cluster.ReadBlocks(ctx, c.ds)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range bs {
		if r.Network == "blue" && in("10.50.0.0/25", r.CIDR.Addr()) {
			t.Errorf("block %s of the drained range still recorded (owner %q) after its leases were released", r.CIDR, r.Owner)
		}
	}
	t.Logf("%d allocations on %d nodes; blocks of blue now: %d", allocs, len(nodes), len(bs))
}
