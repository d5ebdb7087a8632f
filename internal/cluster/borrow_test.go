package cluster_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/nodenet"
)

const web0 = "default/web/web-0"

// Nodes racing to borrow one sticky address: every round exactly one wins, by
// one compare-and-swap on the block record, the others fail with ErrBorrowed
// naming the winner; the winner returns it and the next round races again. The
// owner never hands the address out meanwhile, cannot let it go while it is lent,
// and every node's Owners routes it to the borrower.
func TestBorrowRace(t *testing.T) {
	sideBySideWhenShort(t)
	forBackends(t, testBorrowRace)
}

func testBorrowRace(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.40.0.0/24"}]]`)
	owner := c.agent("node-a", r, []int{26})
	ls := owner.mustAlloc(t, "web-0-first")
	x := ls.IPs[0].Addr()
	if err := owner.m.Keep(ctx, "net", x, web0); err != nil {
		t.Fatal(err)
	}
	if err := owner.m.Keep(ctx, "net", x, web0); err != nil {
		t.Fatalf("keeping it again for the same pod: %v", err)
	}
	if err := owner.m.Keep(ctx, "net", x, "default/web/web-1"); !errors.Is(err, cluster.ErrKept) {
		t.Fatalf("keeping it for another pod: %v, want ErrKept", err)
	}
	owner.release(t, "web-0-first") // the pod went from node-a
	c.clk.Advance(3 * time.Second)  // past the ledger's reuse delay
	if err := owner.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 80 { // the rest of its block and a second one
		if got := owner.mustAlloc(t, fmt.Sprint("other-", i)).IPs[0].Addr(); got == x {
			t.Fatalf("the owner handed out kept %s to another pod", x)
		}
	}
	if _, err := owner.m.Borrow(ctx, "net", x, web0); !errors.Is(err, cluster.ErrOwnBlock) {
		t.Fatalf("the owner borrowing from its own block: %v, want ErrOwnBlock", err)
	}

	var racers []*agent
	for i := range 4 {
		racers = append(racers, c.agent(fmt.Sprintf("node-%d", i), r, []int{26}))
	}
	if _, err := racers[0].m.Borrow(ctx, "net", x, "default/web/web-1"); !errors.Is(err, cluster.ErrNotKept) {
		t.Fatalf("borrowing it for another pod: %v, want ErrNotKept", err)
	}
	wins := map[string]int{}
	const rounds = 25
	for round := range rounds {
		var wg sync.WaitGroup
		type result struct {
			node string
			from string
			err  error
		}
		results := make(chan result, len(racers))
		start := make(chan struct{})
		for _, a := range racers {
			wg.Go(func() {
				<-start
				from, err := a.m.Borrow(ctx, "net", x, web0)
				results <- result{a.name, from, err}
			})
		}
		close(start)
		wg.Wait()
		close(results)
		var winner string
		var losers []error
		for res := range results {
			if res.err == nil {
				if winner != "" {
					t.Fatalf("round %d: %s and %s both borrowed %s", round, winner, res.node, x)
				}
				if res.from != "node-a" {
					t.Fatalf("round %d: borrowed from %q, want node-a", round, res.from)
				}
				winner = res.node
				continue
			}
			losers = append(losers, res.err)
		}
		if winner == "" {
			t.Fatalf("round %d: nobody borrowed %s: %v", round, x, losers)
		}
		for _, err := range losers {
			if !errors.Is(err, cluster.ErrBorrowed) || !containsStr(err.Error(), winner) {
				t.Fatalf("round %d: a loser's error %v, want ErrBorrowed naming %s", round, err, winner)
			}
		}
		wins[winner]++
		rec := blockRec(t, c.ds, blockOf(x))
		if len(rec.Borrows) != 1 || rec.Borrows[0].Node != winner || rec.Borrows[0].For != web0 || rec.Owner != "node-a" {
			t.Fatalf("round %d: block record %+v, want %s lent to %s, owner node-a", round, rec, x, winner)
		}
		if round == 0 {
			if err := owner.m.Unkeep(ctx, "net", x); !errors.Is(err, cluster.ErrBorrowed) {
				t.Fatalf("letting a lent address go: %v, want ErrBorrowed", err)
			}
			for _, a := range append([]*agent{owner}, racers...) {
				blocks, err := a.m.Owners(ctx)
				if err != nil {
					t.Fatal(err)
				}
				want := nodenet.Block{Prefix: netip.PrefixFrom(x, 32), Owner: winner, Borrowed: true}
				if !slices.Contains(blocks, want) {
					t.Fatalf("%s's Owners %v lack %+v", a.name, blocks, want)
				}
			}
		}
		for _, a := range racers {
			if a.name == winner {
				if _, err := a.m.Borrow(ctx, "net", x, web0); err != nil {
					t.Fatalf("round %d: the winner borrowing again: %v", round, err)
				}
				continue
			}
			if err := a.m.Return(ctx, "net", x); err != nil { // not theirs: nothing
				t.Fatal(err)
			}
		}
		var w *agent
		for _, a := range racers {
			if a.name == winner {
				w = a
			}
		}
		if err := w.m.Return(ctx, "net", x); err != nil {
			t.Fatal(err)
		}
		if rec := blockRec(t, c.ds, blockOf(x)); len(rec.Borrows) != 1 || rec.Borrows[0].Node != "" {
			t.Fatalf("round %d: after the return the record is %+v, want %s kept and lent to nobody", round, rec, x)
		}
	}
	t.Logf("%d rounds, winners %v", rounds, wins)
	if err := owner.m.Unkeep(ctx, "net", x); err != nil {
		t.Fatal(err)
	}
	if rec := blockRec(t, c.ds, blockOf(x)); len(rec.Borrows) != 0 {
		t.Fatalf("after Unkeep the record is %+v, want no borrows", rec)
	}
	p := netip.MustParsePrefix(blockOf(x))
	if w := owner.l.Withheld("net", p); len(w) != 0 {
		t.Fatalf("the owner's ledger still withholds %v", w)
	}
	c.clk.Advance(3 * time.Second)
	if err := owner.m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	found := false
	for i := range 64 {
		if owner.mustAlloc(t, fmt.Sprint("after-", i)).IPs[0].Addr() == x {
			found = true
			break
		}
	}
	if !found {
		t.Fatalf("%s was never handed out again after its keeping ended", x)
	}
}

