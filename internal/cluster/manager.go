// Package cluster is cluster mode's block manager: it shares each network's pool
// across nodes in address blocks kept in a datastore (etcd or the Kubernetes API),
// with strict node affinity. A node claims blocks by compare-and-swap, allocates
// inside its own blocks from its node-local ledger with no datastore round trip per
// pod, claims another block when its blocks are full, and gives back a block that
// stayed empty past a grace period (keeping its last block per range set).
//
// Fencing: every block records its owner node and an epoch that every change of
// owner bumps. The manager keeps its node lease alive and hands out addresses only
// while it can prove the lease (monotonic time before the send time of the last
// successful renewal plus the TTL, minus a margin); past that it suspends its blocks,
// and when renewals succeed again it resumes only the blocks whose owner and epoch
// did not move (re-affirming each by compare-and-swap), dropping the others: the
// leases left in a lost block are released locally only.
//
// Concurrency: the lease is renewed on a schedule of its own. The background work
// runs on two goroutines: one renews the lease every Interval and nothing else, the
// other sweeps (hand-backs, reclaims) every Interval and re-verifies the blocks after
// a lapse. A renewal holds renewMu (renewals one at a time: two renewals of one
// lease could make each other fail); a sweep and a re-verification hold stepMu (one
// at a time: a re-verification must not re-affirm a block a sweep is giving back,
// nor a sweep give back one a re-verification is resuming). So a sweep, however slow
// the datastore, never delays a renewal: the lease stays provable while the
// datastore answers renewals. A lapse that happens while blocks are re-verified
// (the lease lost and taken anew, or the proof ran out before a renewal came back)
// voids that re-verification: it leaves the blocks suspended, and the next renewal
// has them re-verified again.
//
// Dead nodes: every live manager watches the node leases; a node whose lease is gone
// or has not changed for its TTL (judged on this manager's monotonic clock), and has
// stayed so for a quarantine at least one TTL long, or whose Node object was deleted
// (NodeGone, and not registered again since: NodeBack) and whose lease ran out, loses
// its blocks: the first manager to bump their epoch by compare-and-swap frees them
// (owner ""); exactly one wins.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Sentinel errors of the manager, wrapped with %w; test with errors.Is.
var (
	// ErrPoolMismatch: the datastore already holds the network's pool with other
	// ranges or block sizes (another node's config); this node's config must match.
	ErrPoolMismatch = errors.New("cluster pool config differs from the datastore's")
	// ErrFenced: the node cannot prove its lease is alive (the datastore was not
	// reached in time), so it hands out nothing from its blocks.
	ErrFenced = errors.New("node lease cannot be proven")
	// ErrNoFreeBlock: every block of the range set is owned by some node (wrapped with
	// ledger.ErrPoolExhausted).
	ErrNoFreeBlock = errors.New("no free block left in the cluster pool")
	// ErrUnknownNetwork: EnsureNetwork was not called for the network.
	ErrUnknownNetwork = errors.New("network not set up for cluster mode")
	// ErrNotStarted: the manager has not acquired its node lease (Start).
	ErrNotStarted = errors.New("block manager not started")
	// ErrBorrowed: the sticky address is lent to another node (named in the
	// message): a borrow lost the race for it, or it cannot be let go yet.
	ErrBorrowed = errors.New("address is borrowed by another node")
	// ErrNotKept: the address is not kept for the pod that asks for it (in no
	// block, or kept for another pod, or for none).
	ErrNotKept = errors.New("address is not kept for this pod")
	// ErrKept: the address is kept for another pod already.
	ErrKept = errors.New("address is kept for another pod")
	// ErrOwnBlock: the address is in a block of this node: nothing to borrow.
	ErrOwnBlock = errors.New("address is in a block of this node")
	// ErrNotOwner: keeping an address needs the node that owns its block.
	ErrNotOwner = errors.New("block is not this node's")
	// ErrBlockOwned: a requested address lies in a block another node owns
	// (named in the message).
	ErrBlockOwned = errors.New("address's block is owned by another node")
	// ErrNoPool: no IPPool of the name a pod asks for exists.
	ErrNoPool = errors.New("no such IPPool")
	// ErrPoolNotForNode: the IPPool's node selector does not select this node.
	ErrPoolNotForNode = errors.New("IPPool does not select this node")
	// ErrBadPool: an IPPool's name or spec cannot be used (the message names the
	// field and the fix).
	ErrBadPool = errors.New("invalid IPPool")
	// ErrBadReservation: an IPReservation's name or spec cannot be used (the
	// message names the field and the fix).
	ErrBadReservation = errors.New("invalid IPReservation")
	// ErrReservationsUnknown: the watched copy of the IPReservations has not
	// listed since the agent started, or its watch broke since: which addresses
	// are reserved is unknown (the message says why and since when).
	ErrReservationsUnknown = errors.New("IPReservations not known")
)

