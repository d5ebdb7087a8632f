package agent_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
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