// A borrower that dies (stops renewing its node lease) gives its borrowed address
// back to the block once the same evidence as a block reclaim holds (TTL plus
// quarantine): the address stays kept for its pod and another node borrows it.
func TestDeadBorrowerReturned(t *testing.T) { forBackends(t, testDeadBorrowerReturned) }

func testDeadBorrowerReturned(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.41.0.0/24"}]]`)
	owner := c.agent("node-a", r, []int{26})
	x := owner.mustAlloc(t, "web-0").IPs[0].Addr()
	if err := owner.m.Keep(ctx, "net", x, web0); err != nil {
		t.Fatal(err)
	}
	owner.release(t, "web-0")
	b := c.agent("node-b", r, []int{26})
	cc := c.agent("node-c", r, []int{26})
	if _, err := b.m.Borrow(ctx, "net", x, web0); err != nil {
		t.Fatal(err)
	}
	// the sweeps read the nodes' watched copies of the blocks: wait until the
	// owner's and node-c's hold the borrow
	lent := func(r cluster.BlockRecord) bool { return len(r.Borrows) == 1 && r.Borrows[0].Node == "node-b" }
	for _, a := range []*agent{owner, cc} {
		for !cluster.CopyShows(a.m, "net", netip.MustParsePrefix(blockOf(x)), lent) {
			select {
			case <-a.m.BlocksChanged():
			case <-time.After(time.Minute):
				t.Fatalf("%s's copy of the blocks never showed node-b's borrow", a.name)
			}
		}
	}
	b.ds.cut.Store(true) // node-b dies
	step := func() {
		for _, a := range []*agent{owner, cc} {
			_ = a.m.Renew(ctx)
			_ = a.m.Sweep(ctx)
		}
	}
	step()
	for elapsed := time.Duration(0); elapsed < 2*ttl-3*time.Second; elapsed += 3 * time.Second {
		c.clk.Advance(3 * time.Second)
		step()
		if rec := blockRec(t, c.ds, blockOf(x)); rec.Borrows[0].Node != "node-b" {
			t.Fatalf("borrow of %s ended %v after node-b stopped, before TTL + quarantine: %+v", x, elapsed+3*time.Second, rec)
		}
		if _, err := cc.m.Borrow(ctx, "net", x, web0); !errors.Is(err, cluster.ErrBorrowed) {
			t.Fatalf("node-c borrowing while node-b's borrow stands: %v, want ErrBorrowed", err)
		}
	}
	for range 3 {
		c.clk.Advance(3 * time.Second)
		step()
	}
	rec := blockRec(t, c.ds, blockOf(x))
	if len(rec.Borrows) != 1 || rec.Borrows[0].Node != "" || rec.Borrows[0].For != web0 {
		t.Fatalf("after node-b's death the record is %+v, want %s kept for %s, lent to nobody", rec, x, web0)
	}
	if from, err := cc.m.Borrow(ctx, "net", x, web0); err != nil || from != "node-a" {
		t.Fatalf("node-c borrowing after node-b died: %q %v", from, err)
	}
	if w := owner.l.Withheld("net", netip.MustParsePrefix(blockOf(x))); !slices.Equal(w, []netip.Addr{x}) {
		t.Fatalf("the owner withholds %v, want [%s] throughout", w, x)
	}
}

// A block that keeps an address is never given back, however long it stays
// otherwise empty: the address may be borrowed at any time.
func TestKeptBlockNotGivenBack(t *testing.T) { forBackends(t, testKeptBlockNotGivenBack) }

func testKeptBlockNotGivenBack(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.42.0.0/25"}]]`) // two /26 blocks
	a := c.agent("node-a", r, []int{26})
	for i := range 65 { // fills the first block, opens the second
		a.mustAlloc(t, fmt.Sprint("p", i))
	}
	x := a.mustAlloc(t, "web-0").IPs[0].Addr() // in the second block
	if err := a.m.Keep(ctx, "net", x, web0); err != nil {
		t.Fatal(err)
	}
	a.release(t, "web-0")
	a.release(t, "p64")
	for range 6 {
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		if err := a.m.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		c.clk.Advance(40 * time.Second)
	}
	if rec := blockRec(t, c.ds, blockOf(x)); rec.Owner != "node-a" || len(rec.Borrows) != 1 {
		t.Fatalf("block keeping %s: %+v, want still node-a's with the kept address", x, rec)
	}
}

// blockOf is the /26 holding a (the tests' block size).
func blockOf(a netip.Addr) string {
	p, _ := a.Prefix(26)
	return p.String()
}

func containsStr(s, sub string) bool { return len(sub) > 0 && slices.Contains(splitWords(s), sub) }

func splitWords(s string) []string {
	var out []string
	w := ""
	for _, r := range s {
		if r == ' ' || r == ':' || r == ',' || r == '(' || r == ')' {
			if w != "" {
				out = append(out, w)
			}
			w = ""
			continue
		}
		w += string(r)
	}
	if w != "" {
		out = append(out, w)
	}
	return out
}
