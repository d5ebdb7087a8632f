package cluster_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger"
)

// putBlock writes net's block p directly in the datastore (behind every manager's
// back): created when absent, else updated on the revision it has now.
func putBlock(t *testing.T, ds datastore.Store, p string, owner string, epoch uint64) {
	t.Helper()
	ctx := context.Background()
	pfx := netip.MustParsePrefix(p)
	key := cluster.BlockKey("net", pfx)
	val := mustJSON(t, cluster.BlockRecord{Network: "net", CIDR: pfx, Owner: owner, Epoch: epoch})
	kv, err := ds.Get(ctx, key)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		_, err = ds.Create(ctx, key, val)
	case err == nil:
		_, err = ds.Update(ctx, key, val, kv.Revision)
	}
	if err != nil {
		t.Fatalf("writing block %s directly: %v", p, err)
	}
}

func mustClaim(t *testing.T, a *agent) netip.Prefix {
	t.Helper()
	p, err := a.m.Claim(context.Background(), "net", 0)
	if err != nil {
		t.Fatalf("%s: claim: %v", a.name, err)
	}
	return p
}

// wantOwners checks every block's owner in the datastore and that the agent's ledger
// holds exactly the blocks the datastore gives it.
func wantOwners(t *testing.T, c *cl, a *agent, want map[string]string) {
	t.Helper()
	bs, err := cluster.ReadBlocks(context.Background(), c.ds)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, b := range bs {
		got[b.CIDR.String()] = b.Owner
	}
	for p, o := range want {
		if got[p] != o {
			t.Errorf("block %s: owner %q in the datastore, want %q (all: %v)", p, got[p], o, got)
		}
	}
	held := map[string]bool{}
	for _, b := range a.l.Blocks("net") {
		if b.State != ledger.BlockLost {
			held[b.Prefix.String()] = true
		}
	}
	for p, o := range got {
		if held[p] != (o == a.name) {
			t.Errorf("block %s: owner %q in the datastore, but held by %s's ledger: %v", p, o, a.name, held[p])
		}
	}
}

// TestClaimStaleCache: a manager whose watched copy of the block records lags behind
// the datastore (a free block taken, never-claimed blocks created and one of them
// freed, all directly in the datastore while its watch is held back) loses its
// compare-and-swap writes on the stale candidates, lists once, and takes the block
// that is really free: a stale cache costs a retry, never a second owner.
func TestClaimStaleCache(t *testing.T) { forBackends(t, testClaimStaleCache) }

func testClaimStaleCache(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	// four /28 blocks; two of them free before anybody claims
	putBlock(t, c.ds, "10.0.0.0/28", "", 1)
	putBlock(t, c.ds, "10.0.0.16/28", "", 1)
	a := c.agent("a", ranges(t, `[[{"subnet":"10.0.0.0/26"}]]`), []int{28})
	if n := a.m.Counts().BlockLists; n != 1 {
		t.Fatalf("block lists of the network's set-up: %d, want 1 (it starts the watch)", n)
	}
	first := mustClaim(t, a) // reads the watched copy
	if n := a.m.Counts().BlockLists; n != 1 {
		t.Fatalf("block lists after the first claim: %d, want still 1", n)
	}
	other := "10.0.0.16/28"
	if first.String() == other {
		other = "10.0.0.0/28"
	}

	a.ds.lag.Lock()                               // the manager's watch lags from here
	putBlock(t, c.ds, other, "ghost", 2)          // the free block it knows of is taken
	putBlock(t, c.ds, "10.0.0.32/28", "ghost", 1) // never-claimed blocks are created
	putBlock(t, c.ds, "10.0.0.48/28", "ghost", 1)
	putBlock(t, c.ds, "10.0.0.48/28", "", 2) // and one of them freed
	got := mustClaim(t, a)
	if got.String() != "10.0.0.48/28" {
		t.Errorf("claim on a stale cache took %s, want the only free block 10.0.0.48/28", got)
	}
	if n := a.m.Counts().BlockLists; n != 2 {
		t.Errorf("block lists after the stale claim: %d, want 2 (the set-up's and one retry)", n)
	}
	// nothing is left: the claim says so (after listing again), and takes nothing
	if _, err := a.m.Claim(context.Background(), "net", 0); !errors.Is(err, cluster.ErrNoFreeBlock) || !errors.Is(err, ledger.ErrPoolExhausted) {
		t.Errorf("claim with every block owned: %v, want ErrNoFreeBlock and ErrPoolExhausted", err)
	}
	a.ds.lag.Unlock()
	wantOwners(t, c, a, map[string]string{first.String(): "a", other: "ghost", "10.0.0.32/28": "ghost", "10.0.0.48/28": "a"})
	if rec := blockRec(t, c.ds, "10.0.0.48/28"); rec.Epoch != 3 {
		t.Errorf("claimed block's epoch %d, want 3 (the free record's 2, bumped)", rec.Epoch)
	}
}

