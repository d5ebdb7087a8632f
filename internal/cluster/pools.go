package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
)

// PoolRanges is the subnet of every range of every network's pool record, those
// of networks this node has not set up included, and every block record outside
// them (a block of a range removed from its pool, draining): the cluster's pod
// ranges, claimed or not. The node network masquerades nothing inside them, so a pod in a block
// claimed a moment ago (by a node whose claim this node has not yet seen) keeps
// its address towards every other pod. An error means "unknown", never "none".
func (m *Manager) PoolRanges(ctx context.Context) ([]netip.Prefix, error) {
	var out []netip.Prefix
	err := m.call(ctx, func(ctx context.Context) error {
		kvs, _, err := m.ds.List(ctx, poolsKind)
		if err != nil {
			return err
		}
		out = out[:0]
		for _, kv := range kvs {
			var rec PoolRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				// a record this release cannot read: its ranges are unknown
				return fmt.Errorf("datastore record %s: %v", kv.Key, err)
			}
			for _, set := range rec.Ranges {
				for _, r := range set {
					out = append(out, r.Subnet)
				}
			}
		}
		return nil
	})
	m.note(err)
	if err != nil {
		return nil, fmt.Errorf("listing the pools: %w", err)
	}
	// a block of a range taken out of its pool still holds pods until it is
	// given back: its prefix stays a pod range
	blocks, ok := m.owners.records()
	if !ok {
		if blocks, _, err = m.listBlocks(ctx, BlocksPrefix("")); err != nil {
			return nil, fmt.Errorf("listing the blocks: %w", err)
		}
	}
	for _, kv := range blocks {
		rec, err := decodeBlock(kv)
		if err != nil {
			continue
		}
		if !slices.ContainsFunc(out, func(p netip.Prefix) bool { return p.Bits() <= rec.CIDR.Bits() && p.Contains(rec.CIDR.Addr()) }) {
			out = append(out, rec.CIDR)
		}
	}
	return out, nil
}
