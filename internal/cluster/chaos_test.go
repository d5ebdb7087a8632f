package cluster_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// TestChaos: four agents on one datastore, random ADDs and DELs, partitions of random
// length (shorter than the lease, past the lease, past the quarantine), the clock
// moving, every agent renewing and sweeping. Checked throughout: every address handed
// out lies in a block its node owns at the datastore's current epoch at that moment
// (fencing: nothing from a block the node lost or cannot prove), and no address is
// held by two nodes that both own its block's current epoch. At the end, once every
// partition healed and the pods left in lost blocks were deleted (their node was
// presumed dead), the full cluster audit balances.
func TestChaos(t *testing.T) {
	sideBySideWhenShort(t)
	forBackends(t, testChaos)
}

func testChaos(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	c.allowOutside = true // checked below, after the stale pods are deleted
	r := ranges(t, `[[{"subnet":"10.70.0.0/23"}]]`)
	var agents []*agent
	for i := 0; i < 4; i++ {
		agents = append(agents, c.agent(fmt.Sprintf("node-%d", i), r, []int{27}))
	}
	rng := rand.New(rand.NewPCG(7, 16))
	pods := map[*agent][]string{}
	n, allocs, fenced, exhausted, partitions := 0, 0, 0, 0, 0
	stepAll := func() {
		for _, a := range agents {
			_ = a.m.Renew(ctx)
			_ = a.m.Sweep(ctx)
		}
	}
	steps := 1500
	if testing.Short() {
		steps = 300
	}
	for i := 0; i < steps; i++ {
		a := agents[rng.IntN(len(agents))]
		switch x := rng.IntN(100); {
		case x < 50:
			n++
			cid := fmt.Sprint("pod", n)
			ls, err := a.alloc(t, cid)
			switch {
			case err == nil:
				allocs++
				pods[a] = append(pods[a], cid)
				checkOwned(t, c, a, ls)
			case errors.Is(err, cluster.ErrFenced):
				fenced++
			case errors.Is(err, ledger.ErrPoolExhausted):
				exhausted++
			default:
				t.Logf("%s: allocate: %v", a.name, err)
			}
		case x < 85:
			if ps := pods[a]; len(ps) > 0 {
				j := rng.IntN(len(ps))
				a.release(t, ps[j])
				pods[a] = append(ps[:j], ps[j+1:]...)
			}
		case x < 88:
			if !a.ds.cut.Load() {
				partitions++
				a.ds.cut.Store(true)
			}
		case x < 92:
			if a.ds.cut.Load() {
				a.ds.cut.Store(false)
				_ = a.m.Renew(ctx)
				deleteStale(t, c, a, pods)
			}
		default:
			c.clk.Advance(time.Duration(1+rng.IntN(4)) * time.Second)
			stepAll()
		}
		if i%50 == 0 {
			noCurrentDoubles(t, c)
		}
	}
	for _, a := range agents {
		a.ds.cut.Store(false)
	}
	stepAll()
	for _, a := range agents {
		deleteStale(t, c, a, pods)
	}
	c.allowOutside = false
	t.Logf("%d allocations, %d refused while fenced, %d while no block was left, %d partitions", allocs, fenced, exhausted, partitions)
	if allocs < steps/5 || partitions == 0 {
		t.Fatalf("the run did too little: %d allocations, %d partitions", allocs, partitions)
	}
}

// checkOwned fails unless every address of ls lies in a block the datastore gives
// a's node at the epoch a's ledger holds it at.
func checkOwned(t *testing.T, c *cl, a *agent, ls ledger.Lease) {
	t.Helper()
	blocks, err := cluster.ReadBlocks(ctx, c.ds)
	if err != nil {
		t.Fatal(err)
	}
	rep := cluster.Audit(blocks, []cluster.NodeBooks{{Node: a.name, Leases: []ledger.Lease{ls}, Blocks: a.l.Blocks("")}})
	if len(rep.Outside) > 0 {
		t.Fatalf("%s handed out %v outside the blocks it owns now: %+v", a.name, ls.IPs, rep.Outside)
	}
}

// noCurrentDoubles fails when two nodes that both own an address's block at its
// current epoch hold the address.
func noCurrentDoubles(t *testing.T, c *cl) {
	t.Helper()
	blocks, err := cluster.ReadBlocks(ctx, c.ds)
	if err != nil {
		t.Fatal(err)
	}
	var books []cluster.NodeBooks
	for _, a := range c.agents {
		books = append(books, cluster.NodeBooks{Node: a.name, Leases: a.l.Leases(""), Blocks: a.l.Blocks("")})
	}
	for _, d := range cluster.Audit(blocks, books).DoubleHeld {
		cur := 0
		for _, h := range d.Holders {
			if h.Current {
				cur++
			}
		}
		if cur > 1 {
			t.Fatalf("%s held by %+v", d.IP, d.Holders)
		}
	}
}

// deleteStale deletes a's pods whose addresses lie outside the blocks a owns now
// (their node was presumed dead and its blocks reclaimed): DELs recorded locally.
func deleteStale(t *testing.T, c *cl, a *agent, pods map[*agent][]string) {
	t.Helper()
	blocks, err := cluster.ReadBlocks(ctx, c.ds)
	if err != nil {
		t.Fatal(err)
	}
	rep := cluster.Audit(blocks, []cluster.NodeBooks{{Node: a.name, Leases: a.l.Leases(""), Blocks: a.l.Blocks("")}})
	stale := map[string]bool{}
	for _, o := range rep.Outside {
		stale[o.Key.ContainerID] = true
	}
	kept := pods[a][:0]
	for _, cid := range pods[a] {
		if stale[cid] {
			a.release(t, cid)
			continue
		}
		kept = append(kept, cid)
	}
	pods[a] = kept
}
