// Command ipledgerd is the node agent: it owns the ledger and serves the plugins and
// the CLI. main parses flags and starts the components.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/clusterconf"
	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/netconf"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/spool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/walstore"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if len(os.Args) > 1 && os.Args[1] == "install-cni" {
		os.Exit(installCNI(os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "uninstall-cni" {
		os.Exit(uninstallCNI(os.Args[2:], os.Stdout, os.Stderr))
	}
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stderr))
}

type options struct {
	stateDir, socket, spoolDir, criEndpoint, metricsAddr string
	debugAddr                                            string
	reconcileInterval, releaseGrace, reuseDelay          time.Duration
	stickyRetention                                      time.Duration
	strandedGrace                                        time.Duration
	apiEvidence                                          bool
	takeoverTimeout                                      time.Duration
	reclaimStranded                                      bool
	logLevel                                             string
	cluster                                              clusterconf.Config
	network                                              netconf.Config
	conflist                                             string
	prepare                                              *preparedNetwork // from --conflist
}

// parse reads the flags; getenv supplies the environment's defaults (NODE_NAME).
func parse(args []string, getenv func(string) string, stderr io.Writer) (*options, error) {
	var o options
	fs := flag.NewFlagSet("ipledgerd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/ipledger", "directory of the ledger's state file (ledger.db, with its write-ahead log ledger.db-wal.0 and .1) and the DEL spool")
	fs.StringVar(&o.socket, "socket", "/run/ipledger/ipledger.sock", "unix socket the plugins and the CLI call (mode 0600)")
	fs.StringVar(&o.spoolDir, "spool-dir", "", "directory where plugins spool DELs while the agent is down (default STATE-DIR/spool); published to the plugins as the symlink SOCKET.spool")
	fs.StringVar(&o.criEndpoint, "cri-endpoint", "", "CRI runtime endpoint, e.g. unix:///run/containerd/containerd.sock (none: no runtime reconciliation)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "address for Prometheus /metrics, /healthz, /readyz and the pool page at /, e.g. 127.0.0.1:9780 (loopback: the page shows pod names; empty, the default: off)")
	fs.StringVar(&o.debugAddr, "debug-addr", "", "address for Go's profiler (net/http/pprof under /debug/pprof/), e.g. 127.0.0.1:9781; for profiling the agent, never on a reachable address (it shows the command line and costs CPU while a profile runs); empty, the default: off")
	fs.DurationVar(&o.reconcileInterval, "reconcile-interval", 30*time.Second, "how often leases are compared with the runtime's sandboxes")
	fs.DurationVar(&o.releaseGrace, "release-grace", 60*time.Second, "how long a lease must look abandoned, over at least two observations, before it is released")
	fs.DurationVar(&o.reuseDelay, "reuse-delay", 30*time.Second, "least time between an address's release and its allocation to another pod")
	fs.DurationVar(&o.takeoverTimeout, "takeover-timeout", 90*time.Second, "how long to wait, at start, for another ipledgerd holding the state file or the socket to exit (a DaemonSet rollover starts the new agent while the old one drains); 0: give up at once")
	fs.BoolVar(&o.reclaimStranded, "reclaim-stranded", false, "remove the interface of a NotReady sandbox that still holds its address (identity-checked) and release it after --stranded-grace; off by default because it changes a pod's namespace, and a stranded lease is reported and kept either way")
	fs.BoolVar(&o.apiEvidence, "api-evidence", true, "with --node-name: a pod deleted from the Kubernetes API, or Succeeded or Failed, is evidence for the reconciler beside the runtime's (never alone: only for a NOTREADY or gone sandbox, over --release-grace and two observations); it releases a NotReady sandbox's lease whose namespace was not recorded, and removes the interface of a stranded one; false: the runtime is the only witness")
	fs.DurationVar(&o.strandedGrace, "stranded-grace", 10*time.Minute, "how long a lease must be stranded before --reclaim-stranded acts; at least --release-grace")
	fs.DurationVar(&o.stickyRetention, "sticky-retention", 0, "cluster mode: how long an address kept for a StatefulSet's pod stays kept while no pod uses it (0, the default: as long as the StatefulSet exists and the pod's ordinal is below its replicas)")
	o.cluster.Register(fs, getenv)
	o.network.Register(fs)
	fs.StringVar(&o.conflist, "conflist", "", "cluster mode: the CNI network config list the node's pods use (the file install-cni installs); at start the agent sets up its ipledger network and claims the node's first block of each range set (never a pool's last unowned one), so that the node's first pods do not wait for that; empty, the default: the node's first ADD does it")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.spoolDir == "" {
		o.spoolDir = filepath.Join(o.stateDir, "spool")
	}
	if err := o.cluster.Check(fs); err != nil {
		return nil, err
	}
	if err := o.network.Check(fs, o.cluster.Kubernetes() || o.cluster.LeaseNodes(), o.cluster.Cluster()); err != nil {
		return nil, err
	}
	for name, d := range map[string]time.Duration{"--reconcile-interval": o.reconcileInterval, "--release-grace": o.releaseGrace, "--stranded-grace": o.strandedGrace} {
		if d <= 0 {
			return nil, fmt.Errorf("%s: must be positive", name)
		}
	}
	if o.strandedGrace < o.releaseGrace {
		return nil, fmt.Errorf("--stranded-grace %v is shorter than --release-grace %v: a stranded lease (its address still configured in a pod's namespace) must wait at least as long as an abandoned one; raise --stranded-grace", o.strandedGrace, o.releaseGrace)
	}
	if o.reuseDelay < 0 {
		return nil, errors.New("--reuse-delay: must not be negative")
	}
	if o.stickyRetention < 0 {
		return nil, fmt.Errorf("--sticky-retention: %v is negative; give a duration such as 24h, or 0 to keep a StatefulSet pod's address as long as its StatefulSet exists", o.stickyRetention)
	}
	if o.stickyRetention > 0 && !o.cluster.Cluster() {
		return nil, errors.New("--sticky-retention: sticky addresses exist only in cluster mode (--datastore); remove the flag in node mode")
	}
	if o.takeoverTimeout < 0 {
		return nil, errors.New("--takeover-timeout: must not be negative")
	}
	if o.conflist != "" {
		if !o.cluster.Cluster() {
			return nil, errors.New("--conflist: only cluster mode (--datastore) claims blocks; remove the flag in node mode")
		}
		p, err := readConflist(o.conflist)
		if err != nil {
			return nil, err
		}
		o.prepare = p
	}
	return &o, nil
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	o, err := parse(args, getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "ipledgerd:", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(stderr, "ipledgerd: --log-level:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	steadyGC(getenv)
	if err := serve(ctx, o, log); errors.Is(err, errStopped) {
		log.Info("stopped while waiting to take over")
	} else if err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, o *options, log *slog.Logger) error {
	// One fdatasync per commit: the write-ahead log takes each commit, ledger.db is
	// written at checkpoints (and completely at a clean stop).
	var st *walstore.Store
	err := takeOver(ctx, log, o.takeoverTimeout, "state file", boltstore.ErrLocked, func() (err error) {
		st, err = walstore.Open(filepath.Join(o.stateDir, "ledger.db"), walstore.WithBolt(boltstore.WithLockTimeout(takeoverPoll)), walstore.WithLogger(log))
		return err
	})
	if err != nil {
		return err
	}
	// one boot clock: the ledger stamps releases and new leases with it, the
	// reconciler counts lease ages by it
	boot := clock.NewSystemBoot()
	l, err := openLedger(st, ledger.Options{ReuseDelay: o.reuseDelay, Logger: log, Boot: boot})
	if err != nil {
		st.Close()
		return err
	}
	defer func() {
		if err := l.Close(); err != nil {
			log.Error("closing the ledger: its write-ahead log keeps what ledger.db lacks, replayed at the next start", "err", err)
		}
	}()
	// Listen before any other goroutine runs: Listen sets the process umask for the
	// socket's mode. It refuses when another agent serves the socket, and such an
	// agent owns the spool. Spooled DELs are still applied before any ADD is
	// answered: connections wait in the backlog until Serve, which applies the spool
	// before its first Accept.
	var ln net.Listener
	err = takeOver(ctx, log, o.takeoverTimeout, "socket", agent.ErrSocketBusy, func() (err error) {
		ln, err = agent.Listen(o.socket)
		return err
	})
	if err != nil {
		return err
	}
	defer os.Remove(o.socket)
	defer ln.Close()
	// only now that this agent holds the state file and the socket: an agent
	// waiting to take over must not undo what the running one keeps
	removeNetfilterTurnedOff(o, log)
	removeRoutesIfOff(o, log)
	cfg := agent.Config{Ledger: l, Socket: o.socket, SpoolDir: o.spoolDir, Logger: log}
	if o.cluster.Cluster() {
		m, rs, stop, err := startCluster(ctx, &o.cluster, nodeIPs(o, log), l, log)
		if err != nil {
			return err
		}
		// after Serve has drained (defers run last-in first-out): the ledger closes after
		defer stop()
		if o.prepare != nil {
			pctx, pcancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); prepareNetwork(pctx, m, *o.prepare, log) }()
			defer func() { pcancel(); <-done }() // before stop
		}
		cfg.Cluster, cfg.Datastore, cfg.Reservations = m, o.cluster.Datastore, rs
		if o.cluster.LeaseNodes() {
			nc, err := startLeaseNetwork(ctx, o, m, log)
			if err != nil {
				return err
			}
			if nc != nil {
				cfg.NodeNetwork = nc
			}
		}
	}
	var pods *kubenode.Pods
	if o.cluster.Kubernetes() {
		var m *cluster.Manager
		if mm, ok := cfg.Cluster.(*cluster.Manager); ok {
			m = mm
		}
		kp, err := startNetwork(ctx, o, m, log)
		if err != nil {
			return err
		}
		if !o.cluster.Cluster() {
			cfg.PodCIDRs, cfg.Node = kp.nodes, o.cluster.NodeName
		}
		if kp.network != nil {
			cfg.NodeNetwork = kp.network
		}
		cfg.Pods, cfg.Events = kp.pods, kp.events
		if kp.pods != nil {
			cfg.Choices = kp.pods
			cfg.StatefulSets = kp.pods // sticky addresses, in cluster mode only
		}
		if kp.statefulSets != nil {
			cfg.StatefulSetCache, cfg.StickyRetention = kp.statefulSets, o.stickyRetention
		}
		pods = kp.pods
	}
	var witness reconcile.PodWitness // the API, the reconciler's second witness
	if pods != nil && o.apiEvidence {
		witness = pods
	}
	rp, err := newReconciler(o, l, boot, witness, log)
	if err != nil {
		return err
	}
	if rp != nil {
		cfg.Guard, cfg.Verdicts, cfg.Runtime = rp.rec, rp.rec, rp.rt
	}
	srv, err := agent.New(cfg)
	if err != nil {
		return err
	}
	if rp != nil {
		rp.start(ctx, o.reconcileInterval, srv)
	}
	go srv.WatchClock(ctx, time.Second)
	if cfg.StatefulSetCache != nil {
		go srv.RunRetention(ctx, retentionSweep(o.stickyRetention))
	}
	if o.metricsAddr != "" {
		mln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			return fmt.Errorf("--metrics-addr %s: %w", o.metricsAddr, err)
		}
		hs := &http.Server{Handler: srv.HTTPHandler(), ReadHeaderTimeout: 5 * time.Second}
		go hs.Serve(mln)
		defer hs.Close()
	}
	if o.debugAddr != "" {
		dln, err := net.Listen("tcp", o.debugAddr)
		if err != nil {
			return fmt.Errorf("--debug-addr %s: %w", o.debugAddr, err)
		}
		ds := &http.Server{Handler: debugHandler(), ReadHeaderTimeout: 5 * time.Second}
		go ds.Serve(dln)
		defer ds.Close()
		log.Info("profiler on", "debug_addr", dln.Addr().String())
	}
	// After a failed commit the ledger re-reads its books from the store; if even that
	// fails it refuses every change (ledger.ErrStateUnknown). Guessing is never safe,
	// so the agent then stops, and its supervisor (the DaemonSet, systemd) restarts it
	// on whatever the store holds.
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	go watchLedger(ctx, l, stop)
	log.Info("serving", "socket", o.socket, "state", filepath.Join(o.stateDir, "ledger.db"), "spool", o.spoolDir, "spool_pointer", spool.Pointer(o.socket), "cri", o.criEndpoint)
	err = srv.Serve(ctx, ln)
	log.Info("stopped")
	if err == nil {
		if cause := context.Cause(ctx); errors.Is(cause, ledger.ErrStateUnknown) {
			return cause
		}
	}
	return err
}

