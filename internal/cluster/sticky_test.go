package cluster_test

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// A StatefulSet pod re-created under its name on node after node keeps its
// address: kept in node-a's block at its first ADD, borrowed by node-b, returned
// at node-b's DEL, borrowed by node-c; Why says so on each lease, every node's
// Owners routes the /32 to the node the pod is on (none when it is on the owner),
// nobody else gets the address meanwhile, and releasing its retention (scale
// down) makes it node-a's to hand out again.
func TestStickyPodMoves(t *testing.T) { forBackends(t, testStickyPodMoves) }

func testStickyPodMoves(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.43.0.0/24"}]]`)
	nodes := map[string]*agent{}
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		nodes[n] = c.agent(n, r, []int{26})
	}
	pod := cluster.StickyPod{Namespace: "default", StatefulSet: "web", Pod: "web-0"}
	add := func(node, cid string) (ledger.Lease, error) {
		ls, _, err := nodes[node].m.AllocateSticky(ctx, ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}}, pod)
		return ls, err
	}
	del := func(node, cid string) {
		t.Helper()
		ls, ok, err := nodes[node].l.Release(ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, ledger.ReasonDEL, "")
		if err != nil || !ok {
			t.Fatalf("%s: DEL %s: %v %v", node, cid, ok, err)
		}
		if err := nodes[node].m.ReturnBorrowed(ctx, ls); err != nil {
			t.Fatal(err)
		}
	}
	routedTo := func(x netip.Addr) map[string]string {
		t.Helper()
		out := map[string]string{}
		for n, a := range nodes {
			blocks, err := a.m.Owners(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, b := range blocks {
				if b.Borrowed && b.Prefix == netip.PrefixFrom(x, 32) {
					out[n] = b.Owner
				}
			}
		}
		return out
	}

	first, err := add("node-a", "sandbox-1")
	if err != nil {
		t.Fatal(err)
	}
	x := first.IPs[0].Addr()
	if first.Why != "sticky for web-0 (StatefulSet default/web)" {
		t.Fatalf("first lease's why %q", first.Why)
	}
	if again, err := add("node-a", "sandbox-1"); err != nil || again.IPs[0].Addr() != x {
		t.Fatalf("ADD again: %v %v, want the same lease", again.IPs, err)
	}
	del("node-a", "sandbox-1")
	// nobody else gets it on node-a meanwhile
	for i := range 70 {
		if got := nodes["node-a"].mustAlloc(t, fmt.Sprint("other-", i)).IPs[0].Addr(); got == x {
			t.Fatalf("node-a handed the kept %s to another pod", x)
		}
	}
	history := []string{fmt.Sprintf("node-a: %s %q", x, first.Why)}
	for i, node := range []string{"node-b", "node-c", "node-a", "node-b"} {
		cid := fmt.Sprint("sandbox-", i+2)
		ls, err := add(node, cid)
		if err != nil {
			t.Fatalf("re-created on %s: %v", node, err)
		}
		if ls.IPs[0].Addr() != x {
			t.Fatalf("re-created on %s with %v, want %s", node, ls.IPs, x)
		}
		want, wantBorrowed := "sticky for web-0, borrowed from node node-a", []netip.Addr{x}
		if node == "node-a" {
			want, wantBorrowed = "sticky for web-0 (StatefulSet default/web)", nil
		}
		if ls.Why != want || !slices.Equal(ls.Borrowed, wantBorrowed) {
			t.Fatalf("on %s: why %q borrowed %v, want %q %v", node, ls.Why, ls.Borrowed, want, wantBorrowed)
		}
		history = append(history, fmt.Sprintf("%s: %s %q", node, x, ls.Why))
		routes := routedTo(x)
		for n := range nodes {
			if node == "node-a" {
				if len(routes) != 0 {
					t.Fatalf("on its owner, the address is borrowed by nobody; routes %v", routes)
				}
				continue
			}
			if routes[n] != node {
				t.Fatalf("pod on %s: %s's Owners route %s to %q", node, n, x, routes[n])
			}
		}
		// another pod asking for it while it is lent or held: refused
		other := cluster.StickyPod{Namespace: "default", StatefulSet: "web", Pod: "web-1"}
		ls2, _, err := nodes["node-c"].m.AllocateSticky(ctx, ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: "web-1-" + cid, IfName: "eth0"}}, other)
		if err != nil || ls2.IPs[0].Addr() == x {
			t.Fatalf("web-1 got %v %v, want another address", ls2.IPs, err)
		}
		if _, _, err := nodes["node-c"].l.Release(ls2.Key, ledger.ReasonDEL, ""); err != nil {
			t.Fatal(err)
		}
		del(node, cid)
	}
	t.Logf("web-0's address as it moved:\n%s", fmt.Sprint(history))
	if got := routedTo(x); len(got) != 0 {
		t.Fatalf("after the last DEL the address is still routed: %v", got)
	}
	// a second borrower while one holds it: refused with the holder's name
	if _, err := add("node-b", "sandbox-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := add("node-c", "sandbox-c"); !errors.Is(err, cluster.ErrBorrowed) {
		t.Fatalf("node-c while node-b holds it: %v, want ErrBorrowed", err)
	}
	if err := nodes["node-a"].m.ReleaseKept(ctx, "net", pod); !errors.Is(err, cluster.ErrBorrowed) {
		t.Fatalf("scale-down while node-b holds it: %v, want ErrBorrowed (kept until returned)", err)
	}
	del("node-b", "sandbox-b")
	// scale-down: retention ends, node-a may hand it out again
	if err := nodes["node-a"].m.ReleaseKept(ctx, "net", pod); err != nil {
		t.Fatal(err)
	}
	c.clk.Advance(3 * time.Second)
	if err := nodes["node-a"].m.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	var got []netip.Addr
	for i := range 64 {
		got = append(got, nodes["node-a"].mustAlloc(t, fmt.Sprint("after-", i)).IPs[0].Addr())
	}
	if !slices.Contains(got, x) {
		t.Fatalf("%s not handed out again after the scale-down", x)
	}
}

