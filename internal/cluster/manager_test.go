package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

var ctx = context.Background()

const v4 = `[[{"subnet":"10.20.0.0/24"}]]`

// Allocation claims blocks only when the node's blocks are full: 130 addresses from a
// /24 in /26 blocks take three blocks (the first has 62 usable: .0 and the gateway
// .1 are not handed out), and concurrent ADDs do not claim more than they need.
func TestAllocateClaimsBlocksAsNeeded(t *testing.T) { forBackends(t, testAllocateClaimsBlocksAsNeeded) }

func testAllocateClaimsBlocksAsNeeded(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("node-a", ranges(t, v4), []int{26})
	var wg sync.WaitGroup
	errs := make(chan error, 130)
	for w := 0; w < 10; w++ {
		wg.Go(func() {
			for i := 0; i < 13; i++ {
				if _, err := a.alloc(t, fmt.Sprintf("w%d-%d", w, i)); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	bs := a.l.Blocks("net")
	if len(bs) != 3 {
		t.Fatalf("node holds %d blocks, want 3: %+v", len(bs), bs)
	}
	for _, b := range bs {
		r := blockRec(t, c.ds, b.Prefix.String())
		if r.Owner != "node-a" || r.Epoch != b.Epoch || r.Epoch != 1 {
			t.Fatalf("block %s in the datastore: %+v; ledger epoch %d", b.Prefix, r, b.Epoch)
		}
	}
	// a fourth block, and then the pool is exhausted cluster-wide
	for i := 0; i < 253-130; i++ { // 253 usable: the gateway .1 is not handed out
		a.mustAlloc(t, fmt.Sprint("more", i))
	}
	_, err := a.alloc(t, "one-too-many")
	if !errors.Is(err, ledger.ErrPoolExhausted) || !errors.Is(err, cluster.ErrNoFreeBlock) {
		t.Fatalf("exhausted cluster pool: err = %v, want ErrNoFreeBlock and ErrPoolExhausted", err)
	}
	st := a.m.Status("net")
	if st.Degraded || st.Available || !st.Provable {
		t.Fatalf("status of an exhausted pool with a reachable datastore: %+v (exhausted, not degraded)", st)
	}
}

// Claims racing for the last free block: exactly one winner, whether the block was
// never claimed or was given back (owner "").
func TestClaimRaceLastBlock(t *testing.T) { forBackends(t, testClaimRaceLastBlock) }

func testClaimRaceLastBlock(t *testing.T, newC func(*testing.T) *cl) {
	for _, tc := range []struct {
		name      string
		givenBack bool
	}{{"never claimed", false}, {"given back", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newC(t)
			r := ranges(t, `[[{"subnet":"10.30.0.0/25"}]]`) // two /26 blocks
			first := c.agent("node-0", r, []int{26})
			if _, err := first.m.Claim(ctx, "net", 0); err != nil {
				t.Fatal(err)
			}
			first.mustAlloc(t, "keeps-its-block") // node-0's first block is not empty
			if tc.givenBack {
				// node-0 also takes the second block and gives it back after the grace
				p, err := first.m.Claim(ctx, "net", 0)
				if err != nil {
					t.Fatal(err)
				}
				for i := 0; i < 3; i++ {
					if err := first.m.Renew(ctx); err != nil {
						t.Fatal(err)
					}
					if err := first.m.Sweep(ctx); err != nil {
						t.Fatal(err)
					}
					c.clk.Advance(40 * time.Second)
				}
				if rec := blockRec(t, c.ds, p.String()); rec.Owner != "" || rec.Epoch != 2 {
					t.Fatalf("block %s not given back: %+v", p, rec)
				}
				if n := len(first.l.Blocks("net")); n != 1 {
					t.Fatalf("node-0 holds %d blocks after giving one back", n)
				}
			}
			const n = 8
			var racers []*agent
			for i := 1; i <= n; i++ {
				racers = append(racers, c.agent(fmt.Sprintf("node-%d", i), r, []int{26}))
			}
			var wg sync.WaitGroup
			won := make(chan string, n)
			lost := make(chan error, n)
			start := make(chan struct{})
			for _, a := range racers {
				wg.Go(func() {
					<-start
					if _, err := a.m.Claim(ctx, "net", 0); err != nil {
						lost <- err
						return
					}
					won <- a.name
				})
			}
			close(start)
			wg.Wait()
			close(won)
			close(lost)
			var winners []string
			for w := range won {
				winners = append(winners, w)
			}
			if len(winners) != 1 {
				t.Fatalf("winners %v, want exactly one", winners)
			}
			for err := range lost {
				if !errors.Is(err, cluster.ErrNoFreeBlock) {
					t.Fatalf("a loser's error: %v, want ErrNoFreeBlock", err)
				}
			}
			rec := blockRec(t, c.ds, "10.30.0.64/26")
			want := uint64(1)
			if tc.givenBack {
				want = 3
			}
			if rec.Owner != winners[0] || rec.Epoch != want {
				t.Fatalf("last block: %+v, want owner %s at epoch %d", rec, winners[0], want)
			}
			for _, a := range racers {
				if has := len(a.l.Blocks("net")) > 0; has != (a.name == winners[0]) {
					t.Fatalf("%s holds blocks %v", a.name, a.l.Blocks("net"))
				}
			}
		})
	}
}

// Hand-back: a block empty on two observations a grace apart, nothing allocated in
// between, is given back; one used in between waits a grace more; the node keeps its
// last block.
func TestHandBackAfterGrace(t *testing.T) { forBackends(t, testHandBackAfterGrace) }

func testHandBackAfterGrace(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("node-a", ranges(t, v4), []int{26})
	sweep := func() {
		t.Helper()
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.m.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	alloc := func(cid, uid string) ledger.Lease {
		t.Helper()
		ls, _, err := a.m.Allocate(ctx, ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, Pod: ledger.Pod{UID: uid}})
		if err != nil {
			t.Fatal(err)
		}
		return ls
	}
	for i := 0; i < 130; i++ { // three blocks: 62 + 64 + 4
		alloc(fmt.Sprint("p", i), fmt.Sprint("u", i))
	}
	if n := len(a.l.Blocks("net")); n != 3 {
		t.Fatalf("%d blocks", n)
	}
	for i := 0; i < 129; i++ { // p129 keeps the third block busy
		a.release(t, fmt.Sprint("p", i))
	}
	sweep() // first observation
	c.clk.Advance(30 * time.Second)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	// the same pod UID gets its address in the second block back, then goes
	if ls := alloc("brief", "u70"); ls.IPs[0].Addr().String() != "10.20.0.72" {
		t.Fatalf("brief got %v", ls.IPs)
	}
	a.release(t, "brief")
	c.clk.Advance(30 * time.Second)
	sweep()
	bs := a.l.Blocks("net")
	if len(bs) != 2 || bs[0].Prefix.String() != "10.20.0.64/26" {
		t.Fatalf("after the grace: blocks %+v, want the unused first block given back and the second kept (used within the grace)", bs)
	}
	if rec := blockRec(t, c.ds, "10.20.0.0/26"); rec.Owner != "" || rec.Epoch != 2 {
		t.Fatalf("given-back block %+v, want free at epoch 2", rec)
	}
	c.clk.Advance(59 * time.Second)
	sweep()
	if n := len(a.l.Blocks("net")); n != 2 {
		t.Fatalf("given back before its grace: %d left", n)
	}
	c.clk.Advance(time.Second)
	sweep()
	if bs := a.l.Blocks("net"); len(bs) != 1 || bs[0].Prefix.String() != "10.20.0.128/26" {
		t.Fatalf("blocks %+v, want only the busy one", bs)
	}
	a.release(t, "p129")
	for i := 0; i < 3; i++ {
		c.clk.Advance(2 * time.Minute)
		sweep()
	}
	if n := len(a.l.Blocks("net")); n != 1 {
		t.Fatalf("the last block was given back: %d left", n)
	}
	views, err := a.m.Blocks(ctx)
	if err != nil || len(views) != 3 || !views[2].Local || views[2].Owner != "node-a" || views[0].Owner != "" {
		t.Fatalf("blocks view %+v %v", views, err)
	}
}

// Fencing: when renewals stop, the node hands out nothing once TTL - margin has passed
// since the last successful renewal was sent, even from blocks with free addresses;
// the datastore unreachable but the lease provable, it keeps allocating; STATUS says
// degraded when it has no free address without a new block.
func TestFencingStopsAllocation(t *testing.T) { forBackends(t, testFencingStopsAllocation) }

func testFencingStopsAllocation(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("node-a", ranges(t, v4), []int{26})
	for i := 0; i < 60; i++ {
		a.mustAlloc(t, fmt.Sprint("p", i))
	}
	c.clk.Advance(2 * time.Second)
	if err := a.m.Renew(ctx); err != nil { // sent at t=2s: provable until 2+9-1 = 10s
		t.Fatal(err)
	}
	a.ds.cut.Store(true)
	c.clk.Advance(3 * time.Second)
	if err := a.m.Renew(ctx); !errors.Is(err, datastoreUnavailable) {
		t.Fatalf("renew while partitioned: %v", err)
	}
	a.mustAlloc(t, "offline-1") // owned, provable block: served without the datastore
	if st := a.m.Status("net"); st.Degraded || st.Reachable || !st.Provable {
		t.Fatalf("status with free addresses, datastore unreachable: %+v, want not degraded", st)
	}
	a.mustAlloc(t, "offline-2") // the block's last address
	st := a.m.Status("net")
	if !st.Degraded || st.Available {
		t.Fatalf("status with a full block and no datastore: %+v, want degraded", st)
	}
	if _, err := a.alloc(t, "needs-a-block"); !errors.Is(err, ledger.ErrPoolExhausted) {
		t.Fatalf("allocation needing a block while partitioned: %v", err)
	}
	a.release(t, "p0")
	a.release(t, "p1")
	c.clk.Advance(5*time.Second - time.Nanosecond) // just before 10s
	a.mustAlloc(t, "last-provable")
	c.clk.Advance(time.Nanosecond) // 10s: the lease may have expired by now
	if _, err := a.alloc(t, "fenced"); !errors.Is(err, cluster.ErrFenced) {
		t.Fatalf("allocation past TTL-margin: err = %v, want ErrFenced", err)
	}
	if err := a.m.Sweep(ctx); err == nil {
		t.Log("sweep while partitioned reported no error")
	}
	for _, b := range a.l.Blocks("net") {
		if b.State != ledger.BlockSuspended {
			t.Fatalf("block %s is %s after the lease lapsed, want suspended", b.Prefix, b.State)
		}
	}
	if st := a.m.Status("net"); !st.Degraded || st.Provable {
		t.Fatalf("status while fenced: %+v", st)
	}
	// a DEL while fenced is recorded locally
	a.release(t, "p2")
	// back: nobody took the block (no quarantine passed), so it resumes
	a.ds.cut.Store(false)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range a.l.Blocks("net") {
		if b.State != ledger.BlockActive {
			t.Fatalf("block %s is %s after the renewal, want active", b.Prefix, b.State)
		}
	}
	a.mustAlloc(t, "after")
}

var datastoreUnavailable = errUnavailable()

// A node partitioned past its lease: its block is reclaimed by another agent only
// after the quarantine; when it comes back it allocates nothing from the lost block,
// and the DEL of its pod there touches only its own ledger, never the new owner's
// lease on the same address.
func TestLapseReclaimResume(t *testing.T) { forBackends(t, testLapseReclaimResume) }

func testLapseReclaimResume(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.40.0.0/25"}]]`)
	a := c.agent("node-a", r, []int{26})
	b := c.agent("node-b", r, []int{26})
	old := a.mustAlloc(t, "pod-x")
	lostBlock := netip.MustParsePrefix("10.40.0.0/26")
	if !lostBlock.Contains(old.IPs[0].Addr()) {
		t.Fatalf("pod-x got %v", old.IPs)
	}
	step := func(ag *agent) {
		_ = ag.m.Renew(ctx)
		_ = ag.m.Sweep(ctx)
	}
	a.ds.cut.Store(true)
	// b watches: a's lease expires 9 s after its last renewal; quarantine 9 s more
	var reclaimedAt time.Duration
	for i := 0; i < 12; i++ {
		c.clk.Advance(3 * time.Second)
		step(a)
		step(b)
		if rec := blockRec(t, c.ds, lostBlock.String()); rec.Owner == "" {
			reclaimedAt = time.Duration(i+1) * 3 * time.Second
			break
		}
	}
	if reclaimedAt == 0 {
		t.Fatal("a's block was never reclaimed")
	}
	if reclaimedAt < 2*ttl {
		t.Fatalf("reclaimed %s after the partition, before lease TTL + quarantine (%s)", reclaimedAt, 2*ttl)
	}
	t.Logf("a's block reclaimed %s after the partition", reclaimedAt)
	if rec := blockRec(t, c.ds, lostBlock.String()); rec.Epoch != 2 {
		t.Fatalf("reclaimed block %+v, want epoch 2", rec)
	}
	// b needs a block: b already owns 10.40.0.64/26? No: b has none yet; it takes
	// the free one first and hands out pod-x's address again (pod-x's node is
	// presumed dead).
	var dup ledger.Lease
	for i := 0; ; i++ {
		ls := b.mustAlloc(t, fmt.Sprint("b-pod", i))
		if ls.IPs[0] == old.IPs[0] {
			dup = ls
			break
		}
		if i > 70 {
			t.Fatalf("b never reached pod-x's address %v", old.IPs)
		}
	}
	if got := blockRec(t, c.ds, lostBlock.String()); got.Owner != "node-b" || got.Epoch != 3 {
		t.Fatalf("block after b's claim: %+v", got)
	}
	// a comes back
	a.ds.cut.Store(false)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	bs := a.l.Blocks("net")
	if len(bs) != 1 || bs[0].State != ledger.BlockLost || bs[0].Prefix != lostBlock {
		t.Fatalf("a's blocks after coming back: %+v, want the block lost", bs)
	}
	c.allowOutside = true // pod-x is still running in a's lost block until its DEL
	ls := a.mustAlloc(t, "pod-y")
	if lostBlock.Contains(ls.IPs[0].Addr()) {
		t.Fatalf("a allocated %v from its lost block", ls.IPs)
	}
	a.release(t, "pod-x")
	c.allowOutside = false
	if h, ok := b.l.Holder("net", old.IPs[0].Addr()); !ok || h != dup.Key {
		t.Fatalf("b's lease on %v after a's DEL: %v %v; a's DEL must not touch it", old.IPs, h, ok)
	}
	if hist, _ := b.l.History("net", old.IPs[0].Addr()); len(hist) != 0 {
		t.Fatalf("b's history of %v: %+v", old.IPs, hist)
	}
	if hist, _ := a.l.History("net", old.IPs[0].Addr()); len(hist) != 1 || hist[0].Key.ContainerID != "pod-x" {
		t.Fatalf("a's history of %v: %+v, want pod-x's DEL recorded locally", old.IPs, hist)
	}
	if n := len(a.l.Blocks("net")); n != 1 {
		t.Fatalf("a's ledger still holds %d blocks, want only its new one", n)
	}
}

// A dead node's blocks are reclaimed by exactly one of several live agents sweeping
// at once, and only after the quarantine.
func TestReclaimExactlyOne(t *testing.T) { forBackends(t, testReclaimExactlyOne) }

func testReclaimExactlyOne(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.50.0.0/24"}]]`)
	dead := c.agent("node-dead", r, []int{26})
	for i := 0; i < 100; i++ { // two blocks
		dead.mustAlloc(t, fmt.Sprint("p", i))
	}
	var live []*agent
	for i := 0; i < 4; i++ {
		live = append(live, c.agent(fmt.Sprintf("node-%d", i), r, []int{26}))
	}
	dead.ds.cut.Store(true) // it stops renewing
	sweepAll := func() {
		var wg sync.WaitGroup
		for _, a := range live {
			wg.Go(func() {
				_ = a.m.Renew(ctx)
				_ = a.m.Sweep(ctx)
			})
		}
		wg.Wait()
	}
	sweepAll()
	for elapsed := time.Duration(0); elapsed < 2*ttl-3*time.Second; elapsed += 3 * time.Second {
		c.clk.Advance(3 * time.Second)
		sweepAll()
		for _, b := range dead.l.Blocks("net") {
			if rec := blockRec(t, c.ds, b.Prefix.String()); rec.Owner != "node-dead" {
				t.Fatalf("block %s reclaimed %s after the node stopped, before TTL + quarantine", b.Prefix, elapsed+3*time.Second)
			}
		}
	}
	for i := 0; i < 3; i++ {
		c.clk.Advance(3 * time.Second)
		sweepAll()
	}
	var frees int64
	for _, a := range live {
		frees += a.ds.frees.Load()
	}
	if frees != 2 {
		t.Fatalf("%d successful reclaims for 2 blocks, want exactly one per block", frees)
	}
	for _, b := range dead.l.Blocks("net") {
		if rec := blockRec(t, c.ds, b.Prefix.String()); rec.Owner != "" || rec.Epoch != 2 {
			t.Fatalf("block %s after reclaim: %+v, want free at epoch 2", b.Prefix, rec)
		}
	}
	// the dead node's leases are outside its blocks now: the audit says so
	c.allowOutside = true
	blocks, _ := cluster.ReadBlocks(ctx, c.ds)
	rep := cluster.Audit(blocks, []cluster.NodeBooks{{Node: "node-dead", Leases: dead.l.Leases(""), Blocks: dead.l.Blocks("")}})
	if rep.OK || len(rep.Outside) != 100 || !strings.Contains(rep.Outside[0].Why, "owned by") {
		t.Fatalf("audit of the dead node's books: ok=%v, %d outside", rep.OK, len(rep.Outside))
	}
}

// NodeGone: a deleted Node's blocks are reclaimed once its lease ran out, without the
// quarantine, and not before. NodeBack: a Node deleted and registered again under its
// name (its kubelet still runs, and so may its pods) is a live node again: when its
// agent stops renewing, its blocks wait out the quarantine after the lease, as any
// node's do.
func TestNodeGone(t *testing.T) { forBackends(t, testNodeGone) }

func testNodeGone(t *testing.T, newC func(*testing.T) *cl) {
	for _, back := range []bool{false, true} {
		t.Run(fmt.Sprintf("registered again %v", back), func(t *testing.T) {
			c := newC(t)
			r := ranges(t, v4)
			gone := c.agent("node-gone", r, []int{26})
			gone.mustAlloc(t, "p")
			w := c.agent("node-w", r, []int{26})
			gone.ds.cut.Store(true)
			w.m.NodeGone("node-gone")
			if back {
				w.m.NodeBack("node-gone")
			}
			owner := func() string { return blockRec(t, c.ds, "10.20.0.0/26").Owner }
			step := func() { _ = w.m.Renew(ctx); _ = w.m.Sweep(ctx) }
			step()
			c.clk.Advance(ttl - time.Second)
			step()
			if o := owner(); o != "node-gone" {
				t.Fatalf("reclaimed before the node's lease ran out: owner %q", o)
			}
			c.clk.Advance(2 * time.Second)
			step()
			step()
			if back {
				if o := owner(); o != "node-gone" {
					t.Fatalf("re-registered node's block reclaimed when its lease ran out, before the quarantine: owner %q", o)
				}
				c.clk.Advance(ttl) // the quarantine (one TTL here)
				step()
				step()
			}
			if o := owner(); o != "" {
				t.Fatalf("block not reclaimed (owner %q)", o)
			}
			c.allowOutside = true
		})
	}
}

// TestSweepReadsWatchedBlocks: the periodic sweep does not LIST every block each
// time: between full lists, once a quarantine, it reads the blocks of the networks
// set up on its node from the watched copy the claims keep. A dead node's block is
// still reclaimed, by exactly one node, after its lease and the quarantine.
func TestSweepReadsWatchedBlocks(t *testing.T) { forBackends(t, testSweepReadsWatchedBlocks) }

func testSweepReadsWatchedBlocks(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, v4)
	start := func(name string) *agent {
		o := c.opts(name)
		o.Quarantine = 3 * ttl
		return c.agentOn(name, memstore.New(), o, r, []int{26})
	}
	dead := start("node-dead")
	dead.mustAlloc(t, "p")
	live := []*agent{start("node-a"), start("node-b")}
	for _, a := range live {
		a.mustAlloc(t, "p")
	}
	dead.ds.cut.Store(true)
	lists := map[string]int64{}
	for _, a := range live {
		lists[a.name] = a.ds.lists.Load()
	}
	const sweeps = 24 // every ttl/5, past the lease and the quarantine (4 TTLs)
	for i := 0; i < sweeps; i++ {
		for _, a := range live {
			_ = a.m.Renew(ctx)
			_ = a.m.Sweep(ctx)
		}
		c.clk.Advance(ttl / 5)
	}
	if rec := blockRec(t, c.ds, "10.20.0.0/26"); rec.Owner != "" || rec.Epoch != 2 {
		t.Fatalf("dead node's block after the lease and the quarantine: %+v, want free at epoch 2", rec)
	}
	var frees int64
	for _, a := range live {
		frees += a.ds.frees.Load()
		// full lists at the first sweep and a quarantine later; the network's copy
		// may have been listed once more
		if n := a.ds.lists.Load() - lists[a.name]; n > 3 {
			t.Errorf("%s sent %d Lists in %d sweeps over %v, want at most 3 (one per %v quarantine, one of the network)", a.name, n, sweeps, sweeps*ttl/5, 3*ttl)
		}
		// ipledger_block_lists_total counts every one the node sent
		if got, sent := a.m.Counts().BlockLists, a.ds.lists.Load(); got != uint64(sent) {
			t.Errorf("%s counts %d block Lists, sent %d", a.name, got, sent)
		}
	}
	if frees != 1 {
		t.Fatalf("%d successful reclaims of one block, want exactly one", frees)
	}
	c.allowOutside = true
}

// A second node configured with another block size, or other range sets
// (families), for the same network is refused with an error naming both configs;
// one whose conflist has another range of the same family is not (it extends the
// pool: TestConflistExtendsPool).
func TestPoolConfigConflict(t *testing.T) { forBackends(t, testPoolConfigConflict) }

func testPoolConfigConflict(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	c.agent("node-a", ranges(t, v4), []int{26})
	b := c.agent("node-b", nil, nil)
	err := b.m.EnsureNetwork(ctx, "net", ranges(t, `[[{"subnet":"10.20.0.0/24"}],[{"subnet":"fd00:21::/120"}]]`), []int{26, 122})
	if !errors.Is(err, cluster.ErrPoolMismatch) || !strings.Contains(err.Error(), "10.20.0.0/24") || !strings.Contains(err.Error(), "fd00:21::/120") {
		t.Fatalf("another range set: %v", err)
	}
	err = b.m.EnsureNetwork(ctx, "net", ranges(t, v4), []int{27})
	if !errors.Is(err, cluster.ErrPoolMismatch) || !strings.Contains(err.Error(), "blockSize") {
		t.Fatalf("other block size: %v", err)
	}
	if err := b.m.EnsureNetwork(ctx, "net", ranges(t, v4), []int{26}); err != nil {
		t.Fatalf("same config: %v", err)
	}
	if _, err := b.alloc(t, "x"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.m.Allocate(ctx, ledger.AllocateRequest{Key: ledger.Key{Network: "other", ContainerID: "x", IfName: "eth0"}}); !errors.Is(err, cluster.ErrUnknownNetwork) {
		t.Fatalf("allocation in a network not set up: %v", err)
	}
}

// Dual-stack: one block per range set; the first allocation claims both.
func TestDualStack(t *testing.T) { forBackends(t, testDualStack) }

func testDualStack(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.60.0.0/24"}],[{"subnet":"fd00:60::/64"}]]`)
	bits, err := cluster.BlockBits(r, 0)
	if err != nil || fmt.Sprint(bits) != "[26 122]" {
		t.Fatalf("default block bits %v %v", bits, err)
	}
	a := c.agent("node-a", r, bits)
	ls := a.mustAlloc(t, "p")
	bs := a.l.Blocks("net")
	if len(bs) != 2 || bs[0].Set != 0 || bs[1].Set != 1 {
		t.Fatalf("blocks %+v, want one per range set", bs)
	}
	// the IPv4 set has 4 blocks: searched from its start; the IPv6 one has 2^58:
	// searched from a place of this node's own
	if ls.IPs[0].String() != "10.60.0.2/24" || !bs[1].Prefix.Contains(ls.IPs[1].Addr()) || ls.IPs[1].Bits() != 64 {
		t.Fatalf("got %v from blocks %v and %v", ls.IPs, bs[0].Prefix, bs[1].Prefix)
	}
	if rec := blockRec(t, c.ds, bs[1].Prefix.String()); rec.Owner != "node-a" || rec.Set != 1 {
		t.Fatalf("IPv6 block %+v", rec)
	}
}

// A restarted agent (same ledger, new process) resumes the blocks the datastore still
// gives its node and claims nothing new; blocks the datastore gives the node that its
// ledger lacks (a crash between claim and ledger write) are adopted.
func TestRestartResumesAndAdopts(t *testing.T) { forBackends(t, testRestartResumesAndAdopts) }

func testRestartResumesAndAdopts(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, v4)
	st := memstore.New()
	a := c.agentOn("node-a", st, c.opts("node-a"), r, []int{26})
	a.mustAlloc(t, "p")
	if err := a.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// a block claimed in the datastore whose ledger write was lost
	rec := cluster.BlockRecord{Network: "net", CIDR: netip.MustParsePrefix("10.20.0.192/26"), Owner: "node-a", Epoch: 4}
	if _, err := c.ds.Create(ctx, cluster.BlockKey("net", rec.CIDR), mustJSON(t, rec)); err != nil {
		t.Fatal(err)
	}
	c.clk.Advance(time.Second)
	a2 := c.agentOn("node-a", st, c.opts("node-a"), r, []int{26})
	c.agents = c.agents[1:] // the first process is gone; its ledger is a2's
	writes := a2.ds.writes.Load()
	bs := a2.l.Blocks("net")
	if len(bs) != 2 || bs[0].State != ledger.BlockActive || bs[1].State != ledger.BlockActive || bs[1].Epoch != 4 {
		t.Fatalf("after restart: %+v, want both blocks active", bs)
	}
	a2.mustAlloc(t, "q")
	if a2.ds.writes.Load() != writes {
		t.Fatalf("an allocation from an owned block wrote to the datastore")
	}
}

func TestBlockBits(t *testing.T) {
	for _, tc := range []struct {
		ranges string
		size   int
		want   string
		err    string
	}{
		{`[[{"subnet":"10.0.0.0/16"}]]`, 0, "[26]", ""},
		{`[[{"subnet":"10.0.0.0/16"}],[{"subnet":"fd00::/64"}]]`, 24, "[24 120]", ""},
		{`[[{"subnet":"fd00::/64"}]]`, 120, "[120]", ""},
		{`[[{"subnet":"10.0.0.0/16"}]]`, 120, "", "IPv6 prefix length"},
		{`[[{"subnet":"10.0.0.0/16"}]]`, 31, "", "blockSize"},
		{`[[{"subnet":"10.0.0.0/16"}]]`, 8, "", "blockSize"},
		{`[[{"subnet":"10.0.0.0/16"}]]`, -1, "", "blockSize"},
	} {
		got, err := cluster.BlockBits(ranges(t, tc.ranges), tc.size)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("BlockBits(%s, %d) = %v, %v; want an error naming %q", tc.ranges, tc.size, got, err, tc.err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("BlockBits(%s, %d) = %v, %v; want %s", tc.ranges, tc.size, got, err, tc.want)
		}
	}
	for in, want := range map[string]string{"10.0.0.64/26": "10-0-0-64-26", "fd00::40/122": "fd00--40-122"} {
		if got := cluster.BlockName(netip.MustParsePrefix(in)); got != want {
			t.Errorf("BlockName(%s) = %s, want %s", in, got, want)
		}
	}
	if got := cluster.EncodeName("My_net.1"); got != ".4dy.5fnet.2e1" {
		t.Errorf("EncodeName = %s", got)
	}
}

// The cluster audit finds an address held on two nodes and one held outside the
// node's blocks.
func TestAuditFindsDuplicates(t *testing.T) {
	p := netip.MustParsePrefix("10.0.0.0/26")
	blocks := []cluster.BlockRecord{{Network: "net", CIDR: p, Owner: "a", Epoch: 2}}
	lease := func(cid, ip string) ledger.Lease {
		return ledger.Lease{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, IPs: []netip.Prefix{netip.MustParsePrefix(ip)}}
	}
	books := []cluster.NodeBooks{
		{Node: "a", Leases: []ledger.Lease{lease("x", "10.0.0.5/24")}, Blocks: []ledger.BlockStatus{{BlockRecord: ledger.BlockRecord{Network: "net", Prefix: p, Epoch: 2, State: ledger.BlockActive}}}},
		{Node: "b", Leases: []ledger.Lease{lease("y", "10.0.0.5/24"), lease("z", "10.0.1.5/24")}},
	}
	rep := cluster.Audit(blocks, books)
	if rep.OK || len(rep.DoubleHeld) != 1 || len(rep.Outside) != 2 {
		t.Fatalf("audit %+v, want one double and two outside", rep)
	}
	books[1].Leases = nil
	books[0].Blocks[0].Epoch = 1
	rep = cluster.Audit(blocks, books)
	if rep.OK || len(rep.Outside) != 1 || !strings.Contains(rep.Outside[0].Why, "epoch") {
		t.Fatalf("a lease in a block held at an old epoch: %+v", rep)
	}
	books[0].Blocks[0].Epoch = 2
	if rep := cluster.Audit(blocks, books); !rep.OK {
		t.Fatalf("clean books: %+v", rep)
	}
}

// An agent restarted while the datastore is unreachable hands out nothing (it cannot
// prove its lease or its blocks), accepts its network from its ledger, and resumes
// once the datastore answers.
func TestStartWhileUnreachable(t *testing.T) { forBackends(t, testStartWhileUnreachable) }

func testStartWhileUnreachable(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, v4)
	st := memstore.New()
	a := c.agentOn("node-a", st, c.opts("node-a"), r, []int{26})
	a.mustAlloc(t, "p")
	if err := a.m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	c.agents = nil
	l, err := ledger.Open(st, ledger.Options{Clock: c.clk})
	if err != nil {
		t.Fatal(err)
	}
	d := &netDS{Store: c.open()}
	d.cut.Store(true)
	m, err := cluster.New(d, l, c.opts("node-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(ctx); !errors.Is(err, datastoreUnavailable) {
		t.Fatalf("start while unreachable: %v", err)
	}
	if err := m.EnsureNetwork(ctx, "net", r, []int{26}); err != nil {
		t.Fatalf("network the ledger holds, datastore unreachable: %v", err)
	}
	a2 := &agent{name: "node-a", m: m, l: l, ds: d, st: st}
	c.agents = append(c.agents, a2)
	if _, err := a2.alloc(t, "q"); !errors.Is(err, cluster.ErrFenced) {
		t.Fatalf("allocation before the lease is proven: %v", err)
	}
	if st := m.Status("net"); !st.Degraded || st.Provable {
		t.Fatalf("status: %+v", st)
	}
	a2.release(t, "p") // DEL works offline
	d.cut.Store(false)
	if err := m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	a2.mustAlloc(t, "q")
	if st := m.Status("net"); st.Degraded || !st.Provable || !st.Available {
		t.Fatalf("status after the renewal: %+v", st)
	}
}

// A give-back whose write cannot reach the datastore takes the block out of the
// ledger only for as long as the datastore is away: the sweep after it comes back
// sees the block still the node's and adds it back; nothing is lost.
func TestGiveBackUnreachable(t *testing.T) { forBackends(t, testGiveBackUnreachable) }

func testGiveBackUnreachable(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("node-a", ranges(t, v4), []int{26})
	for i := 0; i < 63; i++ { // two blocks, the second holding one pod
		a.mustAlloc(t, fmt.Sprint("p", i))
	}
	for i := 0; i < 62; i++ {
		a.release(t, fmt.Sprint("p", i))
	}
	step := func() error {
		if err := a.m.Renew(ctx); err != nil {
			return err
		}
		return a.m.Sweep(ctx)
	}
	if err := step(); err != nil {
		t.Fatal(err)
	}
	c.clk.Advance(time.Minute)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	a.ds.cut.Store(true)
	if err := a.m.Sweep(ctx); err == nil {
		t.Fatal("sweep with an unreachable datastore reported nothing")
	}
	if n := len(a.l.Blocks("net")); n != 1 {
		t.Fatalf("%d blocks in the ledger, want the empty one out", n)
	}
	if rec := blockRec(t, c.ds, "10.20.0.0/26"); rec.Owner != "node-a" {
		t.Fatalf("block record %+v changed although the write never arrived", rec)
	}
	a.ds.cut.Store(false)
	if err := step(); err != nil {
		t.Fatal(err)
	}
	bs := a.l.Blocks("net")
	if len(bs) != 2 || bs[0].Prefix.String() != "10.20.0.0/26" || bs[0].State != ledger.BlockActive {
		t.Fatalf("blocks after the datastore came back: %+v, want the block added back", bs)
	}
}

// In a range set of many blocks, nodes start their search at places of their own
// (claiming at once, they rarely race for one block) and still find every block:
// three nodes claiming concurrently take all 128 blocks of a /19, each exactly once,
// and then learn that none is left.
func TestClaimSpreadTakesEveryBlock(t *testing.T) { forBackends(t, testClaimSpreadTakesEveryBlock) }

func testClaimSpreadTakesEveryBlock(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.80.0.0/19"}]]`)
	var agents []*agent
	for i := 0; i < 3; i++ {
		agents = append(agents, c.agent(fmt.Sprintf("node-%d", i), r, []int{26}))
	}
	firsts := map[string]bool{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	// every node makes its first claim before any makes a second: claims from the
	// watched cache are fast enough that two nodes could take all 128 blocks before
	// a third one, scheduled late on a loaded machine, makes its first
	var first sync.WaitGroup
	first.Add(len(agents))
	for _, a := range agents {
		wg.Go(func() {
			for i := 0; ; i++ {
				p, err := a.m.Claim(ctx, "net", 0)
				if i == 0 {
					first.Done()
					first.Wait()
				}
				if errors.Is(err, cluster.ErrNoFreeBlock) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i == 0 {
					mu.Lock()
					firsts[p.String()] = true
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if len(firsts) != 3 || firsts["10.80.0.0/26"] {
		t.Errorf("first blocks %v: want three different ones away from the pool's start", firsts)
	}
	blocks, err := cluster.ReadBlocks(ctx, c.ds)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, a := range agents {
		held += len(a.l.Blocks("net"))
	}
	if len(blocks) != 128 || held != 128 {
		t.Fatalf("%d blocks in the datastore, %d in the ledgers; want all 128 once", len(blocks), held)
	}
	for _, b := range blocks {
		if b.Owner == "" || b.Epoch != 1 {
			t.Fatalf("block %+v", b)
		}
	}
}
