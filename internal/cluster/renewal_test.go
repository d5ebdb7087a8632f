package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// slowDS is a datastore that answers the calls a sweep makes (block LISTs and
// block updates: the reclaims' and give-backs' compare-and-swaps) late once armed:
// each after delay, as a loaded datastore (or a loaded machine) does, and an update
// not before the test opens its gate while one is set (shut). The lease calls pass
// at once. A test tool beside the real backends.
type slowDS struct {
	datastore.Store
	delay time.Duration
	armed atomic.Bool
	gate  atomic.Pointer[chan struct{}] // shut: updates wait until it is closed
	// slowed: calls delayed (begun); updating: of them, updates; leaseLists:
	// Leases().List calls answered (a sweep sends one, after its block reads);
	// acquires: Leases().Acquire calls answered
	slowed, updating, leaseLists, acquires atomic.Int64
	// stepped receives a value (coalesced) when a counter moved
	stepped chan struct{}
}

func newSlowDS(s datastore.Store, delay time.Duration) *slowDS {
	return &slowDS{Store: s, delay: delay, stepped: make(chan struct{}, 1)}
}

func (d *slowDS) step(n *atomic.Int64) {
	n.Add(1)
	select {
	case d.stepped <- struct{}{}:
	default:
	}
}

// waitFor waits until cond holds, checked after every step the counters record.
// The bound only stops a hung loop; it is not a speed test.
func (d *slowDS) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	bound := time.NewTimer(time.Minute)
	defer bound.Stop()
	for !cond() {
		select {
		case <-d.stepped:
		case <-bound.C:
			t.Fatalf("%s: not seen", what)
		}
	}
}

var _ datastore.Store = (*slowDS)(nil)

// shutGate sets a gate in front of the updates; openGate lets them through.
func (d *slowDS) shutGate() { g := make(chan struct{}); d.gate.Store(&g) }
func (d *slowDS) openGate() {
	if g := d.gate.Swap(nil); g != nil {
		close(*g)
	}
}

// wait delays a call by d.delay when armed, or until ctx ends (then the call fails
// as a call past its deadline does).
func (d *slowDS) wait(ctx context.Context, what string) error {
	if !d.armed.Load() {
		return nil
	}
	d.step(&d.slowed)
	t := time.NewTimer(d.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("test: slow %s: %w: %w", what, datastore.ErrUnavailable, ctx.Err())
	}
}

func (d *slowDS) List(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	if err := d.wait(ctx, "list"); err != nil {
		return nil, 0, err
	}
	return d.Store.List(ctx, prefix)
}

func (d *slowDS) Update(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if d.armed.Load() {
		d.step(&d.updating)
	}
	if err := d.wait(ctx, "update"); err != nil {
		return 0, err
	}
	if g := d.gate.Load(); g != nil {
		select {
		case <-*g:
		case <-ctx.Done():
			return 0, fmt.Errorf("test: update held at the gate: %w: %w", datastore.ErrUnavailable, ctx.Err())
		}
	}
	return d.Store.Update(ctx, key, value, rev)
}

func (d *slowDS) Leases() datastore.Leases { return slowLeases{d.Store.Leases(), d} }

type slowLeases struct {
	datastore.Leases
	d *slowDS
}

func (l slowLeases) Acquire(ctx context.Context, node, holder string, ttl time.Duration, addrs ...netip.Addr) (datastore.NodeLease, error) {
	nl, err := l.Leases.Acquire(ctx, node, holder, ttl, addrs...)
	l.d.step(&l.d.acquires)
	return nl, err
}

func (l slowLeases) List(ctx context.Context) ([]datastore.NodeLease, error) {
	ls, err := l.Leases.List(ctx)
	l.d.step(&l.d.leaseLists)
	return ls, err
}

