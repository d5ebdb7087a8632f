package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Allocate allocates req from the node's blocks in the ledger; when a range set has
// no free address there (ledger.ErrNoBlockCapacity) it claims a block for that range
// set and retries. EnsureNetwork must have been called for the network. Errors wrap
// ErrFenced when the lease cannot be proven, and ledger.ErrPoolExhausted when no
// block is left to claim.
func (m *Manager) Allocate(ctx context.Context, req ledger.AllocateRequest) (ledger.Lease, bool, error) {
	network := req.Key.Network
	if req.Pool != "" {
		network = req.Pool // a named pool (EnsurePool)
	}
	m.mu.Lock()
	cfg, ok := m.nets[network]
	m.mu.Unlock()
	if !ok {
		return ledger.Lease{}, false, fmt.Errorf("%w: %q (EnsureNetwork or EnsurePool first)", ErrUnknownNetwork, network)
	}
	// The pool exists (EnsureNetwork, EnsurePool) and its ranges follow its record,
	// not the request's config: a lease's idempotent ADD and a new allocation both
	// use the pool as it is.
	req.Ranges = nil
	if _, held := m.l.Lease(req.Key); !held && len(req.Want) > 0 && !req.Sticky {
		// a pod's own address outside the node's blocks: its block first
		m.claimMu.Lock()
		err := m.claimWanted(ctx, network, cfg, req.Want)
		m.claimMu.Unlock()
		if err != nil {
			return ledger.Lease{}, false, err
		}
	}
	ls, existed, err := m.l.Allocate(req)
	var ce *ledger.BlockCapacityError
	if !errors.As(err, &ce) {
		if err == nil && !existed {
			m.wantAhead(network)
		}
		return ls, existed, err
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	for tries := 0; tries <= 2*len(cfg.Ranges); tries++ {
		// another caller may have claimed a block while this one waited
		ls, existed, err = m.l.Allocate(req)
		if !errors.As(err, &ce) {
			if err == nil && !existed {
				m.wantAhead(network)
			}
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
		// a free block of a range removed from the pool is never claimed again
		if rec.Owner == "" && rec.Set == set && cfg.Ranges[set].Clip(rec.CIDR).Usable() > 0 {
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
		var rev int64
		err := m.call(ctx, func(ctx context.Context) (err error) {
			rev, err = m.ds.Update(ctx, kv.Key, val, kv.Revision)
			return err
		})
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
	// a place of this node's own, then from the start (nodes claiming at once, all
	// from the first block, would each fail a create on every block the ones ahead
	// of it took; spread, they rarely meet)
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
			var rev int64
			err := m.call(ctx, func(ctx context.Context) (err error) {
				rev, err = m.ds.Create(ctx, key, val)
				return err
			})
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
	var kv datastore.KV
	err := m.call(ctx, func(ctx context.Context) (err error) {
		kv, err = m.ds.Get(ctx, key)
		return err
	})
	m.note(err)
	if err != nil {
		return BlockRecord{}, 0, false
	}
	rec, err := decodeBlock(kv)
	if err != nil || !rec.equal(wrote) {
		return BlockRecord{}, 0, false
	}
	return rec, kv.Revision, true
}

// took records a claimed block in the ledger and the manager's books.
func (m *Manager) took(rec BlockRecord, rev int64) error {
	if err := m.l.AddBlock(rec.Network, rec.CIDR, rec.Epoch, rec.kept()...); err != nil {
		return fmt.Errorf("adding claimed block %s to the ledger: %w", rec.CIDR, err)
	}
	m.mu.Lock()
	m.owned[BlockKey(rec.Network, rec.CIDR)] = ownedBlock{rec: rec, rev: rev}
	m.mu.Unlock()
	if val, err := json.Marshal(rec); err == nil {
		m.cacheWrite(rec.Network, BlockKey(rec.Network, rec.CIDR), val, rev)
	}
	m.log.Info("block claimed", "network", rec.Network, "block", rec.CIDR.String(), "epoch", rec.Epoch)
	m.drainRemoved(rec.Network, rec.CIDR)
	return nil
}

// drainRemoved drains the ledger's block p of network when the pool's record no
// longer holds its range (a block re-adopted or re-taken after its range left).
func (m *Manager) drainRemoved(network string, p netip.Prefix) {
	m.mu.Lock()
	cfg, ok := m.nets[network]
	m.mu.Unlock()
	if !ok {
		return
	}
	for _, b := range m.l.Blocks(network) {
		if b.Prefix == p {
			m.drainOutside(cfg, b)
		}
	}
}
