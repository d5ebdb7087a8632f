package ledgertest

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/faultstore"
)

// Cluster-scoped pools: the node allocates only inside the blocks it holds.

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// capacitySet returns the range set a BlockCapacityError names, or -1 when err is
// not one.
func capacitySet(t *testing.T, err error) int {
	t.Helper()
	var ce *ledger.BlockCapacityError
	if !errors.As(err, &ce) {
		return -1
	}
	if !errors.Is(err, ledger.ErrNoBlockCapacity) || !errors.Is(err, ledger.ErrPoolExhausted) {
		t.Fatalf("%v does not match ErrNoBlockCapacity and ErrPoolExhausted", err)
	}
	return ce.Set
}

// testBlocksAllocate: without a block nothing is handed out (a distinct error), a
// block's addresses are handed out in order, a full block says so, released
// addresses wait out the reuse delay and come back least recently released first.
func testBlocksAllocate(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk, ReuseDelay: time.Minute})
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
	if err := l.DeclareCluster("net", r, []int{26}); err != nil {
		t.Fatal(err)
	}
	if err := l.DeclareCluster("net", r, []int{26}); err != nil {
		t.Fatalf("declaring again: %v", err)
	}
	_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("c0"), Ranges: r})
	if capacitySet(t, err) != 0 {
		t.Fatalf("no block yet: err = %v, want a BlockCapacityError for set 0", err)
	}
	if err := l.AddBlock("net", pfx("10.7.0.64/26"), 1); err != nil {
		t.Fatal(err)
	}
	var ips []string
	for i := 0; i < 64; i++ {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprintf("c%d", i)), Ranges: r})
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		ips = append(ips, ls.IPs[0].String())
	}
	if ips[0] != "10.7.0.64/24" || ips[63] != "10.7.0.127/24" {
		t.Fatalf("block handed out %s..%s, want 10.7.0.64..10.7.0.127 with the subnet's prefix length", ips[0], ips[63])
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("x"), Ranges: r}); capacitySet(t, err) != 0 {
		t.Fatalf("full block: err = %v", err)
	}
	for _, c := range []string{"c5", "c3"} {
		if _, ok, err := l.Release(Key(c), ledger.ReasonDEL, ""); !ok || err != nil {
			t.Fatal(ok, err)
		}
		clk.Advance(time.Second)
	}
	_, _, err = l.Allocate(ledger.AllocateRequest{Key: Key("x"), Ranges: r})
	var ce *ledger.BlockCapacityError
	if !errors.As(err, &ce) || ce.Waiting != 2 || !strings.Contains(err.Error(), `"net"`) {
		t.Fatalf("inside the reuse delay: err = %v, want capacity error with 2 waiting", err)
	}
	clk.Advance(time.Minute)
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("x"), Ranges: r})
	if err != nil || ls.IPs[0].String() != ips[5] {
		t.Fatalf("got %v %v, want %s (released first)", ls.IPs, err, ips[5])
	}
	bs := l.Blocks("net")
	if len(bs) != 1 || bs[0].Used != 63 || bs[0].Free != 1 || bs[0].Usable != 64 || bs[0].State != ledger.BlockActive || bs[0].Epoch != 1 {
		t.Fatalf("blocks = %+v, want one active block, 63 used, 1 free, 64 usable", bs)
	}
	if p, _ := l.Pool("net"); !p.Available || p.Usable[0] != 64 {
		t.Fatalf("pool status %+v, want available with the node's 64 addresses", p)
	}
}

