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
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
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
	// Interval is the period of the background loop (default LeaseTTL/3).
	Interval time.Duration
	// Manual: Start runs no background loop; the caller drives Renew and Sweep (tests).
	Manual bool
	// Timeout bounds each datastore call (default LeaseTTL/3).
	Timeout time.Duration
	Logger  *slog.Logger
}

// Manager manages this node's blocks. It is safe for concurrent use.
type Manager struct {
	ds   datastore.Store
	l    *ledger.Ledger
	opts Options
	log  *slog.Logger

	claimMu sync.Mutex // one claim at a time (concurrent ADDs must not each claim)
	stepMu  sync.Mutex // Renew, Sweep, verification: one at a time

	mu        sync.Mutex
	lease     datastore.NodeLease
	started   bool
	deadline  time.Duration // monotonic: allocation allowed while now < deadline
	lapsed    bool          // blocks suspended (or unverified) until a renewal and re-verification
	reachable bool          // the last datastore call succeeded
	lastErr   error
	called    bool          // a datastore call's outcome was noted (health.go)
	lastCall  time.Duration // monotonic: when the last outcome was noted
	lastOK    time.Duration // monotonic: the last successful call, or Start
	nets      map[string]PoolRecord
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
	done   chan struct{}
	counts counters // for metrics (counts.go)

	cacheMu sync.Mutex
	caches  map[string]*blockCache // by network (cache.go)
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
		nets: map[string]PoolRecord{}, owned: map[string]ownedBlock{}, empty: map[string]emptyObs{},
		obs: map[string]*leaseObs{}, gone: map[string]bool{}, lapsed: true,
		caches: map[string]*blockCache{}}
	l.SetAllocationGuard(m.guard)
	return m, nil
}

// Node is the node's name; Holder this agent's identity.
func (m *Manager) Node() string   { return m.opts.Node }
func (m *Manager) Holder() string { return m.opts.Holder }

func (m *Manager) mono() time.Duration { return m.opts.Clock.Mono() }

// guard is the ledger's allocation guard: nothing is handed out from the node's
// blocks unless the lease is provable now.
func (m *Manager) guard(network string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started {
		return ErrNotStarted
	}
	if now := m.mono(); m.lapsed || now >= m.deadline {
		return fmt.Errorf("%w: node %s: no successful lease renewal for too long (datastore unreachable?); allocation resumes once it renews", ErrFenced, m.opts.Node)
	}
	return nil
}

// Provable reports whether the node's lease is provable now.
func (m *Manager) Provable() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.started && !m.lapsed && m.mono() < m.deadline
}

func (m *Manager) ctx(parent context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(parent, m.opts.Timeout)
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
// starts the background loop that renews the lease, gives back empty blocks and
// reclaims dead nodes' blocks. When the datastore cannot be reached Start still
// starts the loop (the node hands out nothing until it can prove its lease) and
// returns the error.
func (m *Manager) Start(ctx context.Context) error {
	if err := m.l.SuspendAll(); err != nil {
		return err
	}
	m.mu.Lock()
	m.started, m.lapsed, m.lastOK = true, true, m.mono()
	m.mu.Unlock()
	err := m.Renew(ctx)
	if !m.opts.Manual {
		lctx, cancel := context.WithCancel(context.Background())
		m.cancel, m.done = cancel, make(chan struct{})
		go m.loop(lctx)
	}
	return err
}

// loop renews and sweeps every Interval until Stop. The ticker is the process's
// scheduling edge; every decision reads Options.Clock.
func (m *Manager) loop(ctx context.Context) {
	defer close(m.done)
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := m.Renew(ctx); err != nil {
			m.log.Warn("lease renewal failed", "err", err)
		}
		if err := m.Sweep(ctx); err != nil {
			m.log.Warn("block sweep failed", "err", err)
		}
	}
}

// Stop ends the background loop and releases the node lease (a clean shutdown: the
// blocks stay the node's; other nodes reclaim them only after the quarantine).
func (m *Manager) Stop(ctx context.Context) error {
	if m.cancel != nil {
		m.cancel()
		<-m.done
		m.cancel = nil
	}
	m.stopWatches()
	m.mu.Lock()
	l, started := m.lease, m.started
	m.started = false
	m.mu.Unlock()
	if !started || l.ID == "" {
		return nil
	}
	cctx, cancel := m.ctx(ctx)
	defer cancel()
	return m.ds.Leases().Release(cctx, l)
}

