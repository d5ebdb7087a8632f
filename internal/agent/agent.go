// Package agent is the node agent's server: it owns the ledger and answers the
// plugins and the CLI on a root-only unix socket, one request per connection,
// serializing requests per attachment while unrelated attachments proceed in parallel.
package agent

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/spool"
)

// Guard is the runtime's say in releases, implemented by the reconciler. A nil Guard
// means no runtime is configured.
type Guard interface {
	// Supersedable returns those of olds (leases of the same pod UID under other
	// sandboxes) that the runtime confirms are not READY or gone and no longer use
	// their addresses. When the runtime cannot tell, it returns none.
	Supersedable(ctx context.Context, olds []ledger.Lease) []ledger.Key
	// MayRelease reports whether GC may release ls: never when its sandbox is READY or
	// the runtime cannot tell.
	MayRelease(ctx context.Context, ls ledger.Lease) bool
}

// Config wires a Server.
type Config struct {
	Ledger *ledger.Ledger
	Socket string
	// SpoolDir is the DEL spool this agent applies; Serve publishes it next to Socket
	// (spool.Publish) so that plugins spool nowhere else. Empty: no spool.
	SpoolDir      string
	SpoolInterval time.Duration // default 2s
	Guard         Guard
	// Verdicts is the reconciler's last round, shown to operators; nil when no
	// runtime is configured.
	Verdicts Verdicts
	// PodCIDRs resolves usePodCidr ranges (ipledgerd --node-name); nil: such a
	// range is refused.
	PodCIDRs PodCIDRs
	// Node is this node's Kubernetes name (--node-name), for doctor's messages;
	// empty without.
	Node string
	// NodeNetwork: with --node-name, the routes and masquerade controller; nil
	// without.
	NodeNetwork NodeNetwork
	// Pods tells what the Kubernetes API says of this node's pods, shown with each
	// lease (ipledgerd --node-name); nil without.
	Pods Pods
	// Events records Kubernetes Events on the pods whose leases are released by
	// reconciliation, superseded or found stranded (--node-name); nil without.
	Events Events
	// Choices reads the ipledger.io/pool and ipledger.io/ip annotations of an ADD's
	// pod and namespace (--node-name: kubenode.Pods); nil: no annotation is read.
	Choices Choices
	// StatefulSets tells which StatefulSet controls an ADD's pod, whose addresses
	// then follow it from node to node (cluster mode, --node-name: kubenode.Pods);
	// nil: no address is sticky.
	StatefulSets StatefulSets
	// StatefulSetCache tells which StatefulSets exist and their replicas, for the
	// retention of sticky addresses (RunRetention); StickyRetention, when
	// positive, also ends the keeping of an address unused that long
	// (ipledgerd --sticky-retention; 0: as long as its StatefulSet exists).
	StatefulSetCache StatefulSetCache
	StickyRetention  time.Duration
	// Runtime answers the operator's questions about the container runtime (doctor,
	// release, readiness); nil when no runtime is configured.
	Runtime RuntimeInfo
	// Cluster is the block manager in cluster mode; nil in node mode. Datastore
	// names its datastore (kubernetes, etcd) for the operator.
	Cluster   Cluster
	Datastore string
	// Reservations is cluster mode's watched copy of the IPReservations, asked at
	// every cluster-mode allocation; nil: none are read (node mode).
	Reservations Reservations
	Logger       *slog.Logger
	// Clock gives the monotonic time for how-long-ago decisions; default the system's.
	Clock clock.Clock
	// DrainTimeout is how long shutdown waits for requests in flight before it warns
	// (it keeps waiting: the ledger must not close under a request); default 30s.
	DrainTimeout time.Duration
	// MaxConns bounds the connections served at once; default DefaultMaxConns.
	MaxConns int
	// ReadTimeout bounds reading one request from a connection; default
	// DefaultReadTimeout.
	ReadTimeout time.Duration
}

// Bounds on what a client can hold of the agent.
const (
	// DefaultMaxConns connections are served at once. Every CNI call is one short
	// connection and a node runs a few tens of pod starts at once at most; 128 leaves
	// room for bursts and CLI calls while bounding goroutines, file descriptors and
	// buffered requests (128 x api.MaxRequest = 32 MiB at worst).
	DefaultMaxConns = 128
	// DefaultReadTimeout bounds reading a request: a plugin writes its few KiB right
	// after connecting, so 5s is generous even on a loaded node, and a connection that
	// sends nothing gives its slot back quickly.
	DefaultReadTimeout = 5 * time.Second
	// writeTimeout bounds writing an answer to a client that does not read it.
	writeTimeout = 10 * time.Second
)

// Counter names the server adds to its Stats (exposed as metrics).
const (
	CounterSpoolApplied         = "spool_applied"          // spooled DELs applied
	CounterSpoolUnmatched       = "spool_unmatched"        // spooled DELs applied that matched no lease
	CounterSpoolRejected        = "spool_rejected"         // spool entries moved aside unapplied
	CounterSpoolRejectedDropped = "spool_rejected_dropped" // rejected entries removed beyond spool.MaxRejected
	CounterAcceptErrors         = "accept_errors"          // failed Accepts (the server retries)
	CounterConnsEvicted         = "conns_evicted"          // idle connections closed to admit another
)

// Server serves the agent API.
type Server struct {
	cfg   Config
	log   *slog.Logger
	locks keyLocks
	wg    sync.WaitGroup // connections being served
	stats *Stats
	spool *spool.Dir // nil: no spool
	sem   chan struct{}
	conns connSet
	clock *clockWatch // wall-clock steps seen, for doctor and metrics
	// idle hands a connection to a parked worker (unbuffered: only a worker waiting
	// in receive takes it); idleN counts the parked workers.
	idle  chan *trackedConn
	idleN atomic.Int32
	// stranded: the leases a stranded Event was recorded for (Reconciled)
	stranded strandedSeen
	// retained: the retention sweep's state (RunRetention)
	retained retention
}

// New checks cfg and returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Ledger == nil || cfg.Socket == "" {
		return nil, errors.New("agent: ledger and socket are required")
	}
	if cfg.SpoolInterval <= 0 {
		cfg.SpoolInterval = 2 * time.Second
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.NewSystem()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log, locks: keyLocks{m: map[ledger.Key]*keyLock{}}, stats: newStats(),
		sem: make(chan struct{}, cfg.MaxConns), conns: connSet{m: map[*trackedConn]struct{}{}}, clock: &clockWatch{},
		idle: make(chan *trackedConn)}
	if cfg.SpoolDir != "" {
		s.spool = spool.Open(cfg.SpoolDir, cfg.Clock.Mono)
	}
	if cfg.Cluster != nil {
		s.stats.registerCluster(cfg.Cluster.Counts)
	}
	if cfg.NodeNetwork != nil {
		s.stats.registerNetwork(cfg.NodeNetwork.Counts)
	}
	return s, nil
}

// Stats are the server's counters, for metrics.
func (s *Server) Stats() *Stats { return s.stats }
