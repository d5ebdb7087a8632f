package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
)

// PoolRanges is the subnet of every range of every network's pool record, those
// of networks this node has not set up included: the cluster's pod ranges, claimed
// or not. The node network masquerades nothing inside them, so a pod in a block
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
	return out, nil
}
