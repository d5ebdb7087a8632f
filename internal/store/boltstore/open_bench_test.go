package boltstore_test

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/storetest"
)

var open64k struct {
	once sync.Once
	dir  string
	err  error
}

// openFile64k is a state file holding 64k live leases and 1000 free addresses in one
// /16 pool, as the agent writes them (pod identity and a netns path on every lease);
// built once per test binary and shared by the benchmarks.
func openFile64k(b *testing.B) string {
	b.Helper()
	open64k.once.Do(func() {
		open64k.dir, open64k.err = os.MkdirTemp("", "ipledger-open64k-")
		if open64k.err != nil {
			return
		}
		path := filepath.Join(open64k.dir, "ledger.db")
		r := ledgertest.Ranges(b, `[[{"subnet":"10.20.0.0/16"}]]`)
		st, err := boltstore.Open(path, boltstore.WithoutSync())
		if err != nil {
			open64k.err = err
			return
		}
		defer st.Close()
		l, err := ledger.Open(st, ledger.Options{})
		if err != nil {
			open64k.err = err
			return
		}
		defer l.Close()
		const live, freed = 64000, 1000
		for i := 0; i < live+freed; i++ {
			k := ledgertest.Key(fmt.Sprintf("0123456789abcdef0123456789abcdef0123456789abcdef012345%06d", i))
			pod := ledger.Pod{Namespace: "default", Name: fmt.Sprintf("web-7d4b9c6f5-%06d", i), UID: fmt.Sprintf("5f1c2a34-9b7e-4c1d-a2f3-%012d", i), InfraContainerID: k.ContainerID}
			ns := ledger.NetNS{Path: fmt.Sprintf("/var/run/netns/cni-5f1c2a34-9b7e-4c1d-a2f3-%012d", i), Dev: 4, Ino: uint64(4026530000 + i)}
			if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Pod: pod, NetNS: ns, Ranges: r}); err != nil {
				open64k.err = err
				return
			}
			if i >= live {
				if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err != nil {
					open64k.err = err
					return
				}
			}
		}
	})
	if open64k.err != nil {
		b.Fatal(open64k.err)
	}
	return filepath.Join(open64k.dir, "ledger.db")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if open64k.dir != "" {
		os.RemoveAll(open64k.dir)
	}
	os.Exit(code)
}

// BenchmarkOpen64k times what an agent start spends on its ledger: opening the bbolt
// file and ledger.Open reading 64k leases and 1000 free addresses into memory. The
// goal is an agent that answers within 300 ms of its start at 64k leases.
func BenchmarkOpen64k(b *testing.B) {
	path := openFile64k(b)
	b.ReportAllocs()
	var cpu time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c0 := storetest.CPUTime(b)
		st, err := boltstore.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		l, err := ledger.Open(st, ledger.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += storetest.CPUTime(b) - c0
		if i == 0 {
			if got := len(l.Leases("net")); got != 64000 {
				b.Fatalf("%d leases, want 64000", got)
			}
		}
		l.Close()
		b.StartTimer()
	}
	// On a shared machine the wall time swings with the neighbours' load; the CPU
	// time of the whole process (GC workers included) per open is steadier.
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
}
