package kubeds_test

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// BenchmarkKubernetesAPI measures the store's operations against a real
// kube-apiserver (loopback, etcd without fsync: the apiserver's own cost, not a
// disk's). Each reports its latency percentiles besides ns/op.
//
//	go test -run '^$' -bench BenchmarkKubernetesAPI -benchtime 300x ./internal/datastore/kubeds/
func BenchmarkKubernetesAPI(b *testing.B) {
	e := startEnv(b, kubeenv.APIServerOptions{})
	s := e.store(b)
	ctx := context.Background()

	// One key updated with compare-and-swap, each Update carrying the revision
	// the previous one returned: a block's owner or epoch changing.
	b.Run("UpdateCAS", func(b *testing.B) {
		key := fmt.Sprintf("blocks/bench/cas-%d", b.N)
		rev, err := s.Create(ctx, key, []byte(`{"owner":"node-0","epoch":0}`))
		if err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			rev, err = s.Update(ctx, key, []byte(fmt.Sprintf(`{"owner":"node-%d","epoch":%d}`, i%5, i+1)), rev)
			lat = append(lat, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})

	// A new block claimed: Create of a key that does not exist.
	b.Run("CreateBlock", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			_, err := s.Create(ctx, fmt.Sprintf("blocks/claim-%d/10-%d-%d-0-26", b.N, i/256, i%256), []byte(`{"owner":"node-0","epoch":1}`))
			lat = append(lat, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})

	// A node's lease renewed (a compare-and-swap merge patch).
	b.Run("RenewLease", func(b *testing.B) {
		l, err := s.Leases().Acquire(ctx, fmt.Sprintf("bench-%d", b.N), "bench/1", 10*time.Second)
		if err != nil {
			b.Fatal(err)
		}
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			l, err = s.Leases().Renew(ctx, l)
			lat = append(lat, time.Since(t0))
			if err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportLatency(b, lat)
	})

	// Many nodes each updating their own block at once: throughput of the
	// apiserver for CAS writes (ns/op is per write across all goroutines).
	b.Run("UpdateCASParallel", func(b *testing.B) {
		var seq atomic.Int64
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			key := fmt.Sprintf("blocks/par-%d/%d", b.N, seq.Add(1))
			rev, err := s.Create(ctx, key, []byte(`{"epoch":0}`))
			if err != nil {
				b.Error(err)
				return
			}
			for i := 1; pb.Next(); i++ {
				if rev, err = s.Update(ctx, key, []byte(fmt.Sprintf(`{"epoch":%d}`, i)), rev); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func reportLatency(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		i := int(p * float64(len(lat)-1))
		return float64(lat[i].Microseconds()) / 1000
	}
	b.ReportMetric(pct(0.5), "p50-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
}