// errStopped: SIGTERM came while the agent waited to take over; it exits 0.
var errStopped = errors.New("stopped before serving")

// takeOver calls try until it succeeds or fails with an error that is not busy, and
// while it is busy (another ipledgerd holds what is named, as in a DaemonSet rollover
// where the old agent still drains) for at most timeout, logging the wait. It returns
// errStopped when ctx ends first.
func takeOver(ctx context.Context, log *slog.Logger, timeout time.Duration, what string, busy error, try func() error) error {
	start := time.Now()
	var logged time.Time
	for {
		err := try()
		if err == nil {
			if !logged.IsZero() {
				log.Info("the previous ipledgerd let go; taking over", "what", what, "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if !errors.Is(err, busy) {
			return err
		}
		waited := time.Since(start)
		if timeout == 0 {
			return err
		}
		if time.Since(logged) >= 5*time.Second {
			log.Warn("waiting for another ipledgerd to exit before taking over", "what", what, "err", err, "waited", waited.Round(time.Second), "limit", timeout)
			logged = time.Now()
		}
		if waited >= timeout {
			return fmt.Errorf("%w (waited %v for it to be free; --takeover-timeout)", err, waited.Round(100*time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return errStopped
		case <-time.After(takeoverPoll):
		}
	}
}

// takeoverPoll is how often a waiting agent tries again (and how long one attempt to
// open the state file waits for its lock).
const takeoverPoll = 100 * time.Millisecond

// openLedger is ledger.Open with the garbage collector held back while it runs.
//
// Why: the load allocates about 60 MB at 64k leases and keeps nearly all of it (the
// books). With the default GOGC the collector runs four or five times while the heap
// grows from nothing, each time marking the live set so far, for little garbage: a
// quarter of the agent's start-up CPU. Nothing else runs yet, so GOGC is raised to
// loadGCPercent for the load (a load that does make garbage still gets collected, the
// heap bounded by five times its live data) and set back after, when the first
// collection marks the books once. A GOGC the operator set higher, or off, is left
// alone.
func openLedger(st ledger.Store, opts ledger.Options) (*ledger.Ledger, error) {
	if prev := debug.SetGCPercent(loadGCPercent); prev < 0 || prev > loadGCPercent {
		debug.SetGCPercent(prev)
	} else {
		defer debug.SetGCPercent(prev)
	}
	return ledger.Open(st, opts)
}

const loadGCPercent = 400

// steadyGC sets the collector's target to steadyGCPercent unless the operator chose
// one (GOGC in the environment, which the runtime has applied).
//
// Why: nearly all of the agent's heap is its books, which live as long as their
// leases, and each request leaves only a few KiB of garbage. With Go's default
// (GOGC=100) the heap may grow to twice the books before a collection, so that half of
// the agent's memory is room for garbage it makes slowly. At 50 the room is half the
// books, for a collection every half as many requests (each marks the books: about
// 20-40 ms of CPU at 64k leases, beside serving); benchcmd --only agent-rss measures
// the RSS. After a restart the RSS is mostly the books and ledger.db's pages mapped by
// the load, which this does not change.
func steadyGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(steadyGCPercent)
	}
}

const steadyGCPercent = 50

// watchLedger stops the agent (through stop) once the ledger reports it cannot know
// its state.
func watchLedger(ctx context.Context, l *ledger.Ledger, stop context.CancelCauseFunc) {
	select {
	case <-ctx.Done():
	case <-l.BrokenC():
		stop(l.Broken()) // wraps ledger.ErrStateUnknown
	}
}

// retentionSweep is how often the keeping of sticky addresses is judged besides
// each change of the StatefulSets: a minute, or a quarter of --sticky-retention
// when that is shorter.
func retentionSweep(retention time.Duration) time.Duration {
	if retention > 0 && retention/4 < time.Minute {
		return max(retention/4, time.Second)
	}
	return time.Minute
}
