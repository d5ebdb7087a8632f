package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/pool"
)

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
		if err := m.l.AddBlock(network, rec.CIDR, rec.Epoch, rec.kept()...); err != nil {
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
	for range 3 {
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