// Defaults.
const (
	DefaultLeaseTTL = 30 * time.Second
	DefaultGrace    = 5 * time.Minute
)

// Options configure a Manager. Zero values take the defaults.
type Options struct {
	// Node is this node's name (required): the owner of its blocks and its lease.
	Node string
	// Holder identifies this agent process (default Node + "/" + a random id).
	Holder string
	// Addrs are the node's addresses, published with its lease: without Kubernetes
	// Nodes the other nodes route this node's blocks through them (LeaseNodes).
	Addrs []netip.Addr
	// Clock gives monotonic time for every deadline; default clock.NewSystem().
	Clock clock.Clock
	// LeaseTTL is the node lease's time to live (default 30 s); renewals are sent
	// every LeaseTTL/3.
	LeaseTTL time.Duration
	// Margin is subtracted from the lease's proven validity before the node stops
	// allocating (default LeaseTTL/10).
	Margin time.Duration
	// Grace is how long a block must stay empty (two observations that far apart,
	// nothing allocated in between) before it is given back (default 5 min, never
	// less than the ledger's reuse delay).
	Grace time.Duration
	// Quarantine is how long a node's lease must have stayed expired before its
	// blocks are reclaimed (default and minimum LeaseTTL).
	Quarantine time.Duration
	// Interval is the period of the background renewals, and of the background
	// sweeps, each on its own schedule (default LeaseTTL/3).
	Interval time.Duration
	// Manual: Start runs no background loop; the caller drives Renew and Sweep (tests).
	Manual bool
	// Timeout bounds each datastore call (default LeaseTTL/3).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Manager manages this node's blocks. It is safe for concurrent use. Its lease
// renewals never wait for its sweeps (see the package comment): Renew, Sweep and
// the background goroutines say which lock each holds.
type Manager struct {
	ds   datastore.Store
	l    *ledger.Ledger
	opts Options
	log  *slog.Logger

	claimMu sync.Mutex // one claim at a time (concurrent ADDs must not each claim)
	// setupMu: one EnsureNetwork set-up or follow-up at a time (taken before claimMu)
	setupMu sync.Mutex
	// stickyMu: a sticky allocation's borrow and its lease, or the orphan sweep
	stickyMu sync.Mutex
	// renewMu: one lease renewal at a time (a renewal never waits for stepMu)
	renewMu sync.Mutex
	// stepMu: Sweep and the re-verification after a lapse, one at a time
	stepMu sync.Mutex

	mu        sync.Mutex
	fencing   fencing
	reachable bool // the last datastore call succeeded
	lastErr   error
	called    bool          // a datastore call's outcome was noted (health.go)
	lastCall  time.Duration // monotonic: when the last outcome was noted
	lastOK    time.Duration // monotonic: the last successful call, or Start
	nets      map[string]PoolRecord
	pools     map[string]IPPool     // named pools set up here (EnsurePool), by name
	owned     map[string]ownedBlock // by datastore key
	empty     map[string]emptyObs   // hand-back observations, by key
	obs       map[string]*leaseObs  // other nodes' leases, by node
	gone      map[string]bool       // nodes whose Node object was deleted
	// blind: a datastore read of this manager failed since it last listed the node
	// leases, so it may have missed renewals that nobody could make
	blind bool
	// fullList: monotonic time of the sweep's last LIST of every network's blocks
	// (listed once a quarantine; between, the sweep reads the networks set up here
	// from their watched copies); listed: whether there was one. Guarded by stepMu.
	fullList time.Duration
	listed   bool

	cancel context.CancelFunc
	loops  sync.WaitGroup // the background goroutines (renewing, sweeping)
	// reverify receives a value (coalesced) when a background renewal succeeded
	// while the blocks are suspended: the sweeping goroutine re-verifies them
	reverify chan struct{}
	counts   counters // for metrics (counts.go)

	cacheMu sync.Mutex
	caches  map[string]*blockCache // by network (cache.go)
	// changed receives a value (coalesced) when a watched block record changed:
	// the node network routes blocks to their owners (BlocksChanged).
	changed chan struct{}
	// owners: every block of the cluster, as WatchOwners watches them (Owners)
	owners ownersCopy
	// poolCopy: every pool record, as WatchPools watches them; poolsFollowed
	// receives a value (coalesced) after WatchPools applied a record
	poolCopy      ownersCopy
	poolsFollowed chan struct{}
	// refused: by pool, why its record is not served as it stands (livepool.go)
	refused map[string]string

	// ahead receives a value (coalesced) when aheadWanted (guarded by mu) names a
	// network to claim ahead for; aheadRetry (guarded by claimMu): monotonic time
	// before which a set whose claim ahead failed is not tried again (ahead.go)
	ahead       chan struct{}
	aheadWanted map[string]bool
	aheadRetry  map[setKey]time.Duration
}

// fencing is the state the allocation guard decides on; Manager.mu guards it. It
// carries the fencing rule: the node hands out nothing from its blocks, and claims
// none, unless the manager has started, its blocks are not suspended, and the
// monotonic clock is before the deadline its last successful renewal proved (past
// it the lease may have expired and another node reclaimed the blocks).
type fencing struct {
	lease    datastore.NodeLease // the node lease as last acquired or renewed (ID "" when none)
	started  bool                // Start was called, Stop was not
	deadline time.Duration       // monotonic: allocation allowed while now < deadline
	lapsed   bool                // blocks suspended (or unverified) until a renewal and re-verification
	// proof counts the breaks in the lease's proof: every suspension, and every
	// renewal sent at or past the deadline (the lease was not provable in between).
	// A re-verification clears lapsed only if proof did not move while it ran.
	proof uint64
}

type ownedBlock struct {
	rec BlockRecord
	rev int64
}

type emptyObs struct {
	since time.Duration
	gen   uint64
}

type leaseObs struct {
	rev       int64
	seen      time.Duration // monotonic reading when this revision was first seen
	ttl       time.Duration
	goneSince time.Duration // when the lease was first seen missing (gone true)
	gone      bool
}

// New returns a manager of node opts.Node's blocks in ds, allocating from l.
func New(ds datastore.Store, l *ledger.Ledger, opts Options) (*Manager, error) {
	if opts.Node == "" {
		return nil, errors.New("cluster: node name is empty; give --node-name (the Kubernetes node name)")
	}
	if err := datastore.CheckAddrs(opts.Node, opts.Addrs); err != nil {
		return nil, fmt.Errorf("cluster: the node's addresses: %w", err)
	}
	if opts.Holder == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		opts.Holder = opts.Node + "/" + hex.EncodeToString(b[:])
	}
	if opts.Clock == nil {
		opts.Clock = clock.NewSystem()
	}
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.Margin <= 0 {
		opts.Margin = opts.LeaseTTL / 10
	}
	if opts.Margin >= opts.LeaseTTL {
		return nil, fmt.Errorf("cluster: margin %s is not below the lease TTL %s", opts.Margin, opts.LeaseTTL)
	}
	if opts.Grace <= 0 {
		opts.Grace = DefaultGrace
	}
	if d := l.ReuseDelay(); opts.Grace < d {
		opts.Grace = d
	}
	if opts.Quarantine < opts.LeaseTTL {
		opts.Quarantine = opts.LeaseTTL
	}
	if opts.Interval <= 0 {
		opts.Interval = opts.LeaseTTL / 3
	}
	if opts.Timeout <= 0 {
		opts.Timeout = opts.LeaseTTL / 3
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{ds: ds, l: l, opts: opts, log: log.With("node", opts.Node),
		nets: map[string]PoolRecord{}, pools: map[string]IPPool{}, owned: map[string]ownedBlock{}, empty: map[string]emptyObs{},
		obs: map[string]*leaseObs{}, gone: map[string]bool{}, fencing: fencing{lapsed: true},
		caches: map[string]*blockCache{}, changed: make(chan struct{}, 1), reverify: make(chan struct{}, 1), poolsFollowed: make(chan struct{}, 1), refused: map[string]string{},
		ahead: make(chan struct{}, 1), aheadWanted: map[string]bool{}, aheadRetry: map[setKey]time.Duration{}}
	l.SetAllocationGuard(m.guard)
	return m, nil
}

// Node is the node's name; Holder this agent's identity.
func (m *Manager) Node() string   { return m.opts.Node }
func (m *Manager) Holder() string { return m.opts.Holder }

func (m *Manager) mono() time.Duration { return m.opts.Clock.Mono() }

// call runs f, one datastore call, under a deadline of its own: Options.Timeout
// from now, within ctx. Every request the manager sends goes through it (a block
// watch, which lasts until Stop or the next list, does not), so that a call never
// waits past the timeout, and an operation of many calls (a claim's compare-and-swap
// attempts, the sweep's reclaims) never runs a later call on what the earlier ones
// left of a shared deadline.
func (m *Manager) call(ctx context.Context, f func(context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	return f(cctx)
}

// note records the outcome of a datastore call for Status.
func (m *Manager) note(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.called, m.lastCall = true, m.mono()
	if err == nil || !errors.Is(err, datastore.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		m.reachable, m.lastOK = true, m.lastCall
		if err == nil {
			m.lastErr = nil
		}
		return
	}
	m.reachable = false
	m.blind = true // see reclaim
	m.lastErr = err
}

// Start acquires the node's lease, suspends the blocks the ledger holds until each
// is re-verified against the datastore, verifies them, and (unless Options.Manual)
// starts the background goroutines: one renews the lease, the other gives back
// empty blocks and reclaims dead nodes' blocks (see the package comment). When the
// datastore cannot be reached Start still starts them (the node hands out nothing
// until it can prove its lease) and returns the error.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.l.SuspendAll(); err != nil {
		return err
	}
	m.mu.Lock()
	m.fencing.started, m.fencing.lapsed, m.lastOK = true, true, m.mono()
	m.mu.Unlock()
	err := m.Renew(ctx)
	if !m.opts.Manual {
		lctx, cancel := context.WithCancel(context.Background())
		m.cancel = cancel
		m.loops.Go(func() { m.renewLoop(lctx) })
		m.loops.Go(func() { m.sweepLoop(lctx) })
		m.loops.Go(func() { m.aheadLoop(lctx) })
	}
	return err
}