// testBlocksGatewayAndRanges: a block is cut to the ranges; gateways are never
// handed out; a block outside the ranges or misaligned is refused.
func testBlocksGatewayAndRanges(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	r := Ranges(t, `[[{"subnet":"10.8.0.0/24","rangeStart":"10.8.0.10","rangeEnd":"10.8.0.70"}]]`)
	if err := l.DeclareCluster("net", r, []int{26}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"10.8.0.128/26", "10.8.0.32/26", "10.8.0.0/25", "10.9.0.0/26", "fd00::/122"} {
		if err := l.AddBlock("net", pfx(bad), 1); !errors.Is(err, ledger.ErrUnknownBlock) {
			t.Errorf("AddBlock(%s): err = %v, want ErrUnknownBlock", bad, err)
		}
	}
	if err := l.AddBlock("net", pfx("10.8.0.0/26"), 1); err != nil {
		t.Fatal(err)
	}
	if bs := l.Blocks("net"); len(bs) != 1 || bs[0].Usable != 54 { // .10-.63
		t.Fatalf("blocks = %+v, want 54 usable (rangeStart .10)", bs)
	}
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r})
	if err != nil || ls.IPs[0].String() != "10.8.0.10/24" {
		t.Fatalf("got %v %v, want 10.8.0.10 (rangeStart)", ls.IPs, err)
	}
	// a gateway inside a block is skipped
	r2 := Ranges(t, `[[{"subnet":"10.6.0.0/24","gateway":"10.6.0.66"}]]`)
	if err := l.DeclareCluster("gw", r2, []int{26}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBlock("gw", pfx("10.6.0.64/26"), 3); err != nil {
		t.Fatal(err)
	}
	k := func(c string) ledger.Key { return ledger.Key{Network: "gw", ContainerID: c, IfName: "eth0"} }
	var got []string
	for i := 0; i < 3; i++ {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: k(fmt.Sprint("g", i)), Ranges: r2})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ls.IPs[0].Addr().String())
	}
	if fmt.Sprint(got) != "[10.6.0.64 10.6.0.65 10.6.0.67]" {
		t.Fatalf("got %v, want the gateway .66 skipped", got)
	}
}

// testBlocksConfigConflicts: under a live lease a node-mode pool does not become
// cluster-scoped, block sizes do not change, ranges must match (testModeSwitch: once
// no lease is live they may); node-mode networks beside cluster ones work as they
// do alone.
func testBlocksConfigConflicts(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	node := Ranges(t, `[[{"subnet":"10.1.0.0/24"}]]`)
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: node}); err != nil {
		t.Fatal(err)
	}
	if err := l.DeclareCluster("net", node, []int{26}); !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), "node-mode pool") || !strings.Contains(err.Error(), "1 live leases") {
		t.Fatalf("node-mode pool under a live lease made cluster-scoped: %v", err)
	}
	cr := Ranges(t, `[[{"subnet":"10.2.0.0/24"}]]`)
	if err := l.DeclareCluster("cl", cr, []int{26}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBlock("cl", pfx("10.2.0.0/26"), 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledger.Key{Network: "cl", ContainerID: "c", IfName: "eth0"}, Ranges: cr}); err != nil {
		t.Fatal(err)
	}
	if err := l.DeclareCluster("cl", cr, []int{27}); !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), "blocks of /[27]") || !strings.Contains(err.Error(), "1 live leases") {
		t.Fatalf("block size changed under a live lease: %v", err)
	}
	if err := l.DeclareCluster("cl", Ranges(t, `[[{"subnet":"10.3.0.0/24"}]]`), []int{26}); !errors.Is(err, ledger.ErrPoolConflict) {
		t.Fatalf("ranges changed under a live lease: %v", err)
	}
	if err := l.DeclareCluster("cl2", Ranges(t, `[[{"subnet":"10.2.0.0/25"}]]`), []int{26}); !errors.Is(err, ledger.ErrPoolConflict) {
		t.Fatalf("overlapping cluster network accepted: %v", err)
	}
	if err := l.DeclareCluster("cl3", Ranges(t, `[[{"subnet":"10.4.0.0/24"}]]`), []int{31}); err == nil || !strings.Contains(err.Error(), "blockSize") {
		t.Fatalf("a /31 block size: err = %v, want one naming blockSize", err)
	}
	if err := l.AddBlock("net", pfx("10.1.0.0/26"), 1); !errors.Is(err, ledger.ErrUnknownBlock) {
		t.Fatalf("block in a node-mode pool: %v", err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: node}); err != nil {
		t.Fatalf("node-mode allocation beside a cluster network: %v", err)
	}
}

