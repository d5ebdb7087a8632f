package agent

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/spool"
)

// Label values are bounded: a verb outside this set is counted as "unknown", an error
// code outside the API's as "other".
var (
	verbs = []string{api.OpAdd, api.OpDel, api.OpCheck, api.OpGC, api.OpStatus, api.OpLeases,
		api.OpAudit, api.OpHistory, api.OpRelease, api.OpPing, api.OpDoctor, api.OpBlocks, api.OpCNI}
	results = []string{"ok", api.CodeInvalid, api.CodeExhausted, api.CodeConflict, api.CodeNotFound,
		api.CodeMismatch, api.CodeStore, api.CodeUnavailable, api.CodeInternal}
	reasons = []ledger.Reason{ledger.ReasonDEL, ledger.ReasonGC, ledger.ReasonReconcileGone,
		ledger.ReasonReconcileNotReady, ledger.ReasonSuperseded, ledger.ReasonManual}
)

// Reconcile round outcomes (ipledger_reconcile_rounds_total's outcome label).
const (
	RoundOK       = "ok"       // the runtime answered; releases were allowed
	RoundDoubtful = "doubtful" // the runtime answered in a way that withheld releases
	RoundFailed   = "failed"   // listing failed; nothing was done
)

func bounded(v string, set []string, other string) string {
	for _, s := range set {
		if v == s {
			return v
		}
	}
	return other
}

// Stats holds the agent's Prometheus metrics: the counters the server and the
// reconciler's wiring update, in a registry of their own (with the Go and process
// collectors) that the metrics listener serves.
type Stats struct {
	reg           *prometheus.Registry
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	releases      *prometheus.CounterVec
	rounds        *prometheus.CounterVec
	roundSeconds  prometheus.Histogram
	runtimeErrors *prometheus.CounterVec
	clockSteps    prometheus.Counter
	counters      map[string]*counter
}

// counter is a Prometheus counter whose value the agent can also read (tests and
// doctor), without reaching into the client library's internals.
type counter struct {
	c prometheus.Counter
	n atomic.Uint64
}

func newStats() *Stats {
	s := &Stats{reg: prometheus.NewRegistry()}
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ipledger_requests_total",
		Help: "Requests answered by the agent, by verb and result (ok or the error code); verb cni is an ipledger IPAM ADD or DEL a main plugin handed over whole, whose own add or del is counted too."}, []string{"verb", "result"})
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ipledger_request_duration_seconds",
		Help:    "Time to answer a request, by verb (durable commit included).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}}, []string{"verb"})
	s.releases = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ipledger_releases_total",
		Help: "Leases released since the agent started, by reason."}, []string{"reason"})
	s.rounds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ipledger_reconcile_rounds_total",
		Help: "Reconciliation rounds by outcome: ok, doubtful (releases withheld), failed (runtime listing failed)."}, []string{"outcome"})
	s.roundSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ipledger_reconcile_round_duration_seconds",
		Help: "Duration of reconciliation rounds.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)})
	s.runtimeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ipledger_runtime_errors_total",
		Help: "Failed calls to the container runtime (CRI), by call: list, status, version."}, []string{"call"})
	s.clockSteps = prometheus.NewCounter(prometheus.CounterOpts{Name: "ipledger_clock_steps_total",
		Help: "Wall-clock steps (more than a second off the monotonic clock) seen since the agent started."})
	s.counters = map[string]*counter{}
	for _, c := range []struct{ name, help string }{
		{CounterSpoolApplied, "Spooled DELs applied (each removed from the spool)."},
		{CounterSpoolUnmatched, "Spooled DELs that matched no lease (already released, or never allocated)."},
		{CounterSpoolRejected, "Spool entries moved aside unapplied (bad owner, mode or content; see the spool's rejected/ directory)."},
		{CounterSpoolRejectedDropped, fmt.Sprintf("Oldest entries removed from the spool's rejected/ directory to keep it within its bound (%d entries).", spool.MaxRejected)},
		{CounterAcceptErrors, "Failed Accepts on the agent's socket (the agent backs off and keeps serving)."},
		{CounterConnsEvicted, "Idle connections closed to admit another (connection limit reached)."},
	} {
		s.counters[c.name] = &counter{c: prometheus.NewCounter(prometheus.CounterOpts{Name: "ipledger_" + c.name + "_total", Help: c.help})}
	}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		s.requests, s.latency, s.releases, s.rounds, s.roundSeconds, s.runtimeErrors, s.clockSteps)
	for _, c := range s.counters {
		s.reg.MustRegister(c.c)
	}
	// every bounded series exists from the start, at 0
	for _, v := range verbs {
		s.latency.WithLabelValues(v)
		s.requests.WithLabelValues(v, "ok")
	}
	for _, r := range reasons {
		s.releases.WithLabelValues(string(r))
	}
	for _, o := range []string{RoundOK, RoundDoubtful, RoundFailed} {
		s.rounds.WithLabelValues(o)
	}
	for _, c := range []string{"list", "status", "version"} {
		s.runtimeErrors.WithLabelValues(c)
	}
	return s
}