// Renew renews the node lease (acquiring it when the manager holds none or lost it)
// and, after a lapse, re-verifies the node's blocks. It also suspends the blocks once
// the lease can no longer be proven.
func (m *Manager) Renew(ctx context.Context) error {
	m.stepMu.Lock()
	defer m.stepMu.Unlock()
	m.fence()
	m.mu.Lock()
	cur := m.lease
	m.mu.Unlock()
	leases := m.ds.Leases()
	sent := m.mono()
	cctx, cancel := m.ctx(ctx)
	var nl datastore.NodeLease
	var err error
	if cur.ID == "" {
		nl, err = leases.Acquire(cctx, m.opts.Node, m.opts.Holder, m.opts.LeaseTTL)
	} else {
		nl, err = leases.Renew(cctx, cur)
		if errors.Is(err, datastore.ErrNotFound) || errors.Is(err, datastore.ErrConflict) {
			// The lease expired or was taken over: whatever the node proved before is
			// void; suspend, take a new lease, re-verify every block.
			m.log.Warn("node lease lost; suspending blocks", "err", err)
			m.suspend()
			sent = m.mono()
			nl, err = leases.Acquire(cctx, m.opts.Node, m.opts.Holder, m.opts.LeaseTTL)
		}
	}
	cancel()
	m.note(err)
	if err != nil {
		m.fence()
		return fmt.Errorf("node lease of %s: %w", m.opts.Node, err)
	}
	m.mu.Lock()
	m.lease = nl
	m.deadline = sent + m.opts.LeaseTTL - m.opts.Margin
	lapsed := m.lapsed
	m.mu.Unlock()
	if lapsed {
		return m.verify(ctx)
	}
	return nil
}

// fence suspends the node's blocks once the lease can no longer be proven.
func (m *Manager) fence() {
	m.mu.Lock()
	expired := m.started && !m.lapsed && m.mono() >= m.deadline
	m.mu.Unlock()
	if expired {
		m.log.Warn("node lease not proven in time; suspending blocks")
		m.suspend()
	}
}

func (m *Manager) suspend() {
	m.mu.Lock()
	if !m.lapsed {
		m.counts.suspensions.Add(1)
	}
	m.lapsed = true
	m.mu.Unlock()
	if err := m.l.SuspendAll(); err != nil {
		m.log.Error("suspending blocks in the ledger", "err", err)
	}
}

// verify re-reads every block the ledger holds (and every block the datastore says
// the node owns in its networks) after a lapse: a block still the node's at the
// ledger's epoch is re-affirmed by compare-and-swap and resumed; any other is lost.
// The allocation guard opens only when every block was judged.
func (m *Manager) verify(ctx context.Context) error {
	type want struct {
		network string
		prefix  netip.Prefix
	}
	seen := map[want]bool{}
	for _, b := range m.l.Blocks("") {
		if b.State == ledger.BlockLost {
			continue
		}
		seen[want{b.Network, b.Prefix}] = true
		key := BlockKey(b.Network, b.Prefix)
		cctx, cancel := m.ctx(ctx)
		kv, err := m.ds.Get(cctx, key)
		cancel()
		m.note(err)
		var rec BlockRecord
		if err == nil {
			rec, err = decodeBlock(kv)
		}
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			m.lose(b.Network, b.Prefix, "its record is gone from the datastore")
			continue
		case err != nil:
			return fmt.Errorf("re-verifying block %s of %q: %w", b.Prefix, b.Network, err)
		}
		if rec.Owner != m.opts.Node || rec.Epoch != b.Epoch {
			m.lose(b.Network, b.Prefix, fmt.Sprintf("owner %q at epoch %d now (ours was epoch %d)", rec.Owner, rec.Epoch, b.Epoch))
			continue
		}
		// Re-affirm: a reclaimer that read the block before this write fails its
		// compare-and-swap, one that reads it after sees the renewed lease.
		rec.Holder, rec.Lease = m.opts.Holder, m.leaseID()
		val, _ := json.Marshal(rec)
		cctx, cancel = m.ctx(ctx)
		rev, err := m.ds.Update(cctx, key, val, kv.Revision)
		cancel()
		m.note(err)
		if errors.Is(err, datastore.ErrConflict) || errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("re-verifying block %s of %q: changed while re-affirming; retrying at the next renewal: %w", b.Prefix, b.Network, err)
		}
		if err != nil {
			return fmt.Errorf("re-affirming block %s of %q: %w", b.Prefix, b.Network, err)
		}
		if err := m.l.ResumeBlock(b.Network, b.Prefix, b.Epoch); err != nil {
			return err
		}
		m.mu.Lock()
		m.owned[key] = ownedBlock{rec: rec, rev: rev}
		m.mu.Unlock()
	}
	// blocks the datastore gives the node that the ledger lacks (a crash between a
	// claim and its AddBlock)
	m.mu.Lock()
	nets := make([]string, 0, len(m.nets))
	for n := range m.nets {
		nets = append(nets, n)
	}
	m.mu.Unlock()
	for _, n := range nets {
		if err := m.adopt(ctx, n, func(p netip.Prefix) bool { return seen[want{n, p}] }); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.lapsed = false
	m.mu.Unlock()
	m.log.Info("blocks verified; allocation allowed")
	return nil
}

func (m *Manager) leaseID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease.ID
}

// lose drops a block the node no longer owns from the ledger and from its books.
func (m *Manager) lose(network string, p netip.Prefix, why string) {
	m.log.Warn("block lost", "network", network, "block", p.String(), "why", why)
	if err := m.l.LoseBlock(network, p); err != nil {
		m.log.Error("recording a lost block", "network", network, "block", p.String(), "err", err)
	}
	m.mu.Lock()
	delete(m.owned, BlockKey(network, p))
	delete(m.empty, BlockKey(network, p))
	m.mu.Unlock()
}