// TestRenewalBesideSlowSweep: the lease is renewed every Interval whatever a sweep
// is doing. Node a's background sweep reclaims a dead node's 16 blocks through a
// datastore that answers each of its calls after 4/5 of the call timeout (a third
// of the 2s lease): the sweep lasts about four lease TTLs (six blocks and 1.6
// TTLs under -short). Node a's lease never lapses meanwhile (no suspension), and
// node b, sweeping beside it, never reclaims a's block: a live node keeps its
// blocks however slow its sweep is (issue 35: a renewal queued behind the sweep,
// the lease lapsed, and another node reclaimed a live node's blocks). Real background loops on the system clock, no Manual steps.
func TestRenewalBesideSlowSweep(t *testing.T) {
	sideBySideWhenShort(t)
	forBackends(t, testRenewalBesideSlowSweep)
}

func testRenewalBesideSlowSweep(t *testing.T, newC func(*testing.T) *cl) {
	const (
		leaseTTL = 2 * time.Second
		timeout  = leaseTTL / 3 // the default: Options.Timeout and Interval
	)
	ghosts := 16
	if testing.Short() {
		ghosts = 6 // a sweep of about 1.6 lease TTLs: still longer than the lease
	}
	c := newC(t)
	opts := func(name string) cluster.Options {
		o := c.opts(name)
		o.Clock, o.Manual, o.LeaseTTL, o.Margin, o.Timeout = clock.NewSystem(), false, leaseTTL, 0, timeout
		return o
	}
	r := ranges(t, `[[{"subnet":"10.42.0.0/23"}]]`)
	bits := []int{28}
	for i := range ghosts {
		putBlock(t, c.ds, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 42, 1, byte(16 * i)}), 28).String(), "ghost", 1)
	}
	open := c.open
	slow := newSlowDS(open(), timeout*4/5)
	c.open = func() datastore.Store { return slow }
	a := c.agentOn("node-a", memstore.New(), opts("node-a"), r, bits)
	c.open = open
	t.Cleanup(func() { _ = a.m.Stop(ctx) })
	a.mustAlloc(t, "pod-a")
	before := a.l.Blocks("net")
	if len(before) != 1 {
		t.Fatalf("node-a holds %d blocks after one allocation, want 1: %+v", len(before), before)
	}

	slow.armed.Store(true)
	a.m.NodeGone("ghost") // node-a's next sweep reclaims every ghost block at once
	slow.waitFor(t, "node-a's sweep sends its first reclaim", func() bool { return slow.updating.Load() > 0 })
	inSweep := slow.leaseLists.Load()
	b := c.agentOn("node-b", memstore.New(), opts("node-b"), r, bits)
	t.Cleanup(func() { _ = b.m.Stop(ctx) })
	// node-a's slow sweep ends, and two more begin: node-b has swept all along
	slow.waitFor(t, "node-a's slow sweep and two more", func() bool { return slow.leaseLists.Load() >= inSweep+2 })

	if n := slow.updating.Load(); n < int64(ghosts) {
		t.Fatalf("node-a's sweep sent %d slow reclaims, want the %d ghost blocks'", n, ghosts)
	}
	t.Logf("node-a's sweep: %d calls slowed by %s each; reclaims: node-a %d, node-b %d",
		slow.slowed.Load(), slow.delay, a.m.Counts().Reclaims, b.m.Counts().Reclaims)
	if n := a.m.Counts().Suspensions; n != 0 {
		t.Errorf("node-a suspended its blocks %d times while its sweep was slow: its lease lapsed although the datastore answered", n)
	}
	for _, bl := range before {
		if rec := blockRec(t, c.ds, bl.Prefix.String()); rec.Owner != "node-a" || rec.Epoch != bl.Epoch {
			t.Errorf("live node-a's block %s moved while its sweep was slow: %+v, want owner node-a at epoch %d", bl.Prefix, rec, bl.Epoch)
		}
	}
	if !a.m.Provable() {
		t.Error("node-a's lease is not provable after its slow sweep")
	}
	a.mustAlloc(t, "pod-a2")
}

