package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// readersLeases is the ledger size of BenchmarkAddWhileReading.
const readersLeases = 64000

// bigAgent is an in-process agent serving a real bbolt ledger of readersLeases live
// leases on a unix socket.
type bigAgent struct {
	socket string
	ranges []pool.RangeSet
}

var (
	bigOnce sync.Once
	big     *bigAgent
	bigErr  error
)

func startBigAgent(b *testing.B) *bigAgent {
	b.Helper()
	bigOnce.Do(func() {
		dir, err := os.MkdirTemp("/tmp", "ipl-bench-")
		if err != nil {
			bigErr = err
			return
		}
		st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
		if err != nil {
			bigErr = err
			return
		}
		l, err := ledger.Open(st, ledger.Options{ReuseDelay: 0})
		if err != nil {
			bigErr = err
			return
		}
		sets, _ := pool.ParseRangeSets([]byte(`[[{"subnet":"10.200.0.0/15"}]]`))
		began := time.Now()
		// fill concurrently: the ledger commits concurrent changes in groups
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for range 64 {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= readersLeases {
						return
					}
					k := ledger.Key{Network: "big", ContainerID: fmt.Sprintf("sandbox-%06d", i), IfName: "eth0"}
					if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: sets, Pod: ledger.Pod{Namespace: "bench", Name: fmt.Sprint("pod-", i), UID: fmt.Sprint("uid-", i)}}); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			bigErr = err
			return
		}
		sock := filepath.Join(dir, "s.sock")
		srv, err := agent.New(agent.Config{Ledger: l, Socket: sock})
		if err != nil {
			bigErr = err
			return
		}
		ln, err := agent.Listen(sock)
		if err != nil {
			bigErr = err
			return
		}
		go srv.Serve(context.Background(), ln) // lives as long as the benchmark process
		big = &bigAgent{socket: sock, ranges: sets}
		fmt.Fprintf(os.Stderr, "bench: %d leases made in %v\n", readersLeases, time.Since(began).Round(time.Millisecond))
		for _, op := range []string{api.OpAudit, api.OpLeases} {
			t0 := time.Now()
			resp, err := big.call(api.Request{Op: op})
			n := 0
			if resp != nil {
				n = len(resp.Leases)
			}
			fmt.Fprintf(os.Stderr, "bench: one %s alone: %v (err %v, %d leases)\n", op, time.Since(t0).Round(time.Millisecond), err, n)
		}
	})
	if bigErr != nil {
		b.Fatal(bigErr)
	}
	return big
}

func (a *bigAgent) call(req api.Request) (*api.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return api.Call(ctx, a.socket, req)
}

// BenchmarkAddWhileReading: the latency of one ADD (and its DEL) through the socket on
// a ledger of 64k live leases, idle and while ipledgerctl's reads (audit and leases,
// each over all 64k leases) run back to back in a loop. Reading commands must not
// block ADD or DEL: compare the p50/p99/max of the two sub-benchmarks.
//
//	go test -run '^$' -bench AddWhileReading -benchtime 200x ./internal/agent
func BenchmarkAddWhileReading(b *testing.B) {
	a := startBigAgent(b)
	for _, mode := range []string{"idle", "audit", "leases", "reading"} {
		b.Run(mode, func(b *testing.B) {
			stop := make(chan struct{})
			var wg sync.WaitGroup
			var reads atomic.Int64
			readers := map[string][]string{"audit": {api.OpAudit}, "leases": {api.OpLeases}, "reading": {api.OpAudit, api.OpLeases}}[mode]
			if len(readers) > 0 {
				for _, op := range readers {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							if _, err := a.call(api.Request{Op: op}); err != nil {
								b.Error(err)
								return
							}
							reads.Add(1)
						}
					})
				}
				time.Sleep(200 * time.Millisecond) // readers under way
			}
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				req := api.Request{Op: api.OpAdd, Network: "big", ContainerID: fmt.Sprintf("%s-%d", mode, i), IfName: "eth0", Ranges: a.ranges}
				t0 := time.Now()
				if _, err := a.call(req); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t0))
				req.Op = api.OpDel
				if _, err := a.call(req); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			close(stop)
			wg.Wait()
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
			b.ReportMetric(q(0.5), "add-p50-ms")
			b.ReportMetric(q(0.99), "add-p99-ms")
			b.ReportMetric(q(1), "add-max-ms")
			b.ReportMetric(float64(reads.Load()), "reads")
		})
	}
}