// adopt adds to the ledger the blocks of network that the datastore says the node
// owns and skip does not name.
func (m *Manager) adopt(ctx context.Context, network string, skip func(netip.Prefix) bool) error {
	kvs, _, err := m.listBlocks(ctx, BlocksPrefix(network))
	if err != nil {
		return fmt.Errorf("listing blocks of %q: %w", network, err)
	}
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			m.log.Warn("skipping a block record", "err", err)
			continue
		}
		if rec.Owner != m.opts.Node || skip(rec.CIDR) {
			continue
		}
		if err := m.l.AddBlock(network, rec.CIDR, rec.Epoch); err != nil {
			return err
		}
		m.mu.Lock()
		m.owned[kv.Key] = ownedBlock{rec: rec, rev: kv.Revision}
		m.mu.Unlock()
		m.log.Info("block adopted from the datastore", "network", network, "block", rec.CIDR.String(), "epoch", rec.Epoch)
	}
	return nil
}

// EnsureNetwork sets network up for cluster mode: its pool record in the datastore
// is created (once, by compare-and-swap) or checked against ranges and blockBits
// (ErrPoolMismatch when another node configured it otherwise), the ledger's pool is
// declared cluster-scoped, and blocks the datastore gives the node are adopted.
// Repeated calls with the same config return at once. When the datastore cannot be
// reached, a network the ledger already holds with the same config is accepted (the
// node keeps serving from its blocks).
func (m *Manager) EnsureNetwork(ctx context.Context, network string, ranges []pool.RangeSet, blockBits []int) error {
	want := PoolRecord{Network: network, Ranges: ranges, BlockBits: blockBits}
	m.mu.Lock()
	have, ok := m.nets[network]
	m.mu.Unlock()
	if ok {
		if !have.equal(want) {
			return fmt.Errorf("%w: network %q is set up with ranges %v and blocks /%v; this config has ranges %v and blocks /%v", ErrPoolMismatch, network, have.Ranges, have.BlockBits, ranges, blockBits)
		}
		return nil
	}
	if err := pool.Validate(ranges); err != nil {
		return err
	}
	if len(blockBits) != len(ranges) {
		return fmt.Errorf("%w: network %q: %d block sizes for %d range sets", ErrPoolMismatch, network, len(blockBits), len(ranges))
	}
	for i, set := range ranges {
		if err := set.CheckBlockBits(blockBits[i], "blockSize"); err != nil {
			return err
		}
	}
	err := m.ensurePoolRecord(ctx, want)
	if errors.Is(err, datastore.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		if p, perr := m.l.Pool(network); perr == nil && pool.Equal(p.Ranges, ranges) && len(m.l.Blocks(network)) > 0 {
			m.log.Warn("datastore unreachable; serving the network from the blocks the ledger holds", "network", network, "err", err)
			if err := m.l.DeclareCluster(network, ranges, blockBits); err != nil {
				return err
			}
			// The ledger's blocks of every network are verified at every renewal
			// after a lapse, this one's included: nothing more to do here.
			m.mu.Lock()
			m.nets[network] = want
			m.mu.Unlock()
			return nil
		}
	}
	if err != nil {
		return err
	}
	if err := m.l.DeclareCluster(network, ranges, blockBits); err != nil {
		return err
	}
	m.mu.Lock()
	m.nets[network] = want
	m.mu.Unlock()
	if !m.Provable() {
		return nil // adopted at the re-verification that follows the next renewal
	}
	held := map[netip.Prefix]bool{}
	for _, b := range m.l.Blocks(network) {
		held[b.Prefix] = true
	}
	return m.adopt(ctx, network, func(p netip.Prefix) bool { return held[p] })
}

