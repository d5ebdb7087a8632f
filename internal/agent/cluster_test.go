package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// clusterNode is an agent in cluster mode: a real bbolt ledger, the real block
// manager (driven by hand: Manual) on a shared in-memory datastore.
type clusterNode struct {
	t *testing.T
	s *agent.Server
	l *ledger.Ledger
	m *cluster.Manager
}

// newClusterNode starts the node name; with sets each agent.Config edit before
// the server is made.
func newClusterNode(t *testing.T, ds *memds.Store, clk *clocktest.Clock, name string, with ...func(*agent.Config)) *clusterNode {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	l := ledgertest.Open(t, st, ledger.Options{Clock: clk})
	m, err := cluster.New(ds.Open(), l, cluster.Options{Node: name, Clock: clk, LeaseTTL: 3 * time.Second, Manual: true, Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	cfg := agent.Config{Ledger: l, Socket: filepath.Join(t.TempDir(), "s.sock"), Cluster: m, Datastore: "memory", Clock: clk, Logger: ledgertest.TestLogger(t)}
	for _, w := range with {
		w(&cfg)
	}
	s, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &clusterNode{t: t, s: s, l: l, m: m}
}

func (n *clusterNode) call(op, cid string) *api.Response {
	req := api.Request{Version: api.Version, Op: op, Network: "pods", ContainerID: cid, IfName: "eth0"}
	if op == api.OpAdd {
		req.Ranges, req.BlockSize = ledgertest.Ranges(n.t, `[[{"subnet":"10.60.0.0/27"}]]`), 29
	}
	return n.s.Handle(context.Background(), req)
}

// TestClusterModeThroughTheAgent: in cluster mode the agent's ADD claims a block
// (blockSize from the request) and allocates inside it, a second node gets another
// block, the blocks op and the leases show owner, epoch, used/free and the lease's
// block; DEL releases locally; STATUS reports degraded (CNI 50 through the plugin's
// mapping) when the datastore is away and the node's blocks are full, and ADD then
// answers "unavailable" while DEL still works; the metrics count the claims.
func TestClusterModeThroughTheAgent(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	a := newClusterNode(t, ds, clk, "node-a")
	b := newClusterNode(t, ds, clk, "node-b")

	blockOf := func(r *api.Response) netip.Prefix {
		t.Helper()
		if r.Error != nil || r.Lease == nil {
			t.Fatalf("ADD: %+v", r.Error)
		}
		p := netip.MustParsePrefix(r.Lease.IPs[0])
		bp, _ := p.Addr().Prefix(29)
		if r.Lease.Block != bp.String() || r.Lease.Lost {
			t.Fatalf("lease %v: block %q lost %v, want %s", r.Lease.IPs, r.Lease.Block, r.Lease.Lost, bp)
		}
		return bp
	}
	ba := blockOf(a.call(api.OpAdd, "a1"))
	bb := blockOf(b.call(api.OpAdd, "b1"))
	if ba == bb {
		t.Fatalf("both nodes allocate in block %s", ba)
	}
	view := a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpBlocks})
	if view.Error != nil || view.Cluster == nil || view.Cluster.Node != "node-a" || view.Cluster.Degraded {
		t.Fatalf("blocks: %+v %+v", view.Error, view.Cluster)
	}
	states := map[string]api.BlockView{}
	for _, bv := range view.Cluster.Blocks {
		states[bv.Block] = bv
	}
	if v := states[ba.String()]; v.State != api.BlockOwned || v.Owner != "node-a" || v.Epoch < 1 || v.Used == nil || *v.Used != 1 || *v.Free < 1 {
		t.Errorf("node-a's block as node-a sees it: %+v", v)
	}
	if v := states[bb.String()]; v.State != api.BlockOther || v.Owner != "node-b" || v.Used != nil {
		t.Errorf("node-b's block as node-a sees it: %+v", v)
	}
	if st := a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpStatus, Network: "pods"}); st.Error != nil {
		t.Errorf("STATUS with a free address: %+v", st.Error)
	}

	// fill node-a's block (a /29 of a /27 has 8 addresses; the first block loses the
	// network address), then take the datastore away
	var i int
	for i = 2; ; i++ {
		r := a.call(api.OpAdd, fmt.Sprint("a", i))
		if r.Error != nil {
			t.Fatalf("ADD a%d: %+v", i, r.Error)
		}
		if bp, _ := netip.MustParsePrefix(r.Lease.IPs[0]).Addr().Prefix(29); bp != ba {
			break // the next block was claimed
		}
	}
	if c := a.m.Counts(); c.Claims != 2 || c.Owned != 2 {
		t.Errorf("counts after two claims: %+v", c)
	}
	for j := i + 1; ; j++ { // fill the second block too
		if p, _ := a.l.Pool("pods"); !p.Available {
			break
		}
		if r := a.call(api.OpAdd, fmt.Sprint("a", j)); r.Error != nil {
			t.Fatalf("ADD a%d: %+v", j, r.Error)
		}
	}
	ds.SetAvailable(false)
	clk.Advance(time.Second)
	a.m.Sweep(context.Background()) // notes the datastore is unreachable
	r := a.call(api.OpAdd, "needs-a-block")
	if r.Error == nil || r.Error.Code != api.CodeUnavailable {
		t.Fatalf("ADD needing a block with the datastore away: %+v, want %q", r.Error, api.CodeUnavailable)
	}
	st := a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpStatus, Network: "pods"})
	if st.Error == nil || st.Error.Code != api.CodeExhausted || !strings.Contains(st.Error.Msg, "degraded") {
		t.Fatalf("STATUS with full blocks and the datastore away: %+v", st.Error)
	}
	if r := a.call(api.OpDel, "a1"); r.Error != nil || r.Released != 1 {
		t.Fatalf("DEL with the datastore away: %+v", r)
	}
	// one address free again in an owned block: served without the datastore, and
	// STATUS no longer degraded while the lease is provable
	if r := a.call(api.OpAdd, "after-del"); r.Error != nil {
		t.Fatalf("ADD into a freed address with the datastore away: %+v", r.Error)
	}
	ds.SetAvailable(true)
	clk.Advance(4 * time.Second) // past the lease: fenced until renewed
	if r := a.call(api.OpAdd, "fenced"); r.Error == nil || r.Error.Code != api.CodeUnavailable {
		t.Fatalf("ADD past the lease without a renewal: %+v, want unavailable", r.Error)
	}
	if err := a.m.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := a.m.Counts(); c.Suspensions != 1 {
		t.Errorf("suspensions %d, want 1", c.Suspensions)
	}
}