// renewLoop renews the lease every Interval until Stop, and nothing else: it takes
// renewMu only, never stepMu, so no sweep can delay it. After a renewal that left
// the blocks suspended it asks sweepLoop to re-verify them. The ticker is the
// process's scheduling edge; every decision reads Options.Clock.
func (m *Manager) renewLoop(ctx context.Context) {
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		lapsed, err := m.renewLease(ctx)
		if err != nil {
			m.log.Warn("lease renewal failed", "err", err)
			continue
		}
		if lapsed {
			select {
			case m.reverify <- struct{}{}:
			default:
			}
		}
	}
}

// sweepLoop sweeps every Interval until Stop, and re-verifies the blocks when
// renewLoop asks; both hold stepMu, so they take turns, and a slow one delays only
// the other, never a renewal.
func (m *Manager) sweepLoop(ctx context.Context) {
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.reverify:
			if err := m.verifyLapsed(ctx); err != nil {
				m.log.Warn("re-verifying blocks failed", "err", err)
			}
		case <-t.C:
			if err := m.Sweep(ctx); err != nil {
				m.log.Warn("block sweep failed", "err", err)
			}
		}
	}
}

// Stop ends the background goroutines (waiting for both) and releases the node
// lease (a clean shutdown: the blocks stay the node's; other nodes reclaim them only
// after the quarantine).
func (m *Manager) Stop(ctx context.Context) error {
	if m.cancel != nil {
		m.cancel()
		m.loops.Wait()
		m.cancel = nil
	}
	m.stopWatches()
	m.mu.Lock()
	l, started := m.fencing.lease, m.fencing.started
	m.fencing.started = false
	m.mu.Unlock()
	if !started || l.ID == "" {
		return nil
	}
	return m.call(ctx, func(ctx context.Context) error { return m.ds.Leases().Release(ctx, l) })
}

// listBlocks sends one LIST of the block records under prefix to the datastore,
// counted in BlockLists (ipledger_block_lists_total).
func (m *Manager) listBlocks(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	m.counts.blockLists.Add(1)
	var kvs []datastore.KV
	var rev int64
	err := m.call(ctx, func(ctx context.Context) (err error) {
		kvs, rev, err = m.ds.List(ctx, prefix)
		return err
	})
	m.note(err)
	return kvs, rev, err
}