func (m *Manager) ensurePoolRecord(ctx context.Context, want PoolRecord) error {
	val, err := json.Marshal(want)
	if err != nil {
		return err
	}
	key := PoolKey(want.Network)
	cctx, cancel := m.ctx(ctx)
	defer cancel()
	for range 3 {
		kv, err := m.ds.Get(cctx, key)
		m.note(err)
		if errors.Is(err, datastore.ErrNotFound) {
			_, err = m.ds.Create(cctx, key, val)
			m.note(err)
			if errors.Is(err, datastore.ErrExists) {
				continue // another node was first: compare with its record
			}
			if err == nil {
				m.log.Info("cluster pool created", "network", want.Network)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("reading the pool of %q: %w", want.Network, err)
		}
		var have PoolRecord
		if err := json.Unmarshal(kv.Value, &have); err != nil {
			return fmt.Errorf("datastore record %s: %v", key, err)
		}
		if !have.equal(want) {
			return fmt.Errorf("%w: network %q: the cluster's pool has ranges %v with blocks /%v, this node's config has ranges %v with blocks /%v; every node must use the same ranges and blockSize for a network name (fix this node's config, or use another network name)",
				ErrPoolMismatch, want.Network, pool.SetsString(have.Ranges), have.BlockBits, pool.SetsString(want.Ranges), want.BlockBits)
		}
		return nil
	}
	return fmt.Errorf("pool record %s keeps changing", key)
}

// Allocate allocates req from the node's blocks in the ledger; when a range set has
// no free address there (ledger.ErrNoBlockCapacity) it claims a block for that range
// set and retries. EnsureNetwork must have been called for the network. Errors wrap
// ErrFenced when the lease cannot be proven, and ledger.ErrPoolExhausted when no
// block is left to claim.
func (m *Manager) Allocate(ctx context.Context, req ledger.AllocateRequest) (ledger.Lease, bool, error) {
	m.mu.Lock()
	_, ok := m.nets[req.Key.Network]
	m.mu.Unlock()
	if !ok {
		return ledger.Lease{}, false, fmt.Errorf("%w: %q (EnsureNetwork first)", ErrUnknownNetwork, req.Key.Network)
	}
	ls, existed, err := m.l.Allocate(req)
	var ce *ledger.BlockCapacityError
	if !errors.As(err, &ce) {
		return ls, existed, err
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	for tries := 0; tries <= 2*len(m.nets[req.Key.Network].Ranges); tries++ {
		// another caller may have claimed a block while this one waited
		ls, existed, err = m.l.Allocate(req)
		if !errors.As(err, &ce) {
			return ls, existed, err
		}
		if cerr := m.claim(ctx, ce.Network, ce.Set); cerr != nil {
			return ledger.Lease{}, false, fmt.Errorf("%w (claiming a block: %w)", err, cerr)
		}
		m.counts.claims.Add(1)
	}
	return ls, existed, err
}

// Claim claims one block of network's range set for the node (exported for tests and
// tools; Allocate claims by itself).
func (m *Manager) Claim(ctx context.Context, network string, set int) (netip.Prefix, error) {
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	if err := m.claim(ctx, network, set); err != nil {
		return netip.Prefix{}, err
	}
	m.counts.claims.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	var newest ownedBlock
	for _, o := range m.owned {
		if o.rec.Network == network && o.rec.Set == set && o.rev > newest.rev {
			newest = o
		}
	}
	return newest.rec.CIDR, nil
}

// claim takes a free block (owner "") or creates a never-claimed one, by
// compare-and-swap, and adds it to the ledger. claimMu is held.
func (m *Manager) claim(ctx context.Context, network string, set int) error {
	if !m.Provable() {
		return fmt.Errorf("%w: node %s claims no block without a provable lease", ErrFenced, m.opts.Node)
	}
	m.mu.Lock()
	cfg, ok := m.nets[network]
	m.mu.Unlock()
	if !ok || set < 0 || set >= len(cfg.Ranges) {
		return fmt.Errorf("%w: %q range set %d", ErrUnknownNetwork, network, set)
	}
	// Candidates come from the watched cache; a claim that finds none there (or
	// whose every write lost because the cache was stale) lists afresh and tries
	// once more. Every write is a compare-and-swap either way.
	blocks, cached := m.cachedBlocks(network)
	if !cached {
		var err error
		if blocks, err = m.relist(ctx, network); err != nil {
			return err
		}
	}
	err := m.claimFrom(ctx, network, set, cfg, blocks)
	if cached && errors.Is(err, ErrNoFreeBlock) {
		if blocks, err = m.relist(ctx, network); err != nil {
			return err
		}
		err = m.claimFrom(ctx, network, set, cfg, blocks)
	}
	return err
}

// claimFrom claims a block of network's range set among blocks (the network's block
// records as last known): a free one, else a never-claimed prefix.
func (m *Manager) claimFrom(ctx context.Context, network string, set int, cfg PoolRecord, blocks []cachedBlock) error {
	cctx, cancel := m.ctx(ctx)
	defer cancel()
	existing := map[netip.Prefix]bool{}
	var free []datastore.KV
	var freeRecs []BlockRecord
	for _, b := range blocks {
		kv, rec := b.kv, b.rec
		if b.err != nil {
			m.log.Warn("skipping a block record", "err", b.err)
			continue
		}
		existing[rec.CIDR] = true
		if rec.Owner == "" && rec.Set == set {
			free = append(free, kv)
			freeRecs = append(freeRecs, rec)
		}
	}
	lid := m.leaseID()
	// 1. a free block, starting at a place of this node's own among them (so that
	// nodes claiming at once do not all race for the same one)
	spread := m.spread(network, set)
	for j := range free {
		i := (j + int(spread%uint64(len(free)))) % len(free)
		kv, rec := free[i], freeRecs[i]
		rec.Owner, rec.Holder, rec.Epoch, rec.Lease = m.opts.Node, m.opts.Holder, rec.Epoch+1, lid
		val, _ := json.Marshal(rec)
		rev, err := m.ds.Update(cctx, kv.Key, val, kv.Revision)
		m.note(err)
		if errors.Is(err, datastore.ErrConflict) || errors.Is(err, datastore.ErrNotFound) {
			continue // another node was first
		}
		if err != nil {
			if rec, rev, ok := m.settle(ctx, kv.Key, rec); ok {
				return m.took(rec, rev)
			}
			return fmt.Errorf("claiming block %s of %q: %w", rec.CIDR, network, err)
		}
		return m.took(rec, rev)
	}
	// 2. a never-claimed block, in address order; in a range set of many blocks from
	// a place of this node's own, then from the start (100 nodes claiming at once
	// from the first block made ~50 failed creates each: spread, they rarely meet)
	ranges := cfg.Ranges[set]
	bits := cfg.BlockBits[set]
	// each pass searches from its start up to (not into) the block holding its stop
	type pass struct{ from, stop netip.Addr }
	passes := []pass{{}}
	if hostBits := ranges[0].Subnet.Addr().BitLen() - bits; hostBits < 64 && ranges.Size()>>hostBits > 64 {
		if a, ok := ranges.Addr(spread % ranges.Size()); ok {
			passes = []pass{{from: a}, {stop: a}}
		}
	}
	tries := 0
	for _, ps := range passes {
		from := ps.from
		for ; tries < 2*(len(existing)+64); tries++ {
			p, ok := ranges.NextBlock(bits, from)
			if !ok || ps.stop.IsValid() && !pool.LastAddr(p).Less(ps.stop) {
				break
			}
			from = pool.LastAddr(p).Next()
			if existing[p] {
				continue
			}
			rec := BlockRecord{Network: network, CIDR: p, Set: set, Owner: m.opts.Node, Holder: m.opts.Holder, Epoch: 1, Lease: lid}
			val, _ := json.Marshal(rec)
			key := BlockKey(network, p)
			rev, err := m.ds.Create(cctx, key, val)
			m.note(err)
			if errors.Is(err, datastore.ErrExists) {
				existing[p] = true
				continue
			}
			if err != nil {
				if rec, rev, ok := m.settle(ctx, key, rec); ok {
					return m.took(rec, rev)
				}
				return fmt.Errorf("claiming block %s of %q: %w", p, network, err)
			}
			return m.took(rec, rev)
			// (from is past p; a lost race moves on to the next block)
		}
	}
	return fmt.Errorf("%w: %w: network %q range set %d (%s): every /%d block is owned by a node", ErrNoFreeBlock, ledger.ErrPoolExhausted, network, set, ranges.String(), bits)
}

// spread is where this node starts looking for a block of network's range set: a
// hash of the node name, the network and the set.
func (m *Manager) spread(network string, set int) uint64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "%s\x00%s\x00%d", m.opts.Node, network, set)
	return h.Sum64()
}

