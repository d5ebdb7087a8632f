package cluster_test

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/memstore"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

const benchRanges = `[[{"subnet":"10.20.0.0/16"}]]`

// benchLedger opens a ledger on the named store with 1,000 live leases in "net": a
// node-mode pool, or a cluster-scoped one whose node holds 64 /26 blocks.
func benchLedger(b *testing.B, storeKind string, clusterMode bool) *ledger.Ledger {
	var st ledger.Store = memstore.New()
	if storeKind != "memstore" {
		var o []boltstore.Option
		if storeKind == "bolt-nosync" {
			o = append(o, boltstore.WithoutSync())
		}
		s, err := boltstore.Open(filepath.Join(b.TempDir(), "ledger.db"), o...)
		if err != nil {
			b.Fatal(err)
		}
		st = s
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	r := ledgertest.Ranges(b, benchRanges)
	if clusterMode {
		if err := l.DeclareCluster("net", r, []int{26}); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < 64; i++ {
			if err := l.AddBlock("net", netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 20, byte(i / 4), byte(i % 4 * 64)}), 26), 1); err != nil {
				b.Fatal(err)
			}
		}
		r = nil
	}
	for i := 0; i < 1000; i++ {
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key(fmt.Sprint("fill", i)), Ranges: r}); err != nil {
			b.Fatal(err)
		}
	}
	return l
}

