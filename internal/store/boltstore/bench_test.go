package boltstore_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/storetest"
)

// fill opens a ledger at path holding n live leases in one /16 pool. The filling runs
// without fsync; the ledger returned is reopened durable.
func fill(b testing.TB, path string, n int) *ledger.Ledger {
	return storetest.Fill(b, path, n, openStore)
}

// BenchmarkAllocateRelease: one durable allocate and one durable release per op, with
// 1k, 16k and 64k live leases in one /16 pool. The cost must stay flat.
func BenchmarkAllocateRelease(b *testing.B) {
	for _, n := range []int{1000, 16000, 64000} { // a /16 has 65533 usable addresses
		b.Run(fmt.Sprintf("live=%dk", n/1000), func(b *testing.B) {
			storetest.AllocateRelease(b, fill(b, filepath.Join(b.TempDir(), "ledger.db"), n))
		})
	}
}

// BenchmarkHeap64k reports the Go heap a ledger holds with 64k live leases (one fill
// per call, whatever b.N: the figure is per ledger, not per op).
func BenchmarkHeap64k(b *testing.B) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	l := fill(b, filepath.Join(b.TempDir(), "ledger.db"), 64000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), "MiB-heap")
	runtime.KeepAlive(l)
}

// BenchmarkAllocateReleaseParallel: the same durable allocate + release from many
// callers at once (as during a burst of pod starts) with 64k live leases; concurrent
// requests share one fsync'd commit.
func BenchmarkAllocateReleaseParallel(b *testing.B) {
	l := fill(b, filepath.Join(b.TempDir(), "ledger.db"), 64000)
	r := ledgertest.Ranges(b, `[[{"subnet":"10.20.0.0/16"}]]`)
	var seq atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k := ledgertest.Key(fmt.Sprint("par", seq.Add(1)))
			if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: r}); err != nil {
				b.Error(err)
				return
			}
			if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