// settle re-reads a block after a write whose outcome is unknown: ok when the write
// took effect (the record is the one written).
func (m *Manager) settle(ctx context.Context, key string, wrote BlockRecord) (BlockRecord, int64, bool) {
	cctx, cancel := m.ctx(ctx)
	defer cancel()
	kv, err := m.ds.Get(cctx, key)
	m.note(err)
	if err != nil {
		return BlockRecord{}, 0, false
	}
	rec, err := decodeBlock(kv)
	if err != nil || rec != wrote {
		return BlockRecord{}, 0, false
	}
	return rec, kv.Revision, true
}

// took records a claimed block in the ledger and the manager's books.
func (m *Manager) took(rec BlockRecord, rev int64) error {
	if err := m.l.AddBlock(rec.Network, rec.CIDR, rec.Epoch); err != nil {
		return fmt.Errorf("adding claimed block %s to the ledger: %w", rec.CIDR, err)
	}
	m.mu.Lock()
	m.owned[BlockKey(rec.Network, rec.CIDR)] = ownedBlock{rec: rec, rev: rev}
	m.mu.Unlock()
	if val, err := json.Marshal(rec); err == nil {
		m.cacheWrite(rec.Network, BlockKey(rec.Network, rec.CIDR), val, rev)
	}
	m.log.Info("block claimed", "network", rec.Network, "block", rec.CIDR.String(), "epoch", rec.Epoch)
	return nil
}

// NodeGone tells the manager that node's Node object was deleted (Kubernetes): its
// blocks are reclaimed as soon as its lease has run out, without the quarantine,
// unless NodeBack says the Node exists again before that.
func (m *Manager) NodeGone(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gone[node] = true
}

// NodeBack tells the manager that a Node object of that name exists (created, or
// registered again after a deletion): a deletion it was told of no longer counts,
// and the node's blocks wait out the quarantine after its lease as any live node's
// do. A kubelet re-registers its deleted Node while it and its pods still run; an
// agent that is down then (restarting, or cut off) must not lose its blocks at the
// lease's end, with those pods still using their addresses.
func (m *Manager) NodeBack(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gone[node] {
		delete(m.gone, node)
		m.log.Info("Node registered again: its blocks wait out the quarantine again", "node", node)
	}
}

