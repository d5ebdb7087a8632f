package agent_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// statefulSets answers StatefulSetOf from a map "namespace/name" -> StatefulSet.
type statefulSets map[string]string

var _ agent.StatefulSets = statefulSets(nil)

func (s statefulSets) StatefulSetOf(_ context.Context, namespace, name, _ string) (string, error) {
	return s[namespace+"/"+name], nil
}

// stickyNode is a cluster node whose agent knows the pods' StatefulSets and
// records their Events.
func stickyNode(t *testing.T, ds *memds.Store, clk *clocktest.Clock, name string, sts statefulSets) (*clusterNode, *recordedEvents) {
	ev := &recordedEvents{}
	n := newClusterNode(t, ds, clk, name, func(c *agent.Config) { c.StatefulSets, c.Events = sts, ev })
	return n, ev
}

func (n *clusterNode) addPod(cid string, pod api.Pod) *api.Response {
	return n.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAdd, Network: "pods", ContainerID: cid, IfName: "eth0",
		Ranges: ledgertest.Ranges(n.t, `[[{"subnet":"10.60.0.0/27"}]]`), BlockSize: 29, Pod: pod})
}

// TestStickyThroughTheAgent: in cluster mode a StatefulSet's pod keeps its
// address from node to node through the agent's ADD (the lease's WHY says so), a
// pod of no StatefulSet is served as before, another node asking for the address
// while one holds it is refused with a conflict naming the holder and a Warning
// Event, and a GC that releases the holder's lease gives the borrowed address
// back in the same flow, so that the next node gets it at once.
func TestStickyThroughTheAgent(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	sts := statefulSets{"default/web-0": "web"}
	a, _ := stickyNode(t, ds, clk, "node-a", sts)
	b, _ := stickyNode(t, ds, clk, "node-b", sts)
	c, evC := stickyNode(t, ds, clk, "node-c", sts)
	web0 := func(uid string) api.Pod { return api.Pod{Namespace: "default", Name: "web-0", UID: uid} }

	r := a.addPod("s1", web0("u1"))
	if r.Error != nil {
		t.Fatalf("ADD web-0 on node-a: %+v", r.Error)
	}
	x := r.Lease.IPs[0]
	if want := "sticky for web-0 (StatefulSet default/web)"; r.Lease.Why != want {
		t.Fatalf("web-0 on node-a: why %q, want %q", r.Lease.Why, want)
	}
	if r := a.addPod("plain", api.Pod{Namespace: "default", Name: "plain", UID: "u9"}); r.Error != nil || r.Lease.Why != agent.WhyDefault || r.Lease.IPs[0] == x {
		t.Fatalf("a pod of no StatefulSet: %+v %+v, want the default pool and not %s", r.Error, r.Lease, x)
	}
	if r := a.call(api.OpDel, "s1"); r.Error != nil {
		t.Fatal(r.Error)
	}

	r = b.addPod("s2", web0("u2"))
	if r.Error != nil {
		t.Fatalf("web-0 re-created on node-b: %+v", r.Error)
	}
	if r.Lease.IPs[0] != x || r.Lease.Why != "sticky for web-0, borrowed from node node-a" {
		t.Fatalf("web-0 on node-b: %v %q, want %s borrowed from node-a", r.Lease.IPs, r.Lease.Why, x)
	}
	if ls, ok := b.l.Lease(ledger.Key{Network: "pods", ContainerID: "s2", IfName: "eth0"}); !ok || len(ls.Borrowed) != 1 {
		t.Fatalf("node-b's lease: %+v, want one borrowed address", ls)
	}

	// node-c while node-b holds it (a split brain): refused, naming node-b
	r = c.addPod("s3", web0("u2"))
	if r.Error == nil || r.Error.Code != api.CodeConflict || !strings.Contains(r.Error.Msg, "borrowed by node node-b") {
		t.Fatalf("node-c while node-b holds web-0's address: %+v, want a conflict naming node-b", r.Error)
	}
	evs := evC.take()
	if !slices.ContainsFunc(evs, func(e podEvent) bool {
		return e.name == "web-0" && e.typ == "Warning" && e.reason == agent.ReasonStickyAddressHeld && strings.Contains(e.note, "node-b")
	}) {
		t.Fatalf("Events on node-c: %+v, want a Warning %s naming node-b", evs, agent.ReasonStickyAddressHeld)
	}
	if _, held := c.l.Lease(ledger.Key{Network: "pods", ContainerID: "s3", IfName: "eth0"}); held {
		t.Fatal("the refused ADD left a lease")
	}

	// GC on node-b releases its lease: the address goes back to its block at once
	if r := b.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpGC, Network: "pods"}); r.Error != nil || r.Released != 1 {
		t.Fatalf("GC on node-b: released %d, %+v", r.Released, r.Error)
	}
	r = c.addPod("s3", web0("u3"))
	if r.Error != nil || r.Lease.IPs[0] != x {
		t.Fatalf("web-0 on node-c after node-b's GC: %+v %+v, want %s", r.Error, r.Lease, x)
	}
	// and DEL on node-c returns it too: node-b gets it again
	if r := c.call(api.OpDel, "s3"); r.Error != nil {
		t.Fatal(r.Error)
	}
	if r := b.addPod("s4", web0("u4")); r.Error != nil || r.Lease.IPs[0] != x {
		t.Fatalf("web-0 on node-b after node-c's DEL: %+v %+v, want %s", r.Error, r.Lease, x)
	}
}