// TestClaimCacheRecoversAfterCompaction: the store goes away (every watch ends, as on
// a kube-apiserver restart), blocks change while the manager is not watching, and
// the history is compacted past its copy's revision. The next claim lists again and
// takes a block freed meanwhile; the claim after that takes the other freed block
// from the cache without listing: the cache watches again.
func TestClaimCacheRecoversAfterCompaction(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	c := newCluster(t, clk, ds, func() datastore.Store { return ds.Open() })
	a := c.agent("a", ranges(t, `[[{"subnet":"10.0.0.0/26"}]]`), []int{28})
	first := mustClaim(t, a)
	var others []string
	for _, p := range []string{"10.0.0.0/28", "10.0.0.16/28", "10.0.0.32/28", "10.0.0.48/28"} {
		if p != first.String() {
			others = append(others, p)
			putBlock(t, ds, p, "ghost", 1)
		}
	}
	ds.SetAvailable(false) // ends the manager's watch
	ds.SetAvailable(true)
	putBlock(t, ds, others[0], "", 2)
	putBlock(t, ds, others[1], "", 2)
	ds.Compact(ds.Revision())

	lists := a.m.Counts().BlockLists
	p1 := mustClaim(t, a)
	if n := a.m.Counts().BlockLists; n != lists+1 {
		t.Errorf("block lists after the watch ended: %d, want %d (one list)", n, lists+1)
	}
	p2 := mustClaim(t, a)
	if n := a.m.Counts().BlockLists; n != lists+1 {
		t.Errorf("block lists after a claim on the recovered cache: %d, want %d (none: the cache watches again)", n, lists+1)
	}
	if got := map[string]bool{p1.String(): true, p2.String(): true}; !got[others[0]] || !got[others[1]] {
		t.Errorf("claims took %s and %s, want the freed %s and %s", p1, p2, others[0], others[1])
	}
	wantOwners(t, c, a, map[string]string{first.String(): "a", others[0]: "a", others[1]: "a", others[2]: "ghost"})
}

// TestReadoptReadsFresh: the sweep takes back a block the records show this node
// owning and its ledger lacks, but the records may come from the watched copy, which
// can be older than the datastore. Here another node reclaimed the block (no owner,
// epoch+1) while the copy still shows it ours at the old epoch, and the node learnt
// of the loss from its own re-verification. A re-adoption from the copy would hand out
// addresses from a block anyone may claim: it must re-read the block first and leave
// it alone.
func TestReadoptReadsFresh(t *testing.T) { forBackends(t, testReadoptReadsFresh) }

func testReadoptReadsFresh(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	a := c.agent("a", ranges(t, `[[{"subnet":"10.0.0.0/26"}]]`), []int{28})
	ctx := context.Background()
	mine := mustClaim(t, a)                // from the copy the set-up's list started
	if err := a.m.Sweep(ctx); err != nil { // the sweep's first full list
		t.Fatal(err)
	}
	epoch := blockRec(t, c.ds, mine.String()).Epoch
	a.ds.lag.Lock() // the manager's watch lags from here
	lagging := true
	defer func() {
		if lagging {
			a.ds.lag.Unlock()
		}
	}()
	// cut off past its lease, its block reclaimed by another node meanwhile
	a.ds.cut.Store(true)
	c.clk.Advance(ttl + time.Second)
	putBlock(t, c.ds, mine.String(), "", epoch+1)
	a.ds.cut.Store(false)
	if err := a.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	for _, b := range a.l.Blocks("net") {
		if b.Prefix == mine {
			t.Fatalf("block %s still in the ledger after re-verification found it reclaimed", mine)
		}
	}
	for i := 0; i < 2; i++ { // the copy is read between the full lists
		_ = a.m.Sweep(ctx)
		for _, b := range a.l.Blocks("net") {
			if b.Prefix == mine {
				t.Fatalf("sweep %d re-adopted %s at epoch %d from the lagging copy; the datastore has it free at epoch %d", i+1, mine, b.Epoch, epoch+1)
			}
		}
	}
	a.ds.lag.Unlock()
	lagging = false
	if rec := blockRec(t, c.ds, mine.String()); rec.Owner != "" || rec.Epoch != epoch+1 {
		t.Errorf("block %+v, want free at epoch %d", rec, epoch+1)
	}
}