// Sweep runs the periodic duties: suspends the blocks when the lease is no longer
// provable; gives back blocks that stayed empty past the grace (keeping the last one
// per range set); reclaims the blocks of nodes whose lease stayed expired past the
// quarantine.
func (m *Manager) Sweep(ctx context.Context) error {
	m.stepMu.Lock()
	defer m.stepMu.Unlock()
	m.fence()
	var errs []error
	if m.Provable() {
		errs = append(errs, m.handBack(ctx))
	}
	errs = append(errs, m.reclaim(ctx))
	return errors.Join(errs...)
}

// handBack gives back blocks seen empty on two observations at least Grace apart
// with nothing allocated in between; the node keeps its last active block of every
// range set.
func (m *Manager) handBack(ctx context.Context) error {
	now := m.mono()
	type setKey struct {
		network string
		set     int
	}
	active := map[setKey]int{}
	blocks := m.l.Blocks("")
	for _, b := range blocks {
		if b.State == ledger.BlockActive {
			active[setKey{b.Network, b.Set}]++
		}
	}
	var errs []error
	for _, b := range blocks {
		key := BlockKey(b.Network, b.Prefix)
		if b.State != ledger.BlockActive || b.Used > 0 {
			m.mu.Lock()
			delete(m.empty, key)
			m.mu.Unlock()
			continue
		}
		m.mu.Lock()
		o, seen := m.empty[key]
		if !seen || o.gen != b.Allocations {
			m.empty[key] = emptyObs{since: now, gen: b.Allocations}
			m.mu.Unlock()
			continue
		}
		own, ok := m.owned[key]
		m.mu.Unlock()
		if now-o.since < m.opts.Grace || active[setKey{b.Network, b.Set}] <= 1 || !ok {
			continue
		}
		if err := m.giveBack(ctx, key, b, own); err != nil {
			errs = append(errs, err)
			continue
		}
		active[setKey{b.Network, b.Set}]--
	}
	return errors.Join(errs...)
}

func (m *Manager) giveBack(ctx context.Context, key string, b ledger.BlockStatus, own ownedBlock) error {
	// Out of the ledger first: from here nothing can be allocated in it. A lease
	// taken since the observation makes this fail, and the block is kept.
	if err := m.l.RemoveBlock(b.Network, b.Prefix); err != nil {
		m.mu.Lock()
		delete(m.empty, key)
		m.mu.Unlock()
		if errors.Is(err, ledger.ErrBlockInUse) {
			return nil
		}
		return err
	}
	rec := own.rec
	rec.Owner, rec.Holder, rec.Lease, rec.Epoch = "", "", "", rec.Epoch+1
	val, _ := json.Marshal(rec)
	cctx, cancel := m.ctx(ctx)
	rev, err := m.ds.Update(cctx, key, val, own.rev)
	cancel()
	m.note(err)
	m.mu.Lock()
	delete(m.empty, key)
	delete(m.owned, key)
	m.mu.Unlock()
	if err == nil {
		m.cacheWrite(b.Network, key, val, rev)
		m.log.Info("empty block given back", "network", b.Network, "block", b.Prefix.String(), "epoch", rec.Epoch)
		m.counts.handBacks.Add(1)
		return nil
	}
	if _, _, ok := m.settle(ctx, key, rec); ok {
		m.counts.handBacks.Add(1)
		return nil
	}
	// Still ours (the write failed) or changed meanwhile: re-adopt it when the
	// datastore says it is the node's at the same epoch; otherwise it is gone.
	cctx, cancel = m.ctx(ctx)
	kv, gerr := m.ds.Get(cctx, key)
	cancel()
	if gerr == nil {
		if cur, derr := decodeBlock(kv); derr == nil && cur.Owner == m.opts.Node && cur.Epoch == b.Epoch {
			if aerr := m.l.AddBlock(b.Network, b.Prefix, b.Epoch); aerr != nil {
				return aerr
			}
			m.mu.Lock()
			m.owned[key] = ownedBlock{rec: cur, rev: kv.Revision}
			m.mu.Unlock()
			return fmt.Errorf("giving back block %s of %q failed; kept: %w", b.Prefix, b.Network, err)
		}
		return nil
	}
	// Unknown: keep it out of the ledger; the sweep re-adopts it if the datastore
	// still gives it to the node.
	return fmt.Errorf("giving back block %s of %q: outcome unknown: %w", b.Prefix, b.Network, err)
}

