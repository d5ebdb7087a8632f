package etcdds_test

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// BenchmarkUpdateCAS measures one compare-and-swap Update (a block claim's write)
// against an embedded etcd with fsync on: ns/op is the mean latency of a serial
// caller; p50-ms and p99-ms its distribution.
func BenchmarkUpdateCAS(b *testing.B) {
	srv := etcdenv.StartEmbedded(b)
	s, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	rev, err := s.Create(ctx, "blocks/bench/10-0-0-0-26", []byte(`{"owner":"node-0","epoch":0}`))
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		rev, err = s.Update(ctx, "blocks/bench/10-0-0-0-26", fmt.Appendf(nil, `{"owner":"node-%d","epoch":%d}`, i%100, i), rev)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	report(b, lat)
}

// BenchmarkUpdateCASParallel: many callers, each on its own key (nodes claiming
// different blocks at once); ns/op is per Update across all callers.
func BenchmarkUpdateCASParallel(b *testing.B) {
	srv := etcdenv.StartEmbedded(b)
	s, err := etcdds.New(etcdds.Config{Endpoints: srv.Endpoints()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	var n atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := fmt.Sprintf("blocks/bench/k%d", n.Add(1))
		rev, err := s.Create(ctx, key, []byte(`{}`))
		if err != nil {
			b.Error(err)
			return
		}
		for pb.Next() {
			if rev, err = s.Update(ctx, key, []byte(`{"epoch":1}`), rev); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e6 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
}
