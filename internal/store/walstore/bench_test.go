package walstore

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/storetest"
)

// BenchmarkAllocateRelease: one durable allocate and one durable release per op
// (two commits, two fdatasyncs of the log), with 1k and 64k live leases in one /16
// pool; checkpoints run in the background as the log fills. Compare with boltstore's
// benchmark of the same name (four fdatasyncs per op).
func BenchmarkAllocateRelease(b *testing.B) {
	for _, n := range []int{1000, 64000} {
		b.Run(fmt.Sprintf("live=%dk", n/1000), func(b *testing.B) {
			// fill without fsync through boltstore, then reopen durable on the log
			l := storetest.Fill(b, filepath.Join(b.TempDir(), "ledger.db"), n, openStore)
			storetest.AllocateRelease(b, l)
		})
	}
}

// BenchmarkOpen64k: ledger.Open on a state file holding 64k live leases after a
// clean close (an agent's start), on boltstore and on this store.
func BenchmarkOpen64k(b *testing.B) {
	path := filepath.Join(b.TempDir(), "ledger.db")
	storetest.FillFile(b, path, 64000)
	for _, tc := range []struct {
		name string
		open func() (ledger.Store, error)
	}{
		{"boltstore", func() (ledger.Store, error) { return boltstore.Open(path) }},
		{"walstore", func() (ledger.Store, error) { return Open(path) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// CPU time as well as wall time: on a shared machine the wall time
			// mostly measures the neighbours
			cpu0 := storetest.CPUTime(b)
			defer func() {
				b.ReportMetric(float64((storetest.CPUTime(b)-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			}()
			for i := 0; i < b.N; i++ {
				st, err := tc.open()
				if err != nil {
					b.Fatal(err)
				}
				l, err := ledger.Open(st, ledger.Options{})
				if err != nil {
					b.Fatal(err)
				}
				l.Close()
			}
		})
	}
}
