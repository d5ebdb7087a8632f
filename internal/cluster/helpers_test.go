package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/memstore"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// netDS is one agent's connection to the shared datastore: it counts the writes the
// agent sends and can be cut (every call fails with ErrUnavailable, as for an agent
// partitioned from the datastore). A test tool beside the real backends.
type netDS struct {
	datastore.Store
	cut    atomic.Bool
	lag    sync.Mutex   // held: watch events wait (see Watch)
	writes atomic.Int64 // Create, Update, Delete, Acquire, Renew, Release sent
	lists  atomic.Int64 // List calls sent (not the leases' List)
	gets   atomic.Int64 // Get calls sent
	// slowGets: each Get waits this long first (a loaded datastore), so that
	// callers that could overlap do
	slowGets atomic.Int64
	// failLists: List (not the leases' List) fails with ErrUnavailable
	failLists atomic.Bool
	// reclaims counts successful Updates that set a block's owner to "" (give-backs
	// and reclaims).
	frees atomic.Int64
}

var _ datastore.Store = (*netDS)(nil)

func (d *netDS) down(what string) error {
	if d.cut.Load() {
		return fmt.Errorf("test: %s: %w: partitioned", what, datastore.ErrUnavailable)
	}
	return nil
}

func (d *netDS) Get(ctx context.Context, key string) (datastore.KV, error) {
	if err := d.down("get"); err != nil {
		return datastore.KV{}, err
	}
	d.gets.Add(1)
	time.Sleep(time.Duration(d.slowGets.Load()))
	return d.Store.Get(ctx, key)
}
func (d *netDS) Create(ctx context.Context, key string, value []byte) (int64, error) {
	if err := d.down("create"); err != nil {
		return 0, err
	}
	d.writes.Add(1)
	return d.Store.Create(ctx, key, value)
}
func (d *netDS) Update(ctx context.Context, key string, value []byte, rev int64) (int64, error) {
	if err := d.down("update"); err != nil {
		return 0, err
	}
	d.writes.Add(1)
	r, err := d.Store.Update(ctx, key, value, rev)
	if err == nil && containsFreeOwner(value) {
		d.frees.Add(1)
	}
	return r, err
}
func (d *netDS) Delete(ctx context.Context, key string, rev int64) error {
	if err := d.down("delete"); err != nil {
		return err
	}
	d.writes.Add(1)
	return d.Store.Delete(ctx, key, rev)
}
func (d *netDS) List(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	if err := d.down("list"); err != nil {
		return nil, 0, err
	}
	if d.failLists.Load() {
		return nil, 0, fmt.Errorf("test: list %s: %w", prefix, datastore.ErrUnavailable)
	}
	d.lists.Add(1)
	return d.Store.List(ctx, prefix)
}
func (d *netDS) Leases() datastore.Leases { return netLeases{d} }

// Watch passes the store's watch on, event by event; while lag is held no event is
// passed on (a watch that lags behind the store, so the manager's cache is stale).
func (d *netDS) Watch(ctx context.Context, prefix string, from int64) (datastore.Watch, error) {
	w, err := d.Store.Watch(ctx, prefix, from)
	if err != nil {
		return nil, err
	}
	lw := &lagWatch{w: w, ch: make(chan datastore.Event)}
	go func() {
		defer close(lw.ch)
		for ev := range w.Events() {
			d.lag.Lock()
			//lint:ignore SA2001 an empty critical section: it waits while the test holds lag
			d.lag.Unlock()
			select {
			case lw.ch <- ev:
			case <-ctx.Done():
				for range w.Events() {
				}
				return
			}
		}
	}()
	return lw, nil
}

type lagWatch struct {
	w  datastore.Watch
	ch chan datastore.Event
}

func (l *lagWatch) Events() <-chan datastore.Event { return l.ch }
func (l *lagWatch) Err() error                     { return l.w.Err() }

type netLeases struct{ d *netDS }

func (l netLeases) Acquire(ctx context.Context, node, holder string, ttl time.Duration, addrs ...netip.Addr) (datastore.NodeLease, error) {
	if err := l.d.down("acquire"); err != nil {
		return datastore.NodeLease{}, err
	}
	l.d.writes.Add(1)
	return l.d.Store.Leases().Acquire(ctx, node, holder, ttl, addrs...)
}
func (l netLeases) Renew(ctx context.Context, nl datastore.NodeLease) (datastore.NodeLease, error) {
	if err := l.d.down("renew"); err != nil {
		return datastore.NodeLease{}, err
	}
	l.d.writes.Add(1)
	return l.d.Store.Leases().Renew(ctx, nl)
}
func (l netLeases) Release(ctx context.Context, nl datastore.NodeLease) error {
	if err := l.d.down("release"); err != nil {
		return err
	}
	l.d.writes.Add(1)
	return l.d.Store.Leases().Release(ctx, nl)
}
func (l netLeases) List(ctx context.Context) ([]datastore.NodeLease, error) {
	if err := l.d.down("list leases"); err != nil {
		return nil, err
	}
	return l.d.Store.Leases().List(ctx)
}

func containsFreeOwner(v []byte) bool { return bytes.Contains(v, []byte(`"owner":""`)) }

// cl is a test cluster: one datastore, agents on one test clock, and the cluster
// audit when the test ends.
type cl struct {
	t      *testing.T
	clk    *clocktest.Clock
	ds     datastore.Store // the shared store (memds, or etcd)
	open   func() datastore.Store
	mu     sync.Mutex
	agents []*agent
	// allowOutside: the audit at the end may find addresses held outside the node's
	// blocks (a scenario that leaves a lost block's lease in place on purpose).
	allowOutside bool
	// reuse is the reuse delay of the agents' ledgers started from here on.
	reuse time.Duration
}