// reclaim frees the blocks of dead nodes. It reads the blocks before the leases, so
// that an owner which renews and re-affirms its blocks after that read makes the
// compare-and-swap fail. It also re-adopts blocks the datastore gives this node that
// its ledger lacks (a give-back whose outcome was unknown).
//
// A sweep every third of the lease TTL on every node must not LIST every block of
// the cluster each time (on Kubernetes, custom resources read from etcd on each
// unpaged LIST): the blocks of the networks set up here come from the claims'
// watched copies (listed, and watched from then on, where there is none), and every
// network's blocks are listed only once a quarantine, for the networks this node has
// not set up (their dead owners' blocks are freed at most a quarantine later). A
// watched copy keeps the ordering above: whatever it holds was read from the
// datastore before the lease list that follows, and a record older than the
// datastore's makes the compare-and-swap fail, never succeed wrongly.
func (m *Manager) reclaim(ctx context.Context) error {
	cctx, cancel := m.ctx(ctx)
	defer cancel()
	var kvs []datastore.KV
	var err error
	if start := m.mono(); !m.listed || start-m.fullList >= m.opts.Quarantine {
		if kvs, _, err = m.listBlocks(ctx, BlocksPrefix("")); err != nil {
			return fmt.Errorf("listing blocks: %w", err)
		}
		m.fullList, m.listed = start, true
	} else if kvs, err = m.knownBlocks(ctx); err != nil {
		return err
	}
	leases, err := m.ds.Leases().List(cctx)
	m.note(err)
	if err != nil {
		return fmt.Errorf("listing node leases: %w", err)
	}
	now := m.mono()
	m.mu.Lock()
	if m.blind {
		// This manager could not reach the datastore for a while. If nobody could
		// (the datastore was away), nobody could renew either, so an unchanged lease
		// is no evidence of death: the expiry and the quarantine count again from
		// now, over time the owners can renew in.
		m.log.Info("node leases read again after a datastore failure; restarting every expiry clock")
		for _, o := range m.obs {
			o.seen, o.goneSince = now, now
		}
		m.blind = false
	}
	live := map[string]bool{}
	for _, l := range leases {
		live[l.Node] = true
		o := m.obs[l.Node]
		if o == nil || o.gone || o.rev != l.Revision {
			m.obs[l.Node] = &leaseObs{rev: l.Revision, seen: now, ttl: l.TTL}
		}
	}
	for n, o := range m.obs {
		if !live[n] && !o.gone {
			o.gone, o.goneSince = true, now
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil || rec.Owner == "" {
			continue
		}
		if rec.Owner == m.opts.Node {
			m.mu.Lock()
			_, net := m.nets[rec.Network]
			_, own := m.owned[kv.Key]
			m.mu.Unlock()
			if net && !own && m.Provable() {
				errs = append(errs, m.readopt(cctx, kv.Key))
			}
			continue
		}
		m.mu.Lock()
		o := m.obs[rec.Owner]
		if o == nil { // an owner without a lease since this manager looks
			o = &leaseObs{gone: true, goneSince: now}
			m.obs[rec.Owner] = o
		}
		expiredAt := o.seen + o.ttl
		if o.gone {
			expiredAt = o.goneSince
		}
		wait := m.opts.Quarantine
		if m.gone[rec.Owner] {
			wait = 0
		}
		due := now >= expiredAt+wait
		m.mu.Unlock()
		if !due {
			continue
		}
		prev := rec
		rec.Owner, rec.Holder, rec.Lease, rec.Epoch = "", "", "", rec.Epoch+1
		val, _ := json.Marshal(rec)
		rev, err := m.ds.Update(cctx, kv.Key, val, kv.Revision)
		m.note(err)
		switch {
		case err == nil:
			m.cacheWrite(rec.Network, kv.Key, val, rev)
			m.counts.reclaims.Add(1)
			m.log.Warn("dead node's block reclaimed", "network", rec.Network, "block", rec.CIDR.String(), "owner", prev.Owner, "epoch", rec.Epoch)
		case errors.Is(err, datastore.ErrConflict), errors.Is(err, datastore.ErrNotFound):
			// another agent reclaimed it first, or the owner re-affirmed it
		default:
			errs = append(errs, fmt.Errorf("reclaiming block %s of %q from %s: %w", rec.CIDR, rec.Network, prev.Owner, err))
		}
	}
	return errors.Join(errs...)
}

// readopt takes back into the ledger a block that the records read show this node
// owning and that the ledger lacks (a give-back whose outcome was unknown), once a
// fresh read confirms it: the records may come from a watched copy, older than the
// datastore. A copy that had not yet seen another node reclaim the block (epoch+1,
// no owner) showed it still ours at the old epoch; adopting that handed out
// addresses from a block that was free for anyone to claim (TestChaos caught it).
func (m *Manager) readopt(ctx context.Context, key string) error {
	kv, err := m.ds.Get(ctx, key)
	m.note(err)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("reading block %s before re-adopting it: %w", key, err)
	}
	rec, err := decodeBlock(kv)
	if err != nil || rec.Owner != m.opts.Node {
		return nil
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	m.mu.Lock()
	_, own := m.owned[key]
	m.mu.Unlock()
	if own {
		return nil
	}
	return m.took(rec, kv.Revision)
}

// listBlocks sends one LIST of the block records under prefix to the datastore,
// counted in BlockLists (ipledger_block_lists_total).
func (m *Manager) listBlocks(ctx context.Context, prefix string) ([]datastore.KV, int64, error) {
	m.counts.blockLists.Add(1)
	cctx, cancel := m.ctx(ctx)
	defer cancel()
	kvs, rev, err := m.ds.List(cctx, prefix)
	m.note(err)
	return kvs, rev, err
}

// knownBlocks returns the block records of every network set up on this node, from
// each network's watched copy, listing (and starting its watch) where it has none.
func (m *Manager) knownBlocks(ctx context.Context) ([]datastore.KV, error) {
	m.mu.Lock()
	nets := make([]string, 0, len(m.nets))
	for n := range m.nets {
		nets = append(nets, n)
	}
	m.mu.Unlock()
	sort.Strings(nets)
	var kvs []datastore.KV
	for _, n := range nets {
		blocks, ok := m.cachedBlocks(n)
		if !ok {
			var err error
			m.claimMu.Lock()
			blocks, err = m.relist(ctx, n)
			m.claimMu.Unlock()
			if err != nil {
				return nil, err
			}
		}
		for _, b := range blocks {
			kvs = append(kvs, b.kv)
		}
	}
	return kvs, nil
}

// Status is the node's cluster-mode health for one network (CNI STATUS).
type Status struct {
	Network   string `json:"network"`
	Provable  bool   `json:"provable"`  // the node lease is provable: its blocks hand out addresses
	Reachable bool   `json:"reachable"` // the last datastore call succeeded
	Available bool   `json:"available"` // an ADD can be served from the node's blocks without a new one
	// Degraded: no address can be handed out without claiming a new block, and no
	// block can be claimed now (datastore unreachable or lease not provable).
	Degraded bool   `json:"degraded"`
	Blocks   int    `json:"blocks"` // active blocks
	Reason   string `json:"reason,omitempty"`
}

// Status reports the network's state for the agent's STATUS.
func (m *Manager) Status(network string) Status {
	st := Status{Network: network, Provable: m.Provable()}
	m.mu.Lock()
	st.Reachable = m.reachable
	lastErr := m.lastErr
	_, known := m.nets[network]
	m.mu.Unlock()
	for _, b := range m.l.Blocks(network) {
		if b.State == ledger.BlockActive {
			st.Blocks++
		}
	}
	if p, err := m.l.Pool(network); err == nil {
		st.Available = p.Available && st.Blocks > 0 && st.Provable
	}
	switch {
	case !known:
		st.Degraded, st.Reason = true, "network not set up for cluster mode yet"
	case st.Available:
	case !st.Provable:
		st.Degraded, st.Reason = true, "node lease not provable: no allocation until the datastore answers"
	case !st.Reachable:
		st.Degraded, st.Reason = true, fmt.Sprintf("no free address in the node's blocks and the datastore is unreachable (%v)", lastErr)
	}
	return st
}

// BlockView is one block of the cluster as `ipledgerctl blocks` shows it.
type BlockView struct {
	Network string       `json:"network"`
	CIDR    netip.Prefix `json:"cidr"`
	Owner   string       `json:"owner"`
	Epoch   uint64       `json:"epoch"`
	// Local: the block is this node's; State, Used, Free and Usable come from its ledger.
	Local  bool              `json:"local"`
	State  ledger.BlockState `json:"state,omitempty"`
	Used   int               `json:"used"`
	Free   int               `json:"free"`
	Usable uint64            `json:"usable"`
}

// Blocks lists every block in the datastore, the node's own with their ledger
// counts, and blocks the ledger holds that the datastore does not give the node
// (lost ones still holding leases), by network and address.
func (m *Manager) Blocks(ctx context.Context) ([]BlockView, error) {
	kvs, _, err := m.listBlocks(ctx, BlocksPrefix(""))
	if err != nil {
		return nil, fmt.Errorf("listing blocks: %w", err)
	}
	type k struct {
		n string
		p netip.Prefix
	}
	local := map[k]ledger.BlockStatus{}
	for _, b := range m.l.Blocks("") {
		local[k{b.Network, b.Prefix}] = b
	}
	m.mu.Lock()
	nets := make(map[string]PoolRecord, len(m.nets))
	for n, p := range m.nets {
		nets[n] = p
	}
	m.mu.Unlock()
	var out []BlockView
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			continue
		}
		v := BlockView{Network: rec.Network, CIDR: rec.CIDR, Owner: rec.Owner, Epoch: rec.Epoch}
		if b, ok := local[k{rec.Network, rec.CIDR}]; ok && rec.Owner == m.opts.Node {
			v.Local, v.State, v.Used, v.Free, v.Usable = true, b.State, b.Used, b.Free, b.Usable
			delete(local, k{rec.Network, rec.CIDR})
		} else if p := nets[rec.Network]; rec.Set >= 0 && rec.Set < len(p.Ranges) {
			v.Usable = p.Ranges[rec.Set].Clip(rec.CIDR).Usable()
		}
		out = append(out, v)
	}
	for _, b := range local {
		out = append(out, BlockView{Network: b.Network, CIDR: b.Prefix, Owner: m.opts.Node + " (ledger only)", Epoch: b.Epoch, Local: true, State: b.State, Used: b.Used, Free: b.Free, Usable: b.Usable})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Network != out[j].Network {
			return out[i].Network < out[j].Network
		}
		if c := out[i].CIDR.Addr().Compare(out[j].CIDR.Addr()); c != 0 {
			return c < 0
		}
		return out[i].Owner < out[j].Owner
	})
	return out, nil
}