// testBlocksRemove: a block holding a lease is not removed; an empty one is, its
// free addresses forgotten, and nothing is handed out from it after.
func testBlocksRemove(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
	if err := l.DeclareCluster("net", r, []int{26}); err != nil {
		t.Fatal(err)
	}
	b := pfx("10.7.0.128/26")
	if err := l.AddBlock("net", b, 2); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r}); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveBlock("net", b); !errors.Is(err, ledger.ErrBlockInUse) {
		t.Fatalf("remove with a lease in it: err = %v, want ErrBlockInUse", err)
	}
	if _, _, err := l.Release(Key("a"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveBlock("net", b); err != nil {
		t.Fatal(err)
	}
	if len(l.Blocks("net")) != 0 || len(l.FreeAddresses("net")) != 0 {
		t.Fatalf("after remove: blocks %v, free %v", l.Blocks("net"), l.FreeAddresses("net"))
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: r}); capacitySet(t, err) != 0 {
		t.Fatalf("allocation after the block was removed: %v", err)
	}
	if err := l.RemoveBlock("net", b); err != nil {
		t.Fatalf("removing it again: %v", err)
	}
	// added again (claimed again later): its addresses count as fresh
	if err := l.AddBlock("net", b, 4); err != nil {
		t.Fatal(err)
	}
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: r})
	if err != nil || ls.IPs[0].Addr().String() != "10.7.0.128" {
		t.Fatalf("got %v %v, want 10.7.0.128", ls.IPs, err)
	}
	h, _ := l.History("net", netip.MustParseAddr("10.7.0.128"))
	if len(h) != 1 {
		t.Fatalf("history of 10.7.0.128 = %v; its earlier holding must stay", h)
	}
}

// testBlocksFencing: a suspended block hands nothing out (not even to the same pod
// UID), records releases, and resumes only at its epoch; the allocation guard refuses
// allocations in cluster pools only.
func testBlocksFencing(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	opts := ledger.Options{Clock: clk, ReuseDelay: time.Minute, Logger: TestLogger(t)}
	l, err := ledger.Open(st, opts) // audited before the reopen below
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
	if err := l.DeclareCluster("net", r, []int{26}); err != nil {
		t.Fatal(err)
	}
	b := pfx("10.7.0.0/26")
	if err := l.AddBlock("net", b, 5); err != nil {
		t.Fatal(err)
	}
	pod := ledger.Pod{Namespace: "ns", Name: "p", UID: "u1"}
	first, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Pod: pod, Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: r}); err != nil {
		t.Fatal(err)
	}
	if err := l.SuspendBlock("net", b); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("c"), Ranges: r}); capacitySet(t, err) != 0 {
		t.Fatalf("allocation from a suspended block: %v", err)
	}
	if _, ok, err := l.Release(Key("a"), ledger.ReasonDEL, ""); !ok || err != nil {
		t.Fatalf("release in a suspended block: %v %v", ok, err)
	}
	clk.Advance(time.Hour)
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a2"), Pod: pod, Ranges: r}); capacitySet(t, err) != 0 {
		t.Fatalf("same-UID reuse from a suspended block: %v", err)
	}
	if bs := l.Blocks("net"); len(bs) != 1 || bs[0].State != ledger.BlockSuspended || bs[0].Free != 1 || bs[0].Used != 1 {
		t.Fatalf("blocks = %+v", bs)
	}
	// the state survives a restart
	Audit(t, l)
	l2 := Open(t, reopen(), opts)
	if bs := l2.Blocks("net"); len(bs) != 1 || bs[0].State != ledger.BlockSuspended || bs[0].NextFresh != 3 {
		t.Fatalf("after reopen blocks = %+v, want suspended with cursor 3 (the gateway .1, .2, .3)", bs)
	}
	if err := l2.ResumeBlock("net", b, 6); !errors.Is(err, ledger.ErrBlockEpoch) {
		t.Fatalf("resume at another epoch: %v", err)
	}
	if _, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("c"), Ranges: r}); capacitySet(t, err) != 0 {
		t.Fatalf("allocation after a refused resume: %v", err)
	}
	if err := l2.ResumeBlock("net", b, 5); err != nil {
		t.Fatal(err)
	}
	again, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("a2"), Pod: pod, Ranges: r})
	if err != nil || again.IPs[0] != first.IPs[0] {
		t.Fatalf("after resume the pod got %v %v, want its address %v back", again.IPs, err, first.IPs)
	}
	// the guard
	errFence := errors.New("fenced by test")
	l2.SetAllocationGuard(func(network string) error {
		if network != "net" {
			t.Errorf("guard asked for %q", network)
		}
		return errFence
	})
	if _, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("d"), Ranges: r}); !errors.Is(err, errFence) {
		t.Fatalf("guarded allocation: %v", err)
	}
	if _, existed, err := l2.Allocate(ledger.AllocateRequest{Key: Key("a2"), Ranges: r}); err != nil || !existed {
		t.Fatalf("an existing lease must still be answered under the guard: %v %v", existed, err)
	}
	if _, _, err := l2.Allocate(ledger.AllocateRequest{Key: ledger.Key{Network: "nodenet", ContainerID: "x", IfName: "eth0"}, Ranges: Ranges(t, `[[{"subnet":"10.99.0.0/24"}]]`)}); err != nil {
		t.Fatalf("node-mode allocation under the guard: %v", err)
	}
	l2.SetAllocationGuard(nil)
	if err := l2.SuspendAll(); err != nil {
		t.Fatal(err)
	}
	if bs := l2.Blocks("net"); bs[0].State != ledger.BlockSuspended {
		t.Fatalf("SuspendAll left %+v", bs)
	}
}

