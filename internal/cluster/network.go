package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/pool"
)

// adopt adds to the ledger the blocks of network that the datastore says the node
// owns and skip does not name.
func (m *Manager) adopt(ctx context.Context, network string, skip func(netip.Prefix) bool) error {
	// The list (re)starts the network's watched copy of its blocks: the node's
	// first claim reads it instead of listing them again.
	blocks, err := m.relist(ctx, network)
	if err != nil {
		return err
	}
	for _, b := range blocks {
		kv, rec := b.kv, b.rec
		if b.err != nil {
			m.log.Warn("skipping a block record", "err", b.err)
			continue
		}
		if rec.Owner != m.opts.Node || skip(rec.CIDR) {
			continue
		}
		if err := m.l.AddBlock(network, rec.CIDR, rec.Epoch, rec.kept()...); err != nil {
			return err
		}
		m.mu.Lock()
		m.owned[kv.Key] = ownedBlock{rec: rec, rev: kv.Revision}
		m.mu.Unlock()
		m.log.Info("block adopted from the datastore", "network", network, "block", rec.CIDR.String(), "epoch", rec.Epoch)
		m.drainRemoved(network, rec.CIDR)
	}
	return nil
}

// EnsureNetwork sets network up for cluster mode from its conflist's ranges and
// blockBits. The datastore's record of the network's default pool is the truth:
// it is created (once, by compare-and-swap) from the first node's conflist; a
// conflist that adds a range extends it (by compare-and-swap, so two nodes' ranges
// cannot lose one another), unless the range is in the record's drained list; a
// conflist that lacks a range of the record changes nothing (draining is an
// operator's edit of the record). A block size, or a number or family of range
// sets, other than the record's is refused (ErrPoolMismatch). The node serves the
// record's ranges: its ledger pool is declared cluster-scoped (or given the
// record's ranges in place), and blocks the datastore gives the node are adopted.
// Repeated calls with a config the served record covers return at once. When the
// datastore cannot be reached, a network the ledger already holds with blocks and
// ranges covering the config is served as it is.
func (m *Manager) EnsureNetwork(ctx context.Context, network string, ranges []pool.RangeSet, blockBits []int) error {
	conf := PoolRecord{Network: network, Ranges: ranges, BlockBits: blockBits}
	m.mu.Lock()
	have, ok := m.nets[network]
	m.mu.Unlock()
	if ok && have.covers(conf) {
		return nil
	}
	// One set-up at a time: the burst of ADDs that reaches a network not set up
	// yet (a node's first pods) waits for the first one's datastore calls instead
	// of each sending its own read of the pool and LIST of its blocks.
	m.setupMu.Lock()
	defer m.setupMu.Unlock()
	m.mu.Lock()
	have, ok = m.nets[network]
	m.mu.Unlock()
	if ok && have.covers(conf) {
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
	rec, err := m.ensurePoolRecord(ctx, conf)
	if errors.Is(err, datastore.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		if ok {
			m.log.Warn("datastore unreachable; serving the network with the ranges it has", "network", network, "err", err)
			return nil
		}
		if p, perr := m.l.Pool(network); perr == nil && slices.Equal(p.BlockBits, blockBits) && (PoolRecord{Network: network, Ranges: p.Ranges, BlockBits: p.BlockBits}).covers(conf) && len(m.l.Blocks(network)) > 0 {
			m.log.Warn("datastore unreachable; serving the network from the blocks the ledger holds", "network", network, "err", err)
			// The ledger's blocks of every network are verified at every renewal
			// after a lapse, this one's included: nothing more to do here.
			m.mu.Lock()
			m.nets[network] = PoolRecord{Network: network, Ranges: p.Ranges, BlockBits: p.BlockBits}
			m.mu.Unlock()
			return nil
		}
	}
	if err != nil {
		return err
	}
	if ok {
		return m.followRecord(ctx, network, rec, nil)
	}
	return m.setUp(ctx, network, rec)
}

// setUp serves pool record rec on this node for the first time since the start:
// the ledger's pool fitted to it, then the blocks the datastore gives the node
// adopted.
func (m *Manager) setUp(ctx context.Context, network string, rec PoolRecord) error {
	if err := m.fitLedger(network, rec); err != nil {
		return err
	}
	m.mu.Lock()
	m.nets[network] = rec
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

// ensurePoolRecord returns the datastore's record of network's default pool,
// created from conf when there is none, extended by conf's ranges it lacks (not
// those it lists drained) by compare-and-swap.
func (m *Manager) ensurePoolRecord(ctx context.Context, conf PoolRecord) (PoolRecord, error) {
	val, err := json.Marshal(conf)
	if err != nil {
		return PoolRecord{}, err
	}
	key := PoolKey(conf.Network)
	for range 8 {
		var kv datastore.KV
		err := m.call(ctx, func(ctx context.Context) (err error) {
			kv, err = m.ds.Get(ctx, key)
			return err
		})
		m.note(err)
		if errors.Is(err, datastore.ErrNotFound) {
			err = m.call(ctx, func(ctx context.Context) (err error) {
				_, err = m.ds.Create(ctx, key, val)
				return err
			})
			m.note(err)
			if errors.Is(err, datastore.ErrExists) {
				continue // another node was first: compare with its record
			}
			if err == nil {
				m.log.Info("cluster pool created", "network", conf.Network)
			}
			return conf, err
		}
		if err != nil {
			return PoolRecord{}, fmt.Errorf("reading the pool of %q: %w", conf.Network, err)
		}
		var probe struct {
			Network string `json:"network"`
		}
		if err := json.Unmarshal(kv.Value, &probe); err != nil {
			return PoolRecord{}, fmt.Errorf("datastore record %s: %v", key, err)
		}
		if probe.Network != conf.Network {
			return PoolRecord{}, fmt.Errorf("%w: network %q: the datastore's record %s is an IPPool, not this network's default pool; give the network or the IPPool another name", ErrPoolMismatch, conf.Network, key)
		}
		have, err := decodePoolRecord(kv.Value)
		if err != nil {
			return PoolRecord{}, fmt.Errorf("%w: network %q: datastore record %s: %v; fix the record (kubectl edit ippool %s)", ErrBadPool, conf.Network, key, err, EncodeName(conf.Network))
		}
		merged, err := have.extend(conf)
		if err != nil {
			return PoolRecord{}, err
		}
		if merged.equal(have) {
			return have, nil
		}
		others, err := m.otherPools(ctx, conf.Network)
		if err != nil {
			return PoolRecord{}, err
		}
		blocks, err := m.blockCount(ctx, conf.Network)
		if err != nil {
			return PoolRecord{}, err
		}
		if err := checkChange(conf.Network, false, have, merged, blocks, others); err != nil {
			// the conflist's range cannot join the pool: the node serves the record
			m.setRefused(conf.Network, fmt.Errorf("this node's conflist adds ranges the pool cannot take: %w", err))
			m.log.Warn("the conflist's ranges not added to the pool; serving the datastore's", "network", conf.Network, "err", err)
			return have, nil
		}
		mval, err := json.Marshal(merged)
		if err != nil {
			return PoolRecord{}, err
		}
		err = m.call(ctx, func(ctx context.Context) (err error) {
			_, err = m.ds.Update(ctx, key, mval, kv.Revision)
			return err
		})
		m.note(err)
		if errors.Is(err, datastore.ErrConflict) || errors.Is(err, datastore.ErrNotFound) {
			continue // another writer was first: extend its record
		}
		if err != nil {
			return PoolRecord{}, fmt.Errorf("extending the pool of %q: %w", conf.Network, err)
		}
		m.log.Info("cluster pool extended by this node's conflist", "network", conf.Network, "ranges", pool.SetsString(merged.Ranges))
		return merged, nil
	}
	return PoolRecord{}, fmt.Errorf("pool record %s keeps changing", key)
}
