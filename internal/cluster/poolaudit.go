package cluster

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// PoolAudit is what the watched copies of the pool records (WatchPools) and of
// every block record (WatchOwners) say of the cluster's pools, for doctor: it
// reads the copies only, never the datastore, and changes nothing.
type PoolAudit struct {
	// Known: both copies run (listed, their watches alive); when false, Cause
	// says which does not and the rest is empty: nothing is judged on a guess.
	Known bool
	Cause string
	// Bad are the pool records whose spec does not parse, in key order: no pod
	// gets an address from them.
	Bad []BadPool
	// Orphans are the block records of a pool whose record is gone (the IPPool
	// was deleted while the block was claimed), in key order.
	Orphans []BlockRecord
	// Unreadable are the keys of block records that do not decode.
	Unreadable []string
}

// BadPool is a pool record that does not parse: its object's name and why (the
// error names the pool and the field).
type BadPool struct {
	Name string
	Err  error
}

// AuditPools returns the PoolAudit of the watched copies.
func (m *Manager) AuditPools() PoolAudit {
	pools, okPools := m.poolCopy.records()
	blocks, okBlocks := m.owners.records()
	switch {
	case !okPools && !okBlocks:
		return PoolAudit{Cause: "neither the watch of the pool records nor that of the block records runs"}
	case !okPools:
		return PoolAudit{Cause: "the watch of the pool records does not run"}
	case !okBlocks:
		return PoolAudit{Cause: "the watch of the block records does not run"}
	}
	out := PoolAudit{Known: true}
	sort.Slice(pools, func(i, j int) bool { return pools[i].Key < pools[j].Key })
	have := make(map[string]bool, len(pools))
	for _, kv := range pools {
		have[kv.Key] = true
		name := strings.TrimPrefix(kv.Key, poolsKind)
		if _, err := recordOf(name, kv.Value); err != nil {
			out.Bad = append(out.Bad, BadPool{Name: name, Err: err})
		}
	}
	sort.Slice(blocks, func(i, j int) bool { return blocks[i].Key < blocks[j].Key })
	for _, kv := range blocks {
		rec, err := decodeBlock(kv)
		if err != nil {
			out.Unreadable = append(out.Unreadable, fmt.Sprintf("%s (%v)", kv.Key, err))
			continue
		}
		if !have[PoolKey(rec.Network)] {
			out.Orphans = append(out.Orphans, rec)
		}
	}
	return out
}

// DrainedRanges returns the subnets of the ranges of pool network that drain on
// this node: those its record lists drained (a default pool's spec.drained), and
// those the node's ledger keeps for a draining block that the record no longer
// lists; nil when the node does not serve the pool. It reads memory only.
func (m *Manager) DrainedRanges(network string) []netip.Prefix {
	m.mu.Lock()
	rec, ok := m.nets[network]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	var out []netip.Prefix
	add := func(p netip.Prefix) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, r := range rec.Drained {
		add(r.Subnet)
	}
	if p, err := m.l.Pool(network); err == nil {
		for i, set := range p.Ranges {
			for _, r := range set {
				if i >= len(rec.Ranges) || !slices.Contains(rec.Ranges[i], r) {
					add(r.Subnet)
				}
			}
		}
	}
	return out
}
