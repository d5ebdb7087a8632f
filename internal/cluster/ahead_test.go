package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// Claiming ahead: once the node's blocks of a range set have fewer than a quarter
// of a block free, ClaimAhead claims the set's next block, so the ADDs that follow
// do not wait for a claim; not before, not twice, not the pool's last claimable
// block, and not while the lease is not provable. Hand-back keeps the block it
// claimed while taking it away would leave the set low again.
func TestClaimAhead(t *testing.T) { forBackends(t, testClaimAhead) }

func testClaimAhead(t *testing.T, newC func(*testing.T) *cl) {
	ctx := context.Background()
	claimAhead := func(t *testing.T, a *agent, want int) {
		t.Helper()
		n, err := a.m.ClaimAhead(ctx)
		if err != nil || n != want {
			t.Fatalf("%s: ClaimAhead = %d, %v; want %d claimed (blocks %+v)", a.name, n, err, want, a.l.Blocks("net"))
		}
	}
	// fill allocates pods p<from> to p<to-1>
	fill := func(t *testing.T, a *agent, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			a.mustAlloc(t, fmt.Sprint("p", i))
		}
	}
	blocks := func(t *testing.T, a *agent, want int) {
		t.Helper()
		if bs := a.l.Blocks("net"); len(bs) != want {
			t.Fatalf("%s holds %d blocks, want %d: %+v", a.name, len(bs), want, bs)
		}
	}

	t.Run("low water", func(t *testing.T) {
		c := newC(t)
		a := c.agent("node-a", ranges(t, v4), []int{26}) // four /26 blocks
		// the first block has 62 usable addresses: low below 62/4 = 15 free
		fill(t, a, 0, 47)
		claimAhead(t, a, 0) // 15 free: not low, nothing asked for
		blocks(t, a, 1)
		a.mustAlloc(t, "p47") // 14 free
		claimAhead(t, a, 1)
		blocks(t, a, 2)
		if got := a.m.Counts(); got.Claims != 2 || got.ClaimsAhead != 1 {
			t.Fatalf("counts %+v, want 2 claims, 1 of them ahead", got)
		}
		a.mustAlloc(t, "p48")
		claimAhead(t, a, 0) // 13 + 64 free: not low
		blocks(t, a, 2)
		// the next 62 ADDs (down to 15 free) need no claim of their own
		writes := a.ds.writes.Load()
		fill(t, a, 49, 49+13+64-15)
		if w := a.ds.writes.Load(); w != writes {
			t.Fatalf("%d datastore writes while the blocks had room", w-writes)
		}
		claimAhead(t, a, 1) // 15 free of a 64-address block: low again
		blocks(t, a, 3)
	})

	t.Run("hand-back keeps the headroom", func(t *testing.T) {
		c := newC(t)
		a := c.agent("node-a", ranges(t, v4), []int{26})
		fill(t, a, 0, 50)
		claimAhead(t, a, 1)
		sweepFor := func(d time.Duration) {
			t.Helper()
			for end := c.clk.Now().Add(d); c.clk.Now().Before(end); c.clk.Advance(5 * time.Second) {
				if err := a.m.Renew(ctx); err != nil {
					t.Fatal(err)
				}
				if err := a.m.Sweep(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		sweepFor(3 * time.Minute) // three graces: the empty second block stays (12 free without it)
		blocks(t, a, 2)
		for i := 0; i < 30; i++ {
			a.release(t, fmt.Sprint("p", i))
		}
		sweepFor(3 * time.Minute) // 42 free without it: given back
		blocks(t, a, 1)
		if got := a.m.Counts(); got.HandBacks != 1 {
			t.Fatalf("counts %+v, want one hand-back", got)
		}
	})

	t.Run("never the last spare block", func(t *testing.T) {
		c := newC(t)
		r := ranges(t, `[[{"subnet":"10.30.0.0/25"}]]`) // two /26 blocks
		a := c.agent("node-a", r, []int{26})
		fill(t, a, 0, 55)
		claimAhead(t, a, 0) // low, but the other block is the pool's last
		blocks(t, a, 1)
		fill(t, a, 55, 63) // the 63rd ADD claims it when it is needed
		blocks(t, a, 2)
	})

	t.Run("not while fenced", func(t *testing.T) {
		c := newC(t)
		a := c.agent("node-a", ranges(t, v4), []int{26})
		fill(t, a, 0, 50)
		a.ds.cut.Store(true)
		c.clk.Advance(ttl)
		claimAhead(t, a, 0)
		a.ds.cut.Store(false)
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		a.mustAlloc(t, "p50") // asks again once provable
		claimAhead(t, a, 1)
		blocks(t, a, 2)
	})

	t.Run("in the background", func(t *testing.T) {
		c := newC(t)
		o := c.opts("node-a")
		o.Manual = false
		a := c.agentOn("node-a", memstore.New(), o, ranges(t, v4), []int{26})
		t.Cleanup(func() { a.m.Stop(ctx) })
		fill(t, a, 0, 48)
		deadline := time.Now().Add(20 * time.Second)
		for a.m.Counts().ClaimsAhead == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		blocks(t, a, 2)
	})
}

// A node's first burst of ADDs to a network not set up yet sends one read of the
// pool record and one LIST of its blocks (the set-up's, which starts the watched
// copy the first claim reads), however many ADDs arrive at once.
func TestFirstBurstSetsUpOnce(t *testing.T) { forBackends(t, testFirstBurstSetsUpOnce) }

func testFirstBurstSetsUpOnce(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("node-a", nil, nil)
	a.ds.slowGets.Store(int64(20 * time.Millisecond)) // the ADDs overlap
	r := ranges(t, v4)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			if err := a.m.EnsureNetwork(context.Background(), "net", r, []int{26}); err != nil {
				errs <- err
				return
			}
			if _, err := a.alloc(t, fmt.Sprint("p", i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := a.ds.lists.Load(); n != 1 {
		t.Fatalf("%d LISTs of blocks for 16 ADDs at once, want 1 (the set-up's)", n)
	}
	if n := a.ds.gets.Load(); n != 1 {
		t.Fatalf("%d reads of the pool record for 16 ADDs at once, want 1", n)
	}
}

// Prepare, at the agent's start, sets the network up and claims the node's first
// block of each range set, so that its first ADDs send nothing to the datastore;
// never the pool's last unowned block, never a second block, nothing while the
// lease is not provable, and a second Prepare sends nothing.
func TestPrepare(t *testing.T) { forBackends(t, testPrepare) }

func testPrepare(t *testing.T, newC func(*testing.T) *cl) {
	ctx := context.Background()
	prepare := func(t *testing.T, a *agent, r string, want int) {
		t.Helper()
		n, err := a.m.Prepare(ctx, "net", ranges(t, r), []int{26})
		if err != nil || n != want {
			t.Fatalf("%s: Prepare = %d, %v; want %d claimed (blocks %+v)", a.name, n, err, want, a.l.Blocks("net"))
		}
	}
	sent := func(a *agent) int64 { return a.ds.writes.Load() + a.ds.lists.Load() + a.ds.gets.Load() }

	t.Run("first block before the first ADD", func(t *testing.T) {
		c := newC(t)
		a := c.agent("node-a", nil, nil)
		prepare(t, a, v4, 1) // four /26 blocks
		if bs := a.l.Blocks("net"); len(bs) != 1 {
			t.Fatalf("blocks after Prepare: %+v, want one", bs)
		}
		if got := a.m.Counts(); got.Claims != 1 || got.ClaimsAhead != 1 {
			t.Fatalf("counts %+v, want one claim, made ahead", got)
		}
		before := sent(a)
		prepare(t, a, v4, 0)
		for i := range 40 {
			if err := a.m.EnsureNetwork(ctx, "net", ranges(t, v4), []int{26}); err != nil {
				t.Fatal(err)
			}
			a.mustAlloc(t, fmt.Sprint("p", i))
		}
		if d := sent(a) - before; d != 0 {
			t.Fatalf("%d datastore calls for a second Prepare and the first 40 ADDs, want none", d)
		}
	})

	t.Run("a node that holds a block claims none", func(t *testing.T) {
		c := newC(t)
		a := c.agent("node-a", ranges(t, v4), []int{26})
		a.mustAlloc(t, "p0")
		prepare(t, a, v4, 0)
		if bs := a.l.Blocks("net"); len(bs) != 1 {
			t.Fatalf("blocks: %+v, want the one the ADD claimed", bs)
		}
	})

	t.Run("never the pool's last unowned block", func(t *testing.T) {
		c := newC(t)
		r := `[[{"subnet":"10.30.0.0/25"}]]` // two /26 blocks
		a := c.agent("node-a", nil, nil)
		b := c.agent("node-b", nil, nil)
		prepare(t, a, r, 1)
		prepare(t, b, r, 0) // one unowned block left: for whoever needs it
		if bs := b.l.Blocks("net"); len(bs) != 0 {
			t.Fatalf("node-b holds %+v, want nothing", bs)
		}
		b.mustAlloc(t, "q0") // its first ADD claims it
		if bs := b.l.Blocks("net"); len(bs) != 1 {
			t.Fatalf("node-b after its first ADD: %+v, want one block", bs)
		}
	})

	t.Run("not while fenced", func(t *testing.T) {
		c := newC(t)
		a := c.agent("node-a", ranges(t, v4), []int{26})
		a.ds.cut.Store(true)
		c.clk.Advance(ttl)
		if n, err := a.m.Prepare(ctx, "net", ranges(t, v4), []int{26}); !errors.Is(err, cluster.ErrFenced) || n != 0 {
			t.Fatalf("Prepare without a provable lease = %d, %v; want 0 and ErrFenced", n, err)
		}
		a.ds.cut.Store(false)
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		prepare(t, a, v4, 1)
	})
}