// reportLatency adds p50 and p99 of the per-operation durations.
func reportLatency(b *testing.B, d []time.Duration) {
	if len(d) == 0 {
		return
	}
	slices.Sort(d)
	b.ReportMetric(float64(d[len(d)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(d[len(d)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkLedgerAllocateRelease: one allocate and one release per op in a pool with
// 1,000 live leases, node mode against a cluster-scoped pool allocating from its
// owned blocks (the goal: ADD from an owned block within 1.2x node mode), on
// memstore, bbolt without fsync (the ledger's CPU and bbolt's writes) and bbolt
// fsync'd (as the agent runs). p50/p99 are of the allocate.
func BenchmarkLedgerAllocateRelease(b *testing.B) {
	for _, storeKind := range []string{"memstore", "bolt-nosync", "bolt"} {
		for _, mode := range []string{"node", "cluster"} {
			b.Run(storeKind+"/"+mode, func(b *testing.B) {
				l := benchLedger(b, storeKind, mode == "cluster")
				var r []pool.RangeSet
				if mode == "node" {
					r = ledgertest.Ranges(b, benchRanges)
				}
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					k := ledgertest.Key(fmt.Sprint("op", i))
					t0 := time.Now()
					if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Pod: ledger.Pod{UID: fmt.Sprint("u", i)}, Ranges: r}); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
					if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				reportLatency(b, lat)
			})
		}
	}
}

// BenchmarkManagerAllocate: allocate + release through the block manager (lease
// guard, claims as needed) on memds, against memstore.
func BenchmarkManagerAllocate(b *testing.B) {
	clk := clocktest.New()
	ds := memds.New(clk)
	l, err := ledger.Open(memstore.New(), ledger.Options{Clock: clk})
	if err != nil {
		b.Fatal(err)
	}
	m, err := cluster.New(&netDS{Store: ds}, l, cluster.Options{Node: "n", Clock: clk, LeaseTTL: ttl, Manual: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if err := m.EnsureNetwork(ctx, "net", ledgertest.Ranges(b, benchRanges), []int{26}); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := ledgertest.Key(fmt.Sprint("op", i))
		t0 := time.Now()
		if _, _, err := m.Allocate(ctx, ledger.AllocateRequest{Key: k}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		if i%2 == 0 { // half the pods stay: the node keeps claiming blocks
			if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err != nil {
				b.Fatal(err)
			}
		}
		if i%30000 == 29999 { // stay inside the /16
			b.StopTimer()
			for _, ls := range l.Leases("net") {
				_, _, _ = l.Release(ls.Key, ledger.ReasonDEL, "")
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// BenchmarkDatastoreWrites: datastore writes per 1,000 pods started on one node of an
// empty cluster (pool record, node lease, block claims; the goal is at most
// 20), and per 1,000 pods of churn once the node holds its blocks (pods replaced:
// no write at all). Lease renewals are per time, not per pod: TTL/3 each.
func BenchmarkDatastoreWrites(b *testing.B) {
	var start, churn int64
	for i := 0; i < b.N; i++ {
		clk := clocktest.New()
		d := &netDS{Store: memds.New(clk)}
		l, err := ledger.Open(memstore.New(), ledger.Options{Clock: clk})
		if err != nil {
			b.Fatal(err)
		}
		m, err := cluster.New(d, l, cluster.Options{Node: "n", Clock: clk, LeaseTTL: ttl, Manual: true})
		if err != nil {
			b.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			b.Fatal(err)
		}
		if err := m.EnsureNetwork(ctx, "net", ledgertest.Ranges(b, benchRanges), []int{26}); err != nil {
			b.Fatal(err)
		}
		for p := 0; p < 1000; p++ {
			if _, _, err := m.Allocate(ctx, ledger.AllocateRequest{Key: ledgertest.Key(fmt.Sprint("p", p))}); err != nil {
				b.Fatal(err)
			}
		}
		start += d.writes.Load()
		before := d.writes.Load()
		for p := 0; p < 1000; p++ {
			if _, _, err := l.Release(ledgertest.Key(fmt.Sprint("p", p)), ledger.ReasonDEL, ""); err != nil {
				b.Fatal(err)
			}
			if _, _, err := m.Allocate(ctx, ledger.AllocateRequest{Key: ledgertest.Key(fmt.Sprint("q", p))}); err != nil {
				b.Fatal(err)
			}
		}
		churn += d.writes.Load() - before
	}
	b.ReportMetric(float64(start)/float64(b.N), "writes/1000-pods-start")
	b.ReportMetric(float64(churn)/float64(b.N), "writes/1000-pods-churn")
}

// BenchmarkClaimEtcd: one block claim per op against a real etcd (embedded): list
// the network's blocks, create the next one by compare-and-swap, add it to the
// ledger. p99 is the ADD that has to claim a block (the goal: 250 ms).
func BenchmarkClaimEtcd(b *testing.B) {
	srv := etcdenv.StartEmbedded(b)
	ds, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints(), Root: fmt.Sprintf("/bench-%d/", time.Now().UnixNano())})
	if err != nil {
		b.Fatal(err)
	}
	defer ds.Close()
	l, err := ledger.Open(memstore.New(), ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	m, err := cluster.New(ds, l, cluster.Options{Node: "n", LeaseTTL: 30 * time.Second, Manual: true})
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer m.Stop(ctx)
	if err := m.EnsureNetwork(ctx, "net", ledgertest.Ranges(b, `[[{"subnet":"10.0.0.0/12"}]]`), []int{26}); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%50 == 49 { // the manual manager renews when told
			b.StopTimer()
			if err := m.Renew(ctx); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		t0 := time.Now()
		if _, err := m.Claim(ctx, "net", 0); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportLatency(b, lat)
}

// BenchmarkHundredNodes: 100 agents (block managers with their own ledgers, on
// memstore) sharing one real etcd (embedded), each starting 100 pods at once from an
// empty /16: every agent claims its blocks by compare-and-swap against the others.
// Reports allocations per second over the whole cluster and the datastore writes.
func BenchmarkHundredNodes(b *testing.B) {
	srv := etcdenv.StartEmbedded(b)
	for i := 0; i < b.N; i++ {
		clk := clocktest.New()
		root := fmt.Sprintf("/bench100-%d-%d/", time.Now().UnixNano(), i)
		var ms []*cluster.Manager
		var dss []*netDS
		for n := 0; n < 100; n++ {
			ds, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints(), Root: root})
			if err != nil {
				b.Fatal(err)
			}
			defer ds.Close()
			d := &netDS{Store: ds}
			l, err := ledger.Open(memstore.New(), ledger.Options{Clock: clk})
			if err != nil {
				b.Fatal(err)
			}
			m, err := cluster.New(d, l, cluster.Options{Node: fmt.Sprint("node-", n), Clock: clk, LeaseTTL: 60 * time.Second, Manual: true})
			if err != nil {
				b.Fatal(err)
			}
			if err := m.Start(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.EnsureNetwork(ctx, "net", ledgertest.Ranges(b, benchRanges), []int{26}); err != nil {
				b.Fatal(err)
			}
			ms = append(ms, m)
			dss = append(dss, d)
		}
		b.StartTimer()
		t0 := time.Now()
		errs := make(chan error, len(ms))
		for n, m := range ms {
			go func() {
				for p := 0; p < 100; p++ {
					if _, _, err := m.Allocate(ctx, ledger.AllocateRequest{Key: ledgertest.Key(fmt.Sprintf("n%d-p%d", n, p))}); err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range ms {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
		el := time.Since(t0)
		b.StopTimer()
		var writes int64
		for _, d := range dss {
			writes += d.writes.Load()
		}
		b.ReportMetric(10000/el.Seconds(), "allocs/s")
		b.ReportMetric(float64(writes)/10, "writes/1000-pods")
		for _, m := range ms {
			_ = m.Stop(ctx)
		}
	}
}