// TestRenewalBesideHandBack: a renewal finds the lease lost while a sweep is giving
// back one of the node's blocks. The renewal does not wait for the sweep: it
// suspends the blocks and takes a new lease while the give-back's write is still
// unanswered. The re-verification that follows waits for the sweep (it must not
// re-affirm or resume the block being given back), then resumes the block the node
// keeps: the given-back block is free in the datastore and out of the ledger, the
// kept one the node's at its epoch, and allocation goes on. Manual steps on the
// test clock; the datastore holds the give-back's write until the test opens the
// gate.
func TestRenewalBesideHandBack(t *testing.T) { forBackends(t, testRenewalBesideHandBack) }

func testRenewalBesideHandBack(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	open := c.open
	gated := newSlowDS(open(), 0)
	c.open = func() datastore.Store { return gated }
	o := c.opts("node-a")
	o.Timeout = time.Minute // the gate holds the write until the test opens it
	a := c.agentOn("node-a", memstore.New(), o, ranges(t, v4), []int{26})
	c.open = open
	mustClaim(t, a)
	mustClaim(t, a)                        // two empty blocks: one is given back after the grace (a minute)
	if err := a.m.Sweep(ctx); err != nil { // the first observation
		t.Fatal(err)
	}
	for range 13 {
		c.clk.Advance(5 * time.Second)
		if err := a.m.Renew(ctx); err != nil {
			t.Fatal(err)
		}
	}

	gated.shutGate()
	gated.armed.Store(true)
	var wg sync.WaitGroup
	var sweepErr, renewErr error
	swept := make(chan struct{})
	wg.Go(func() {
		defer close(swept)
		sweepErr = a.m.Sweep(ctx)
	})
	gated.waitFor(t, "the give-back's write", func() bool { return gated.updating.Load() > 0 })
	// the node's lease is lost behind its back (released; as when it expired)
	ls, err := c.ds.Leases().List(ctx)
	if err != nil || len(ls) != 1 || ls[0].Node != "node-a" {
		t.Fatalf("node leases %+v %v, want node-a's", ls, err)
	}
	if err := c.ds.Leases().Release(ctx, ls[0]); err != nil {
		t.Fatal(err)
	}
	acquired := gated.acquires.Load()
	renewed := make(chan struct{})
	wg.Go(func() {
		defer close(renewed)
		renewErr = a.m.Renew(ctx)
	})
	gated.waitFor(t, "node-a's new lease while the give-back's write is held", func() bool { return gated.acquires.Load() > acquired })
	select {
	case <-swept:
		t.Fatal("the sweep ended before node-a's renewal: the renewal waited for it")
	case <-renewed:
		t.Fatal("node-a re-verified its blocks beside the sweep that gives one back")
	default:
	}
	if _, err := a.alloc(t, "during"); !errors.Is(err, cluster.ErrFenced) {
		t.Fatalf("allocation after the lease was lost, before re-verification: %v, want ErrFenced", err)
	}
	gated.openGate()
	wg.Wait()
	if sweepErr != nil || renewErr != nil {
		t.Fatalf("sweep: %v; renewal and re-verification: %v", sweepErr, renewErr)
	}

	n := a.m.Counts()
	if n.HandBacks != 1 || n.Suspensions != 1 {
		t.Errorf("counts %+v, want one hand-back and one suspension", n)
	}
	kept := a.l.Blocks("net")
	if len(kept) != 1 || kept[0].State != ledger.BlockActive {
		t.Fatalf("node-a's blocks after the give-back and the re-verification: %+v, want one active", kept)
	}
	for _, p := range []string{"10.20.0.0/26", "10.20.0.64/26"} {
		rec := blockRec(t, c.ds, p)
		switch {
		case p == kept[0].Prefix.String():
			if rec.Owner != "node-a" || rec.Epoch != kept[0].Epoch {
				t.Errorf("kept block %s: %+v, want node-a's at epoch %d", p, rec, kept[0].Epoch)
			}
		case rec.Owner != "" || rec.Epoch != 2:
			t.Errorf("given-back block %s: %+v, want free at epoch 2", p, rec)
		}
	}
	if ls := a.mustAlloc(t, "after"); !kept[0].Prefix.Contains(ls.IPs[0].Addr()) {
		t.Errorf("allocated %v outside the kept block %s", ls.IPs, kept[0].Prefix)
	}
}