type agent struct {
	name string
	m    *cluster.Manager
	l    *ledger.Ledger
	ds   *netDS
	st   ledger.Store
}

const ttl = 9 * time.Second

func newMemCluster(t *testing.T) *cl {
	clk := clocktest.New()
	ds := memds.New(clk)
	return newCluster(t, clk, ds, func() datastore.Store { return ds.Open() })
}

func newCluster(t *testing.T, clk *clocktest.Clock, ds datastore.Store, open func() datastore.Store) *cl {
	c := &cl{t: t, clk: clk, ds: ds, open: open}
	t.Cleanup(c.audit)
	return c
}

// opts are the test agents' options: manual steps on the test clock.
func (c *cl) opts(name string) cluster.Options {
	return cluster.Options{Node: name, Clock: c.clk, LeaseTTL: ttl, Margin: time.Second, Grace: time.Minute, Manual: true, Logger: ledgertest.TestLogger(c.t)}
}

// agent starts an agent for node name (its own ledger) and sets up "net" with ranges.
func (c *cl) agent(name string, ranges []pool.RangeSet, bits []int) *agent {
	c.t.Helper()
	return c.agentOn(name, memstore.New(), c.opts(name), ranges, bits)
}

func (c *cl) agentOn(name string, st ledger.Store, o cluster.Options, ranges []pool.RangeSet, bits []int) *agent {
	c.t.Helper()
	l, err := ledger.Open(st, ledger.Options{Clock: c.clk, ReuseDelay: c.reuse, Logger: ledgertest.TestLogger(c.t)}) // audited by c.audit
	if err != nil {
		c.t.Fatal(err)
	}
	d := &netDS{Store: c.open()}
	m, err := cluster.New(d, l, o)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	if ranges != nil {
		if err := m.EnsureNetwork(context.Background(), "net", ranges, bits); err != nil {
			c.t.Fatalf("%s: ensure network: %v", name, err)
		}
	}
	a := &agent{name: name, m: m, l: l, ds: d, st: st}
	c.mu.Lock()
	c.agents = append(c.agents, a)
	c.mu.Unlock()
	return a
}

// audit runs the cluster audit over every agent's ledger and the datastore.
func (c *cl) audit() {
	c.t.Helper()
	blocks, err := cluster.ReadBlocks(context.Background(), c.ds)
	if err != nil {
		c.t.Fatalf("cluster audit: %v", err)
	}
	var books []cluster.NodeBooks
	for _, a := range c.agents {
		ledgertest.Audit(c.t, a.l)
		books = append(books, cluster.NodeBooks{Node: a.name, Leases: a.l.Leases(""), Blocks: a.l.Blocks("")})
	}
	rep := cluster.Audit(blocks, books)
	if len(rep.DoubleHeld) > 0 || len(rep.Outside) > 0 && !c.allowOutside {
		c.t.Errorf("cluster audit: double held %+v; outside the node's blocks %+v", rep.DoubleHeld, rep.Outside)
	}
	c.t.Logf("cluster audit: %d nodes, %d leases, %d addresses, %d blocks", rep.Nodes, rep.Leases, rep.Addresses, rep.Blocks)
}

func (a *agent) alloc(t *testing.T, cid string) (ledger.Lease, error) {
	t.Helper()
	ls, _, err := a.m.Allocate(context.Background(), ledger.AllocateRequest{Key: ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}})
	return ls, err
}

func (a *agent) mustAlloc(t *testing.T, cid string) ledger.Lease {
	t.Helper()
	ls, err := a.alloc(t, cid)
	if err != nil {
		t.Fatalf("%s: allocate %s: %v", a.name, cid, err)
	}
	return ls
}

func (a *agent) release(t *testing.T, cid string) {
	t.Helper()
	if _, ok, err := a.l.Release(ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"}, ledger.ReasonDEL, ""); err != nil || !ok {
		t.Fatalf("%s: release %s: %v %v", a.name, cid, ok, err)
	}
}

func ranges(t *testing.T, js string) []pool.RangeSet { return ledgertest.Ranges(t, js) }

// blockRec reads one block record.
func blockRec(t *testing.T, ds datastore.Store, cidr string) cluster.BlockRecord {
	t.Helper()
	bs, err := cluster.ReadBlocks(context.Background(), ds)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		if b.CIDR.String() == cidr {
			return b
		}
	}
	t.Fatalf("no block %s in the datastore (%+v)", cidr, bs)
	return cluster.BlockRecord{}
}

func errUnavailable() error { return datastore.ErrUnavailable }

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sideBySideWhenShort runs one of the package's longest tests beside the other
// two under -short (each on its own datastores and clock): after the package's
// other tests, which run one at a time, they take as long as the longest of
// them, not their sum. go test without -short runs them one after the other.
func sideBySideWhenShort(t *testing.T) {
	if testing.Short() {
		t.Parallel()
	}
}

// forBackends runs test against memds (fast, on the test clock) and against a real
// etcd server embedded in the test process (go.etcd.io/etcd/server/v3/embed), with
// etcdds. Managers judge time on the test clock either way: fencing deadlines and the
// observer rule are the managers' own; the server's lease TTL is never waited for.
func forBackends(t *testing.T, test func(t *testing.T, newC func(*testing.T) *cl)) {
	t.Run("memds", func(t *testing.T) { test(t, newMemCluster) })
	t.Run("etcd", func(t *testing.T) {
		srv := etcdenv.StartEmbedded(t)
		n := 0
		test(t, func(t *testing.T) *cl {
			n++
			root := fmt.Sprintf("/ipledger-%s-%d/", strings.ToLower(strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())), n)
			open := func() datastore.Store {
				s, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints(), Root: root})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			}
			return newCluster(t, clocktest.New(), open(), open)
		})
	})
}