// testBlocksLost: a block lost to another node hands nothing out; the DEL of a lease
// in it is recorded locally (history, counters) without keeping the address free,
// and the block leaves the ledger with its last lease.
func testBlocksLost(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk})
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
	if err := l.DeclareCluster("net", r, []int{26}); err != nil {
		t.Fatal(err)
	}
	lost, kept := pfx("10.7.0.0/26"), pfx("10.7.0.64/26")
	if err := l.AddBlock("net", lost, 1); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"a", "b", "c"} {
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(c), Ranges: r}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := l.Release(Key("c"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBlock("net", kept, 1); err != nil {
		t.Fatal(err)
	}
	if err := l.SuspendBlock("net", lost); err != nil {
		t.Fatal(err)
	}
	if err := l.LoseBlock("net", lost); err != nil {
		t.Fatal(err)
	}
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("d"), Ranges: r})
	if err != nil || !kept.Contains(ls.IPs[0].Addr()) {
		t.Fatalf("got %v %v, want an address of the kept block", ls.IPs, err)
	}
	if err := l.ResumeBlock("net", lost, 1); !errors.Is(err, ledger.ErrBlockEpoch) {
		t.Fatalf("resuming a lost block: %v", err)
	}
	if _, ok, err := l.Release(Key("a"), ledger.ReasonDEL, "pod deleted"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	for _, f := range l.FreeAddresses("net") {
		if lost.Contains(f.IP) {
			t.Fatalf("address %s of the lost block kept free", f.IP)
		}
	}
	h, _ := l.History("net", netip.MustParseAddr("10.7.0.2"))
	if len(h) != 1 || h[0].Reason != ledger.ReasonDEL || h[0].Detail != "pod deleted" {
		t.Fatalf("history of the lost block's address: %+v", h)
	}
	if bs := l.Blocks("net"); len(bs) != 2 || bs[0].State != ledger.BlockLost || bs[0].Used != 1 {
		t.Fatalf("blocks = %+v, want the lost block still there with one lease", bs)
	}
	if _, _, err := l.Release(Key("b"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	if bs := l.Blocks("net"); len(bs) != 1 || bs[0].Prefix != kept {
		t.Fatalf("blocks = %+v, want the lost block gone with its last lease", bs)
	}
	// claimed back later: fresh again
	if err := l.AddBlock("net", lost, 3); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBlock("net", lost, 2); !errors.Is(err, ledger.ErrBlockEpoch) {
		t.Fatalf("adding at an older epoch: %v", err)
	}
}

// testBlocksDualStack: one block per range set; the capacity error names the range
// set that needs a block; a failed allocation takes nothing.
func testBlocksDualStack(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	l, err := ledger.Open(st, ledger.Options{Clock: clk, Logger: TestLogger(t)}) // audited before the reopen
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}],[{"subnet":"fd00:7::/64"}]]`)
	if err := l.DeclareCluster("net", r, []int{26, 122}); err != nil {
		t.Fatal(err)
	}
	if err := l.AddBlock("net", pfx("10.7.0.192/26"), 1); err != nil {
		t.Fatal(err)
	}
	_, _, err = l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r})
	if capacitySet(t, err) != 1 {
		t.Fatalf("err = %v, want a capacity error for range set 1", err)
	}
	if bs := l.Blocks("net"); bs[0].NextFresh != 0 || bs[0].Used != 0 {
		t.Fatalf("the failed allocation moved the block: %+v", bs[0])
	}
	if err := l.AddBlock("net", pfx("fd00:7::1:0/122"), 1); err != nil {
		t.Fatal(err)
	}
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r})
	if err != nil || fmt.Sprint(ls.IPs) != "[10.7.0.192/24 fd00:7::1:0/64]" {
		t.Fatalf("got %v %v", ls.IPs, err)
	}
	Audit(t, l)
	l2 := Open(t, reopen(), ledger.Options{Clock: clk})
	if got := l2.Blocks(""); len(got) != 2 || got[1].Set != 1 || got[1].NextFresh != 1 {
		t.Fatalf("after reopen blocks = %+v", got)
	}
}

// testBlocksFailedCommits: every block operation, and allocations and releases in
// blocks, whose commit fails at each step leave the ledger agreeing with its store
// (audit and a fresh open), and succeed when retried.
func testBlocksFailedCommits(t *testing.T, newStore Factory) {
	for _, step := range faultstore.Steps() {
		t.Run(step.String(), func(t *testing.T) {
			inner, _ := newStore(t)
			st := faultstore.New(inner, nil)
			clk := NewClock()
			opts := ledger.Options{Clock: clk, ReuseDelay: time.Minute}
			l := Open(t, st, opts)
			r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
			if err := l.DeclareCluster("net", r, []int{26}); err != nil {
				t.Fatal(err)
			}
			a, b, c := pfx("10.7.0.0/26"), pfx("10.7.0.64/26"), pfx("10.7.0.128/26")
			pod := ledger.Pod{UID: "u1"}
			ops := []struct {
				name string
				fn   func() error
			}{
				{"add a", func() error { return l.AddBlock("net", a, 1) }},
				{"allocate fresh", func() error {
					_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("p1"), Pod: pod})
					return err
				}},
				{"allocate more", func() error {
					_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("p2")})
					return err
				}},
				{"release", func() error { _, _, err := l.Release(Key("p1"), ledger.ReasonDEL, ""); return err }},
				{"add b", func() error { return l.AddBlock("net", b, 2) }},
				{"suspend a", func() error { return l.SuspendBlock("net", a) }},
				{"release in suspended", func() error { _, _, err := l.Release(Key("p2"), ledger.ReasonDEL, ""); return err }},
				{"resume a", func() error { return l.ResumeBlock("net", a, 1) }},
				{"same uid back", func() error {
					_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("p3"), Pod: pod})
					return err
				}},
				{"lose a", func() error { return l.LoseBlock("net", a) }},
				{"release in lost", func() error { _, _, err := l.Release(Key("p3"), ledger.ReasonDEL, ""); return err }},
				{"add c", func() error { return l.AddBlock("net", c, 1) }},
				{"remove c", func() error { return l.RemoveBlock("net", c) }},
				{"suspend all", func() error { return l.SuspendAll() }},
			}
			for _, op := range ops {
				st.FailNext(step)
				err := op.fn()
				if !errors.Is(err, ledger.ErrStore) {
					t.Fatalf("%s with a commit failing %s: err = %v, want ErrStore", op.name, step, err)
				}
				Audit(t, l)
				SameAsStore(t, l, st.Inner(), opts)
				if err := op.fn(); err != nil && !(step == faultstore.AfterSync && errors.Is(err, ledger.ErrBlockEpoch)) {
					t.Fatalf("%s retried: %v", op.name, err)
				}
				SameAsStore(t, l, st.Inner(), opts)
			}
			if bs := l.Blocks("net"); len(bs) != 1 || bs[0].Prefix != b || bs[0].State != ledger.BlockSuspended {
				t.Fatalf("blocks at the end: %+v, want b suspended", bs)
			}
		})
	}
}

// testBlocksWithheld: an address the block withholds (borrowed by another node,
// kept for a StatefulSet pod) is never handed out, fresh or free; one released
// while withheld is not kept free; the block is not removed meanwhile; once no
// longer withheld it is free again (after the reuse delay), and the lease that
// held a withheld address kept it all along.
func testBlocksWithheld(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk, ReuseDelay: time.Minute})
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
	if err := l.DeclareCluster("net", r, []int{28}); err != nil {
		t.Fatal(err)
	}
	block := pfx("10.7.0.16/28")
	if err := l.AddBlock("net", block, 1); err != nil {
		t.Fatal(err)
	}
	alloc := func(cid string) (netip.Addr, error) {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(cid), Ranges: r})
		if err != nil {
			return netip.Addr{}, err
		}
		return ls.IPs[0].Addr(), nil
	}
	a, err := alloc("sticky") // 10.7.0.16: kept by a lease while withheld
	if err != nil {
		t.Fatal(err)
	}
	b, err := alloc("lent") // 10.7.0.17: released, then lent out
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Release(Key("lent"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	fresh := netip.MustParseAddr("10.7.0.25") // never handed out yet
	if err := l.SetWithheld("net", block, []netip.Addr{a, b, fresh}); err != nil {
		t.Fatal(err)
	}
	if err := l.SetWithheld("net", block, []netip.Addr{netip.MustParseAddr("10.7.0.40")}); !errors.Is(err, ledger.ErrUnknownBlock) {
		t.Fatalf("withholding an address outside the block: %v, want ErrUnknownBlock", err)
	}
	clk.Advance(time.Hour) // past every reuse delay
	withheld := map[netip.Addr]bool{a: true, b: true, fresh: true}
	n := 0
	for ; ; n++ {
		got, err := alloc(fmt.Sprintf("c%d", n))
		if capacitySet(t, err) == 0 {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if withheld[got] {
			t.Fatalf("allocation %d handed out withheld %s", n, got)
		}
	}
	if n != 16-3 {
		t.Fatalf("handed out %d addresses of the /28, want 13 (16 less 3 withheld)", n)
	}
	if _, _, err := l.Release(Key("sticky"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	if got, err := alloc("after-release"); capacitySet(t, err) != 0 {
		t.Fatalf("after the release of a withheld address: got %s %v, want no capacity", got, err)
	}
	if bs := l.Blocks("net"); len(bs) != 1 || bs[0].Withheld != 3 || bs[0].Free != 0 {
		t.Fatalf("blocks %+v, want 3 withheld, none free", bs)
	}
	Audit(t, l)
	for i := range n {
		if _, _, err := l.Release(Key(fmt.Sprintf("c%d", i)), ledger.ReasonDEL, ""); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.RemoveBlock("net", block); !errors.Is(err, ledger.ErrBlockInUse) {
		t.Fatalf("removing a block that withholds addresses: %v, want ErrBlockInUse", err)
	}
	if err := l.SetWithheld("net", block, []netip.Addr{fresh}); err != nil {
		t.Fatal(err)
	}
	if got := l.Withheld("net", block); len(got) != 1 || got[0] != fresh {
		t.Fatalf("withheld %v, want [%s]", got, fresh)
	}
	if bs := l.Blocks("net"); bs[0].Free != 15 {
		t.Fatalf("blocks %+v, want 15 free (13 released, 2 no longer withheld)", bs)
	}
	if err := l.SetWithheld("net", block, nil); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveBlock("net", block); err != nil {
		t.Fatalf("removing the block once nothing is withheld: %v", err)
	}
}

// testBlocksWant: a sticky address kept here (withheld) is given to the pod that
// asks for it (AllocateRequest.Want) and to nobody else; one borrowed from
// another node's block is held outside the node's blocks, survives a reopen,
// and is not kept free here when released; an address neither free nor kept is
// refused with ErrAddressUnavailable, as is one held by another lease.
func testBlocksWant(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	l, err := ledger.Open(st, ledger.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.7.0.0/24"}]]`)
	if err := l.DeclareCluster("net", r, []int{28}); err != nil {
		t.Fatal(err)
	}
	block := pfx("10.7.0.16/28")
	if err := l.AddBlock("net", block, 1); err != nil {
		t.Fatal(err)
	}
	first, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("web-0-old"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	x := first.IPs[0].Addr()
	if err := l.SetWithheld("net", block, []netip.Addr{x}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("thief"), Ranges: r, Want: []netip.Addr{x}}); !errors.Is(err, ledger.ErrAddressUnavailable) {
		t.Fatalf("asking for an address held by another lease: %v, want ErrAddressUnavailable", err)
	}
	if _, _, err := l.Release(Key("web-0-old"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	if other, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("other"), Ranges: r}); err != nil || other.IPs[0].Addr() == x {
		t.Fatalf("another pod got %v %v; never the kept %s", other.IPs, err, x)
	}
	const why = "sticky for web-0 (StatefulSet default/web)"
	again, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("web-0-new"), Ranges: r, Sticky: true, Want: []netip.Addr{x}, Why: why})
	if err != nil || again.IPs[0].Addr() != x || again.Why != why || len(again.Borrowed) != 0 {
		t.Fatalf("the re-created pod got %+v %v, want %s, why %q, nothing borrowed", again, err, x, why)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("fresh"), Ranges: r, Sticky: true, Want: []netip.Addr{netip.MustParseAddr("10.7.0.30")}}); !errors.Is(err, ledger.ErrAddressUnavailable) {
		t.Fatalf("asking for an address neither free nor kept: %v, want ErrAddressUnavailable", err)
	}
	y := netip.MustParseAddr("10.7.0.40") // in another node's block
	lent, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("web-1"), Ranges: r, Sticky: true, Want: []netip.Addr{y}, Why: "sticky for web-1, borrowed from node node-b"})
	if err != nil || lent.IPs[0].Addr() != y || !slices.Equal(lent.Borrowed, []netip.Addr{y}) {
		t.Fatalf("borrowed allocation %+v %v, want %s recorded as borrowed", lent, err, y)
	}
	Audit(t, l)
	l2 := Open(t, reopen(), ledger.Options{Clock: clk})
	if got, ok := l2.Lease(Key("web-1")); !ok || !slices.Equal(got.Borrowed, []netip.Addr{y}) {
		t.Fatalf("after reopen web-1 = %+v (%v), want %s borrowed", got, ok, y)
	}
	if _, _, err := l2.Release(Key("web-1"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	for _, f := range l2.FreeAddresses("net") {
		if f.IP == y {
			t.Fatalf("the borrowed %s is kept free here after its release", y)
		}
	}
	if h, err := l2.History("net", y); err != nil || len(h) != 1 || h[0].Key != Key("web-1") || h[0].Why != lent.Why {
		t.Fatalf("history of %s: %+v %v, want web-1's release, why %q", y, h, err, lent.Why)
	}
}
