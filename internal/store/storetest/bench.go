package storetest

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// BenchRanges is the one /16 pool of the benchmarks.
const BenchRanges = `[[{"subnet":"10.20.0.0/16"}]]`

// FillFile writes n live leases in BenchRanges to a new state file at path through
// boltstore without fsync (the state file format both stores share), and closes it.
func FillFile(b testing.TB, path string, n int) {
	b.Helper()
	r := ledgertest.Ranges(b, BenchRanges)
	st, err := boltstore.Open(path, boltstore.WithoutSync())
	if err != nil {
		b.Fatal(err)
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key(fmt.Sprintf("fill%06d", i)), Pod: ledger.Pod{Namespace: "ns", Name: fmt.Sprint("pod", i), UID: fmt.Sprint("uid", i)}, Ranges: r}); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
}

// Fill is FillFile, then the file reopened durable with open; the ledger is closed in
// b.Cleanup.
func Fill(b testing.TB, path string, n int, open Opener) *ledger.Ledger {
	b.Helper()
	FillFile(b, path, n)
	st, err := open(path)
	if err != nil {
		b.Fatal(err)
	}
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}

// AllocateRelease times one durable allocate and one durable release per op on l.
func AllocateRelease(b *testing.B, l *ledger.Ledger) {
	r := ledgertest.Ranges(b, BenchRanges)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := ledgertest.Key(fmt.Sprint("bench", i))
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: r}); err != nil {
			b.Fatal(err)
		}
		if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err != nil {
			b.Fatal(err)
		}
	}
}

// CPUTime is the user and system CPU time of this process so far (on a shared
// machine steadier than the wall time).
func CPUTime(b testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
