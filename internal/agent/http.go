package agent

import (
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/spool"
)

// HTTPHandler serves, for the metrics listener (loopback by default):
//
//	/metrics  Prometheus metrics (with the Go and process collectors)
//	/healthz  200 while the process is up
//	/readyz   200 when the ledger answers, the socket answers (spool applied) and the
//	          runtime, when configured, answers; 503 with the reason otherwise
//	/         the pool page
//
// Call it once per Server.
func (s *Server) HTTPHandler() http.Handler {
	s.stats.reg.MustRegister(&ledgerCollector{s: s})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.stats.reg, promhttp.HandlerOpts{Registry: s.stats.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.ready(r.Context()); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/{$}", s.poolPage)
	return mux
}

var (
	descLive  = prometheus.NewDesc("ipledger_leases_live", "Live leases (attachments holding addresses), per network.", []string{"network"}, nil)
	descAddr  = prometheus.NewDesc("ipledger_addresses", "Addresses of a network's pool by state: usable (size, gateways excluded), in_use, cooling (released less than the reuse delay ago), free (allocatable now).", []string{"network", "state"}, nil)
	descAlloc = prometheus.NewDesc("ipledger_address_allocations_total", "Addresses ever allocated from the pool (durable).", []string{"network"}, nil)
	descRel   = prometheus.NewDesc("ipledger_address_releases_total", "Addresses ever released back to the pool (durable).", []string{"network"}, nil)
	descBooks = prometheus.NewDesc("ipledger_books_balance", "Allocations minus releases minus addresses in use, per network: 0 when the books balance; alert on anything else.", []string{"network"}, nil)
	descSus   = prometheus.NewDesc("ipledger_leases_suspect", "Leases the reconciler suspects (stranded and leaked included), from its last round.", nil, nil)
	descStr   = prometheus.NewDesc("ipledger_leases_stranded", "Leases whose sandbox is NOTREADY or gone while its namespace still holds the address (kept).", nil, nil)
	descLeak  = prometheus.NewDesc("ipledger_leases_leaked", "Leases whose holder can no longer use the address, awaiting release after the grace.", nil, nil)
	descSpool = prometheus.NewDesc("ipledger_spool_backlog", "Spooled DELs waiting to be applied.", nil, nil)
	descRun   = prometheus.NewDesc("ipledger_runtime_up", "1 when the reconciler's last round reached the runtime, 0 when not; absent without a runtime.", nil, nil)
)

// ledgerCollector reads the ledger's gauges at scrape time, from memory only (no
// store transaction, so a scrape never waits for or delays a commit).
type ledgerCollector struct{ s *Server }

var _ prometheus.Collector = (*ledgerCollector)(nil)

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLive, descAddr, descAlloc, descRel, descBooks, descSus, descStr, descLeak, descSpool, descRun} {
		ch <- d
	}
}

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	l := s.cfg.Ledger
	live := map[string]int{}
	for _, ls := range l.Leases("") {
		live[ls.Key.Network]++
	}
	uses := map[string]api.PoolUse{}
	for _, u := range s.poolUse(time.Now()) {
		uses[u.Network] = u
	}
	for _, p := range l.Pools() {
		n := p.Network
		u := uses[n]
		ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(live[n]), n)
		ch <- prometheus.MustNewConstMetric(descAddr, prometheus.GaugeValue, float64(u.Usable), n, "usable")
		ch <- prometheus.MustNewConstMetric(descAddr, prometheus.GaugeValue, float64(p.InUse), n, "in_use")
		ch <- prometheus.MustNewConstMetric(descAddr, prometheus.GaugeValue, float64(u.Cooling), n, "cooling")
		ch <- prometheus.MustNewConstMetric(descAddr, prometheus.GaugeValue, float64(int64(u.Usable)-int64(p.InUse)-int64(u.Cooling)), n, "free")
		ch <- prometheus.MustNewConstMetric(descAlloc, prometheus.CounterValue, float64(p.Allocs), n)
		ch <- prometheus.MustNewConstMetric(descRel, prometheus.CounterValue, float64(p.Releases), n)
		ch <- prometheus.MustNewConstMetric(descBooks, prometheus.GaugeValue, float64(int64(p.Allocs)-int64(p.Releases)-int64(p.InUse)), n)
	}
	if s.cfg.SpoolDir != "" {
		ch <- prometheus.MustNewConstMetric(descSpool, prometheus.GaugeValue, float64(spool.Len(s.cfg.SpoolDir)))
	}
	var a api.Audit
	if s.cfg.Verdicts != nil {
		s.summarize(&a)
		up := 0.0
		if a.Runtime == "ok" {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descRun, prometheus.GaugeValue, up)
	}
	ch <- prometheus.MustNewConstMetric(descSus, prometheus.GaugeValue, float64(a.Suspect))
	ch <- prometheus.MustNewConstMetric(descStr, prometheus.GaugeValue, float64(a.Stranded))
	ch <- prometheus.MustNewConstMetric(descLeak, prometheus.GaugeValue, float64(a.Leaked))
}