// observe counts one answered request; a release it made is counted by its reason.
func (s *Stats) observe(op string, d time.Duration, resp *api.Response) {
	verb := bounded(op, verbs, "unknown")
	result := "ok"
	if resp.Error != nil {
		result = bounded(resp.Error.Code, results, "other")
	}
	s.requests.WithLabelValues(verb, result).Inc()
	s.latency.WithLabelValues(verb).Observe(d.Seconds())
	if resp.Error == nil && resp.Released > 0 {
		switch op {
		case api.OpDel:
			s.Released(ledger.ReasonDEL, resp.Released)
		case api.OpGC:
			s.Released(ledger.ReasonGC, resp.Released)
		case api.OpRelease:
			s.Released(ledger.ReasonManual, resp.Released)
		}
	}
}

// add adds n to the counter called name (one of the Counter* names). Another
// name is a programming error; it is ignored rather than let a metric stop the agent.
func (s *Stats) add(name string, n int) {
	if c, ok := s.counters[name]; ok && n > 0 {
		c.c.Add(float64(n))
		c.n.Add(uint64(n))
	}
}

// Released counts n leases released for reason.
func (s *Stats) Released(reason ledger.Reason, n int) {
	if !reason.Valid() {
		return
	}
	s.releases.WithLabelValues(string(reason)).Add(float64(n))
}

// ObserveRound counts one reconciliation round: its outcome (RoundOK, RoundDoubtful,
// RoundFailed), its duration and the releases it made.
func (s *Stats) ObserveRound(outcome string, d time.Duration, released []ledger.Reason) {
	s.rounds.WithLabelValues(bounded(outcome, []string{RoundOK, RoundDoubtful, RoundFailed}, RoundFailed)).Inc()
	s.roundSeconds.Observe(d.Seconds())
	for _, r := range released {
		s.Released(r, 1)
	}
}

// RuntimeError counts one failed runtime call (list, status or version).
func (s *Stats) RuntimeError(call string) {
	s.runtimeErrors.WithLabelValues(bounded(call, []string{"list", "status", "version"}, "list")).Inc()
}

// Counter returns the value of the named counter (one of the Counter* names).
func (s *Stats) Counter(name string) uint64 {
	if c, ok := s.counters[name]; ok {
		return c.n.Load()
	}
	return 0
}

// registerCluster adds cluster mode's metrics, read from the block manager's counts
// at each scrape.
func (s *Stats) registerCluster(counts func() cluster.Counts) {
	s.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ipledger_blocks_owned",
			Help: "Address blocks this node owns in the datastore now."},
			func() float64 { return float64(counts().Owned) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_block_claims_total",
			Help: "Address blocks this node claimed (compare-and-swap won)."},
			func() float64 { return float64(counts().Claims) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_block_claims_ahead_total",
			Help: "Of the claimed blocks, those claimed before an ADD needed them (no ADD waited for them): in the background once the node's blocks of a range set had less than a quarter of a block free, or at start for --conflist's network."},
			func() float64 { return float64(counts().ClaimsAhead) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_block_handbacks_total",
			Help: "Empty address blocks this node handed back after the block grace."},
			func() float64 { return float64(counts().HandBacks) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_block_reclaims_total",
			Help: "Address blocks of dead nodes (lease expired past the quarantine, or Node deleted) this node reclaimed."},
			func() float64 { return float64(counts().Reclaims) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_block_lists_total",
			Help: "LISTs of address block records this node sent to the datastore (claims and the sweep read a watched copy between them; a steady climb means the watch keeps failing)."},
			func() float64 { return float64(counts().BlockLists) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_fencing_suspensions_total",
			Help: "Times this node stopped allocating from its blocks because it could not prove its lease alive."},
			func() float64 { return float64(counts().Suspensions) }),
	)
}

// registerNetwork adds the node network's metrics, read at each scrape.
func (s *Stats) registerNetwork(counts func() nodenet.Counts) {
	gauge := func(name, help string, f func(nodenet.Counts) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return float64(f(counts())) })
	}
	s.reg.MustRegister(
		gauge("ipledger_node_routes", "Routes to other nodes' pods (and unreachable routes of own blocks) desired at the last reconciliation.",
			func(c nodenet.Counts) int { return c.Routes }),
		gauge("ipledger_node_route_conflicts", "Pod ranges held by a route of another owner, left alone (doctor names them): alert when not 0.",
			func(c nodenet.Counts) int { return c.Conflicts }),
		gauge("ipledger_node_route_offlink", "Routes not made because the other node's address is not on a directly connected network: alert when not 0.",
			func(c nodenet.Counts) int { return c.OffLink }),
		gauge("ipledger_node_network_problems", "Nodes or blocks that could not be routed (no podCIDR, no InternalIP of the family, overlaps).",
			func(c nodenet.Counts) int { return c.Problems }),
		gauge("ipledger_node_network_ready", "1 once the routes were in place and the Node's NetworkUnavailable condition set false.",
			func(c nodenet.Counts) int {
				if c.Ready {
					return 1
				}
				return 0
			}),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_node_network_syncs_total",
			Help: "Reconciliations of the node network's routes and masquerade rules that left no error."},
			func() float64 { return float64(counts().Syncs) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ipledger_node_network_errors_total",
			Help: "Reconciliations of the node network that failed (the log says why)."},
			func() float64 { return float64(counts().Errors) }),
	)
}
