package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// claimWanted claims, for a pod's requested addresses (ipledger.io/ip), the block
// of each that no block of the node holds: a never-claimed or free block by one
// compare-and-swap; one another node owns is refused (ErrBlockOwned, with
// ledger.ErrAddressUnavailable), naming the owner. An address outside every range
// set is left to the ledger, which refuses it. claimMu is held.
func (m *Manager) claimWanted(ctx context.Context, network string, cfg PoolRecord, want []netip.Addr) error {
	have := map[netip.Prefix]bool{}
	for _, b := range m.l.Blocks(network) {
		have[b.Prefix] = true
	}
	for _, a := range want {
		set := -1
		for i, rs := range cfg.Ranges {
			if rs.Contains(a) {
				set = i
			}
		}
		if set < 0 {
			continue
		}
		p, err := a.Prefix(cfg.BlockBits[set])
		if err != nil || have[p] {
			continue
		}
		if err := m.claimBlock(ctx, network, set, p, a); err != nil {
			return err
		}
		m.counts.claims.Add(1)
	}
	return nil
}

// claimBlock takes block p of network's range set for the node: created if it was
// never claimed, taken if free; refused if another node owns it.
func (m *Manager) claimBlock(ctx context.Context, network string, set int, p netip.Prefix, a netip.Addr) error {
	if !m.Provable() {
		return fmt.Errorf("%w: node %s claims no block without a provable lease", ErrFenced, m.opts.Node)
	}
	key := BlockKey(network, p)
	lid := m.leaseID()
	for range 3 {
		var kv datastore.KV
		err := m.call(ctx, func(ctx context.Context) (err error) {
			kv, err = m.ds.Get(ctx, key)
			return err
		})
		m.note(err)
		var rec BlockRecord
		var rev int64
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			rec = BlockRecord{Network: network, CIDR: p, Set: set, Owner: m.opts.Node, Holder: m.opts.Holder, Epoch: 1, Lease: lid}
			val, _ := json.Marshal(rec)
			err = m.call(ctx, func(ctx context.Context) (err error) {
				rev, err = m.ds.Create(ctx, key, val)
				return err
			})
			m.note(err)
			if errors.Is(err, datastore.ErrExists) {
				continue // another node was first: read what it wrote
			}
		case err != nil:
			return fmt.Errorf("reading block %s of %q: %w", p, network, err)
		default:
			if rec, err = decodeBlock(kv); err != nil {
				return err
			}
			if rec.Owner == m.opts.Node {
				return nil // the node's already; the ledger decides on its state
			}
			if rec.Owner != "" {
				return fmt.Errorf("%w: %w: %s is in block %s, which node %s owns; ask for an address of a block this node owns, or run the pod on node %s", ledger.ErrAddressUnavailable, ErrBlockOwned, a, p, rec.Owner, rec.Owner)
			}
			rec.Owner, rec.Holder, rec.Epoch, rec.Lease = m.opts.Node, m.opts.Holder, rec.Epoch+1, lid
			val, _ := json.Marshal(rec)
			err = m.call(ctx, func(ctx context.Context) (err error) {
				rev, err = m.ds.Update(ctx, key, val, kv.Revision)
				return err
			})
			m.note(err)
			if errors.Is(err, datastore.ErrConflict) || errors.Is(err, datastore.ErrNotFound) {
				continue // changed meanwhile: read again
			}
		}
		if err != nil {
			if rec, rev, ok := m.settle(ctx, key, rec); ok {
				return m.took(rec, rev)
			}
			return fmt.Errorf("claiming block %s of %q for %s: %w", p, network, a, err)
		}
		return m.took(rec, rev)
	}
	return fmt.Errorf("claiming block %s of %q for %s: the record keeps changing", p, network, a)
}