// A borrow whose lease never came (a crash between the two, a Return that
// failed) is returned by the borrower's own sweep: its ledger holds no lease of
// the address.
func TestOrphanBorrowReturned(t *testing.T) { forBackends(t, testOrphanBorrowReturned) }

func testOrphanBorrowReturned(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.44.0.0/24"}]]`)
	a := c.agent("node-a", r, []int{26})
	b := c.agent("node-b", r, []int{26})
	x := a.mustAlloc(t, "web-0").IPs[0].Addr()
	if err := a.m.Keep(ctx, "net", x, web0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.m.Borrow(ctx, "net", x, web0); err != nil {
		t.Fatal(err)
	}
	if err := b.m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := blockRec(t, c.ds, blockOf(x)); rec.Borrows[0].Node != "" {
		t.Fatalf("after node-b's sweep: %+v, want the orphan borrow returned", rec)
	}
}

// The owner of a kept address is one side of the race too: a StatefulSet pod
// re-created on node-b while its old sandbox still runs (or restarts) on node-a,
// the block's owner, gets the address on one node only. The owner holds it in the
// block record by the same compare-and-swap a borrower uses, so node-b's ADD fails
// while node-a's pod holds it, node-a's ADD fails while node-b holds it, and of
// the two racing, exactly one wins. A pod of the owner holding a kept address the
// record does not show held (a lease from an older release) is recorded held by
// the owner's sweep, and nobody can borrow it from under the pod.
func TestStickyOwnerRaces(t *testing.T) { forBackends(t, testStickyOwnerRaces) }

func testStickyOwnerRaces(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.45.0.0/24"}]]`)
	a := c.agent("node-a", r, []int{26})
	b := c.agent("node-b", r, []int{26})
	pod := cluster.StickyPod{Namespace: "default", StatefulSet: "web", Pod: "web-0"}
	add := func(n *agent, cid string) (ledger.Lease, error) {
		ls, _, err := n.m.AllocateSticky(ctx, ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}}, pod)
		return ls, err
	}
	del := func(n *agent, cid string) {
		t.Helper()
		ls, ok, err := n.l.Release(ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, ledger.ReasonDEL, "")
		if err != nil || !ok {
			t.Fatalf("DEL %s: %v %v", cid, ok, err)
		}
		if err := n.m.ReturnBorrowed(ctx, ls); err != nil {
			t.Fatal(err)
		}
	}
	first, err := add(a, "a-1")
	if err != nil {
		t.Fatal(err)
	}
	x := first.IPs[0].Addr()
	if _, err := add(b, "b-1"); !errors.Is(err, cluster.ErrBorrowed) {
		t.Fatalf("node-b while the owner's pod holds %s: %v, want ErrBorrowed", x, err)
	}
	if _, ok := b.l.Holder("net", x); ok {
		t.Fatalf("node-b's ledger holds %s after its refused ADD", x)
	}
	del(a, "a-1")
	if _, err := add(b, "b-2"); err != nil {
		t.Fatal(err)
	}
	if _, err := add(a, "a-2"); !errors.Is(err, cluster.ErrBorrowed) {
		t.Fatalf("the owner while node-b holds %s: %v, want ErrBorrowed", x, err)
	}
	if _, ok := a.l.Holder("net", x); ok {
		t.Fatalf("node-a's ledger holds %s after its refused ADD", x)
	}
	del(b, "b-2")

	for round := range 20 {
		var wg sync.WaitGroup
		res := map[*agent]error{}
		var mu sync.Mutex
		for _, n := range []*agent{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := add(n, fmt.Sprint("race-", round))
				mu.Lock()
				res[n] = err
				mu.Unlock()
			}()
		}
		wg.Wait()
		var won []*agent
		for n, err := range res {
			switch {
			case err == nil:
				won = append(won, n)
			case !errors.Is(err, cluster.ErrBorrowed):
				t.Fatalf("round %d: %v, want success or ErrBorrowed", round, err)
			}
		}
		if len(won) != 1 {
			t.Fatalf("round %d: %d nodes got %s (errors %v), want exactly one", round, len(won), x, res)
		}
		for _, n := range []*agent{a, b} {
			if _, ok := n.l.Holder("net", x); ok != (n == won[0]) {
				t.Fatalf("round %d: ledger holds %s: %v, winner %v", round, x, ok, n == won[0])
			}
		}
		del(won[0], fmt.Sprint("race-", round))
	}

	// an owner's lease the record does not show held: its sweep records it
	y := a.mustAlloc(t, "web-1").IPs[0].Addr()
	if err := a.m.Keep(ctx, "net", y, "default/web/web-1"); err != nil {
		t.Fatal(err)
	}
	if err := a.m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	rec := blockRec(t, c.ds, blockOf(y))
	if i := slices.IndexFunc(rec.Borrows, func(k cluster.Borrow) bool { return k.Addr == y }); i < 0 || rec.Borrows[i].Node != "node-a" {
		t.Fatalf("after the owner's sweep: %+v, want %s held by node-a", rec.Borrows, y)
	}
	if _, err := b.m.Borrow(ctx, "net", y, "default/web/web-1"); !errors.Is(err, cluster.ErrBorrowed) {
		t.Fatalf("borrowing %s from under the owner's pod: %v, want ErrBorrowed", y, err)
	}
}