// stsCache is a StatefulSetCache: replicas and the first ordinal (start, 0
// when absent) by "namespace/name"; known false: not listed.
type stsCache struct {
	known    bool
	replicas map[string]int32
	start    map[string]int32
}

var _ agent.StatefulSetCache = (*stsCache)(nil)

func (c *stsCache) Ordinals(namespace, name string) (int32, int32, bool, bool) {
	r, ok := c.replicas[namespace+"/"+name]
	return c.start[namespace+"/"+name], r, ok, c.known
}

func (c *stsCache) Changed() <-chan struct{} { return nil }

// kept is the addresses of node n's blocks kept for each pod ("ns/sts/pod").
func (n *clusterNode) kept() map[string]string {
	n.t.Helper()
	bs, err := n.m.Blocks(context.Background())
	if err != nil {
		n.t.Fatal(err)
	}
	out := map[string]string{}
	for _, b := range bs {
		if b.Owner != n.m.Node() {
			continue
		}
		for _, k := range b.Borrows {
			out[k.For] = k.Addr.String()
		}
	}
	return out
}

// TestStickyRetention: an agent releases the kept addresses of its blocks when
// the StatefulSet is scaled down below their ordinals, or deleted, never on a
// StatefulSet cache that has not listed, and keeps an address lent to another
// node until it comes back; with a retention, an address in use stays kept.
func TestStickyRetention(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	sts := statefulSets{"default/web-0": "web", "default/web-1": "web", "default/web-2": "web", "default/db-0": "db",
		"default/shard-5": "shard", "default/shard-6": "shard"}
	// shard's ordinals start at 5 (spec.ordinals.start): shard-5 and shard-6
	cache := &stsCache{replicas: map[string]int32{"default/web": 3, "default/db": 1, "default/shard": 2},
		start: map[string]int32{"default/shard": 5}}
	a := newClusterNode(t, ds, clk, "node-a", func(c *agent.Config) {
		c.StatefulSets, c.StatefulSetCache, c.StickyRetention = sts, cache, time.Hour
	})
	b, _ := stickyNode(t, ds, clk, "node-b", sts)
	for _, name := range []string{"web-0", "web-1", "web-2", "shard-5", "shard-6"} {
		if r := a.addPod(name, api.Pod{Namespace: "default", Name: name, UID: name}); r.Error != nil {
			t.Fatalf("ADD %s: %+v", name, r.Error)
		}
	}
	// db-0 lives on node-b, from node-b's block
	if r := b.addPod("db-0", api.Pod{Namespace: "default", Name: "db-0", UID: "db-0"}); r.Error != nil {
		t.Fatal(r.Error)
	}
	all := a.kept()
	if len(all) != 5 {
		t.Fatalf("node-a keeps %v, want web-0..2 and shard-5..6", all)
	}
	sweep := func() {
		t.Helper()
		if err := a.s.SweepRetention(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// scaled down to 1, but the cache has not listed: nothing goes
	cache.replicas["default/web"] = 1
	sweep()
	if got := a.kept(); len(got) != 5 {
		t.Fatalf("released on an unlisted cache: %v", got)
	}
	cache.known = true
	// two hours in use: the retention does not end the keeping of a held address
	for range 2 {
		sweep()
		clk.Advance(time.Hour)
		if err := a.m.Renew(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	sweep()
	// shard's ordinals 5 and 6 are above its 2 replicas and still its pods
	if got := a.kept(); len(got) != 3 || got["default/web/web-0"] != all["default/web/web-0"] ||
		got["default/shard/shard-5"] != all["default/shard/shard-5"] || got["default/shard/shard-6"] != all["default/shard/shard-6"] {
		t.Fatalf("after web's scale-down to 1: node-a keeps %v, want web-0's and shard-5..6's only", got)
	}
	// shard's ordinals moved to start at 6: ordinal 5 is gone, 6 stays
	cache.start["default/shard"] = 6
	sweep()
	if got := a.kept(); len(got) != 2 || got["default/shard/shard-6"] != all["default/shard/shard-6"] {
		t.Fatalf("after shard's ordinals start at 6: node-a keeps %v, want web-0's and shard-6's only", got)
	}
	delete(cache.replicas, "default/shard")
	// node-a sweeps its own blocks only: db's address in node-b's block stays
	delete(cache.replicas, "default/web")
	delete(cache.replicas, "default/db")
	sweep()
	if got := a.kept(); len(got) != 0 {
		t.Fatalf("after the StatefulSet's deletion: node-a keeps %v", got)
	}
	if got := b.kept(); len(got) != 1 {
		t.Fatalf("node-a's sweep touched node-b's block: %v", got)
	}
	// the pods keep their addresses meanwhile
	for _, name := range []string{"web-0", "web-1", "web-2", "shard-5", "shard-6"} {
		if _, held := a.l.Lease(ledger.Key{Network: "pods", ContainerID: name, IfName: "eth0"}); !held {
			t.Fatalf("the retention's end released %s's lease", name)
		}
	}
}

// TestStickyReservedThroughTheAgent: a StatefulSet pod's kept address that an
// IPReservation covers once the pod is gone is not given back when the pod is
// re-created on another node: the ADD gets a fresh address, the lease's Why names
// the reservation, and a Warning Event on the pod says so.
func TestStickyReservedThroughTheAgent(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	rs := cluster.NewReservations(ds.Open(), ledgertest.TestLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { rs.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	sts := statefulSets{"default/web-0": "web"}
	withRes := func(c *agent.Config) { c.Reservations = rs }
	a := newClusterNode(t, ds, clk, "node-a", func(c *agent.Config) { c.StatefulSets = sts; withRes(c) })
	evB := &recordedEvents{}
	b := newClusterNode(t, ds, clk, "node-b", func(c *agent.Config) { c.StatefulSets, c.Events = sts, evB; withRes(c) })
	web0 := func(uid string) api.Pod { return api.Pod{Namespace: "default", Name: "web-0", UID: uid} }

	r := a.addPod("s1", web0("u1"))
	if r.Error != nil {
		t.Fatalf("ADD web-0 on node-a: %+v", r.Error)
	}
	x, _, _ := strings.Cut(r.Lease.IPs[0], "/")
	if r := a.call(api.OpDel, "s1"); r.Error != nil {
		t.Fatal(r.Error)
	}
	if _, err := ds.Create(ctx, cluster.ReservationKey("db"), []byte(`{"addresses":["`+x+`"],"reason":"database VIP"}`)); err != nil {
		t.Fatal(err)
	}
	for {
		cur, err := rs.Current()
		if err == nil && len(cur) == 1 {
			break
		}
		<-rs.Changed()
	}
	r = b.addPod("s2", web0("u2"))
	if r.Error != nil {
		t.Fatalf("web-0 re-created on node-b: %+v", r.Error)
	}
	if got, _, _ := strings.Cut(r.Lease.IPs[0], "/"); got == x {
		t.Fatalf("web-0 re-created on node-b got its kept %s, which IPReservation db covers", x)
	}
	if want := "no longer kept: " + x + " reserved by IPReservation db"; !strings.Contains(r.Lease.Why, want) {
		t.Fatalf("why %q, want it to say %q", r.Lease.Why, want)
	}
	evs := evB.take()
	if !slices.ContainsFunc(evs, func(e podEvent) bool {
		return e.name == "web-0" && e.typ == "Warning" && e.reason == agent.ReasonStickyAddressReserved &&
			strings.Contains(e.note, x+" reserved by IPReservation db") && strings.Contains(e.note, r.Lease.IPs[0][:strings.IndexByte(r.Lease.IPs[0], '/')])
	}) {
		t.Fatalf("Events on node-b: %+v, want a Warning %s naming %s, the reservation and the new address", evs, agent.ReasonStickyAddressReserved, x)
	}
}
