package agent

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Stats counts requests by operation and outcome.
type Stats struct {
	mu       sync.Mutex
	requests map[string]uint64 // op/result
	seconds  map[string]float64
	counters map[string]uint64
}

func newStats() *Stats {
	return &Stats{requests: map[string]uint64{}, seconds: map[string]float64{}, counters: map[string]uint64{}}
}

func (s *Stats) observe(op string, d time.Duration, e *api.Error) {
	result := "ok"
	if e != nil {
		result = e.Code
	}
	s.mu.Lock()
	s.requests[op+"\x00"+result]++
	s.seconds[op] += d.Seconds()
	s.mu.Unlock()
}

func (s *Stats) add(name string, n int) {
	s.mu.Lock()
	s.counters[name] += uint64(n)
	s.mu.Unlock()
}

// MetricsHandler serves Prometheus text metrics and /healthz.
func MetricsHandler(l *ledger.Ledger, s *Stats) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintln(w, "# HELP ipledger_pool_in_use Addresses held by live leases.")
		fmt.Fprintln(w, "# TYPE ipledger_pool_in_use gauge")
		pools := l.Pools()
		for _, p := range pools {
			fmt.Fprintf(w, "ipledger_pool_in_use{network=%q} %d\n", p.Network, p.InUse)
		}
		fmt.Fprintln(w, "# HELP ipledger_pool_usable Usable addresses per pool.")
		fmt.Fprintln(w, "# TYPE ipledger_pool_usable gauge")
		for _, p := range pools {
			var n uint64
			for _, u := range p.Usable {
				n += u
			}
			fmt.Fprintf(w, "ipledger_pool_usable{network=%q} %d\n", p.Network, n)
		}
		fmt.Fprintln(w, "# HELP ipledger_allocations_total Addresses allocated.")
		fmt.Fprintln(w, "# TYPE ipledger_allocations_total counter")
		for _, p := range pools {
			fmt.Fprintf(w, "ipledger_allocations_total{network=%q} %d\n", p.Network, p.Allocs)
		}
		fmt.Fprintln(w, "# HELP ipledger_releases_total Addresses released.")
		fmt.Fprintln(w, "# TYPE ipledger_releases_total counter")
		for _, p := range pools {
			fmt.Fprintf(w, "ipledger_releases_total{network=%q} %d\n", p.Network, p.Releases)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		fmt.Fprintln(w, "# HELP ipledger_requests_total Agent requests by operation and result.")
		fmt.Fprintln(w, "# TYPE ipledger_requests_total counter")
		keys := make([]string, 0, len(s.requests))
		for k := range s.requests {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			var op, res string
			for i := 0; i < len(k); i++ {
				if k[i] == 0 {
					op, res = k[:i], k[i+1:]
				}
			}
			fmt.Fprintf(w, "ipledger_requests_total{op=%q,result=%q} %d\n", op, res, s.requests[k])
		}
		fmt.Fprintln(w, "# HELP ipledger_spool_applied_total Spooled DELs applied.")
		fmt.Fprintln(w, "# TYPE ipledger_spool_applied_total counter")
		fmt.Fprintf(w, "ipledger_spool_applied_total %d\n", s.counters["spool_applied"])
	})
	return mux
}

// Counter returns the value of the named counter (one of the Counter* names).
func (s *Stats) Counter(name string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counters[name]
}