// A kept address that an IPReservation covers once its pod is gone is no
// longer kept: the pod re-created (on another node, or on the block's owner)
// gets a fresh address from its pool, which is kept for it from then on; the
// lease's Why names the reservation; the record forgets the reserved address and
// the owner's ledger stops withholding it (at its sweep, when another node ended
// the keeping). A pod still holding its kept address when the reservation covers
// it keeps it: its re-creation elsewhere fails as before, and the address stays
// kept.
func TestStickyReserved(t *testing.T) { forBackends(t, testStickyReserved) }

func testStickyReserved(t *testing.T, newC func(*testing.T) *cl) {
	c := newC(t)
	r := ranges(t, `[[{"subnet":"10.46.0.0/24"}]]`)
	a := c.agent("node-a", r, []int{26})
	b := c.agent("node-b", r, []int{26})
	var rs []cluster.Reservation
	add := func(n *agent, name, cid string) (ledger.Lease, error) {
		pod := cluster.StickyPod{Namespace: "default", StatefulSet: "web", Pod: name, Reservations: rs}
		req := ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, Exclude: cluster.ReservedIn(rs, r)}
		ls, _, err := n.m.AllocateSticky(ctx, req, pod)
		return ls, err
	}
	mustAdd := func(n *agent, name, cid string) ledger.Lease {
		t.Helper()
		ls, err := add(n, name, cid)
		if err != nil {
			t.Fatalf("%s: ADD %s: %v", n.name, name, err)
		}
		return ls
	}
	del := func(n *agent, cid string) {
		t.Helper()
		ls, ok, err := n.l.Release(ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, ledger.ReasonDEL, "")
		if err != nil || !ok {
			t.Fatalf("%s: DEL %s: %v %v", n.name, cid, ok, err)
		}
		if err := n.m.ReturnBorrowed(ctx, ls); err != nil {
			t.Fatal(err)
		}
	}
	keptFor := func(x netip.Addr) string {
		t.Helper()
		for _, bw := range blockRec(t, c.ds, blockOf(x)).Borrows {
			if bw.Addr == x {
				return bw.For
			}
		}
		return ""
	}
	reserve := func(name string, xs ...netip.Addr) {
		res := cluster.Reservation{Name: name}
		for _, x := range xs {
			res.Prefixes = append(res.Prefixes, netip.PrefixFrom(x, 32))
		}
		rs = append(rs, res)
	}

	// web-0: first on node-a, gone; its address reserved; re-created on node-b
	x := mustAdd(a, "web-0", "web-0-1").IPs[0].Addr()
	del(a, "web-0-1")
	reserve("db", x)
	ls := mustAdd(b, "web-0", "web-0-2")
	y := ls.IPs[0].Addr()
	if y == x {
		t.Fatalf("web-0 re-created on node-b got its kept %s, which IPReservation db covers", x)
	}
	wantWhy := fmt.Sprintf("sticky for web-0 (StatefulSet default/web); no longer kept: %s reserved by IPReservation db", x)
	if ls.Why != wantWhy {
		t.Fatalf("why %q, want %q", ls.Why, wantWhy)
	}
	if got := keptFor(x); got != "" {
		t.Fatalf("%s still kept for %q", x, got)
	}
	if got := keptFor(y); got != web0 {
		t.Fatalf("the fresh %s kept for %q, want %s", y, got, web0)
	}
	// the owner's ledger stops withholding x at its sweep
	if !slices.Contains(a.l.Withheld("net", netip.MustParsePrefix(blockOf(x))), x) {
		t.Fatalf("node-a's ledger withholds %v before its sweep, want %s among them", a.l.Withheld("net", netip.MustParsePrefix(blockOf(x))), x)
	}
	if err := a.m.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if w := a.l.Withheld("net", netip.MustParsePrefix(blockOf(x))); slices.Contains(w, x) {
		t.Fatalf("node-a's ledger still withholds %s after its sweep: %v", x, w)
	}
	// the fresh address follows the pod from now on
	del(b, "web-0-2")
	if got := mustAdd(a, "web-0", "web-0-3").IPs[0].Addr(); got != y {
		t.Fatalf("web-0 re-created on node-a got %s, want its kept %s", got, y)
	}

	// web-1 on its block's owner: the owner ends the keeping itself
	z := mustAdd(a, "web-1", "web-1-1").IPs[0].Addr()
	del(a, "web-1-1")
	reserve("lb", z)
	ls = mustAdd(a, "web-1", "web-1-2")
	if got := ls.IPs[0].Addr(); got == z || !strings.Contains(ls.Why, "reserved by IPReservation lb") {
		t.Fatalf("web-1 re-created on node-a: %s %q, want a fresh address and the reservation named", got, ls.Why)
	}
	if got, w := keptFor(z), a.l.Withheld("net", netip.MustParsePrefix(blockOf(z))); got != "" || slices.Contains(w, z) {
		t.Fatalf("%s still kept for %q, withheld %v", z, got, w)
	}

	// web-2 still runs at its address when the reservation comes: it keeps it
	v := mustAdd(a, "web-2", "web-2-1").IPs[0].Addr()
	reserve("late", v)
	if _, err := add(b, "web-2", "web-2-2"); !errors.Is(err, cluster.ErrBorrowed) {
		t.Fatalf("web-2 re-created on node-b while node-a's pod holds %s: %v, want ErrBorrowed", v, err)
	}
	if _, ok := a.l.Holder("net", v); !ok || keptFor(v) != "default/web/web-2" {
		t.Fatalf("the live %s: held %v, kept for %q; want both kept", v, ok, keptFor(v))
	}
}
