package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Pools that change live. A pool's record (an operator's IPPool, or a network's
// default pool written from the conflists) is the truth of its ranges. A node that
// serves the pool follows it (WatchPools; the GET of EnsurePool or EnsureNetwork
// while the watched copy has not listed since the start or its watch broke):
//
//   - a range added is the pool's at once: claims take blocks in it once the
//     node's blocks are full (claimFrom walks the record's ranges);
//   - a range removed is drained: no block is claimed in it any more (a free block
//     record there is skipped), each block of the node in it hands nothing more out
//     (ledger.BlockDraining), its leases keep their addresses, and once it has
//     held none for the reuse delay the block record is deleted (handBack), never
//     to be claimed again while the range stays out of the pool; the node's ledger
//     keeps the range until its last block there is gone;
//   - a change that cannot be served (checkChange: bad input) is refused: the node
//     keeps serving the pool as it was and reports why (Refused, doctor).

// recordOf reads a pool record of name: a network's default pool (PoolRecord, with
// its network) or an operator's IPPool spec.
func recordOf(name string, value []byte) (PoolRecord, error) {
	var probe struct {
		Network string `json:"network"`
	}
	if err := json.Unmarshal(value, &probe); err != nil {
		return PoolRecord{}, fmt.Errorf("%w: pool %s: %v", ErrBadPool, name, err)
	}
	if probe.Network == "" {
		p, err := ParseIPPool(name, value)
		if err != nil {
			return PoolRecord{}, err
		}
		return PoolRecord{Network: name, Ranges: p.Ranges, BlockBits: p.BlockBits}, nil
	}
	rec, err := decodePoolRecord(value)
	if err != nil {
		return PoolRecord{}, fmt.Errorf("%w: the default pool of network %q (datastore record %s): %v", ErrBadPool, probe.Network, PoolKey(probe.Network), err)
	}
	return rec, nil
}

// decodePoolRecord reads a network's default pool record, its ranges (and drained
// ranges) written as a conflist's (an operator's edit need not give rangeStart,
// rangeEnd or gateway: they take the conflist's defaults).
func decodePoolRecord(value []byte) (PoolRecord, error) {
	var raw struct {
		Network   string          `json:"network"`
		Ranges    json.RawMessage `json:"ranges"`
		BlockBits []int           `json:"blockBits"`
		Drained   json.RawMessage `json:"drained"`
	}
	if err := json.Unmarshal(value, &raw); err != nil {
		return PoolRecord{}, err
	}
	rec := PoolRecord{Network: raw.Network, BlockBits: raw.BlockBits}
	var err error
	if rec.Ranges, err = pool.ParseRangeSets(raw.Ranges); err != nil {
		return PoolRecord{}, fmt.Errorf("ranges: %v", err)
	}
	if pool.HasPodCIDR(rec.Ranges) {
		return PoolRecord{}, fmt.Errorf("ranges: usePodCidr has no place in cluster mode; give the pool's subnets")
	}
	var drained []json.RawMessage
	if len(raw.Drained) > 0 {
		if err := json.Unmarshal(raw.Drained, &drained); err != nil {
			return PoolRecord{}, fmt.Errorf("drained: %v; give a list of ranges, or [] for none", err)
		}
	}
	// an empty list (the last drained range moved back to ranges) drains nothing
	if len(drained) > 0 {
		sets, err := pool.ParseRangeSets(append(append([]byte("["), raw.Drained...), ']'))
		if err != nil {
			return PoolRecord{}, fmt.Errorf("drained: %v", err)
		}
		rec.Drained = sets[0]
	}
	if len(rec.BlockBits) != len(rec.Ranges) {
		return PoolRecord{}, fmt.Errorf("blockBits: %d block sizes for %d range sets; give one per range set", len(rec.BlockBits), len(rec.Ranges))
	}
	for i, set := range rec.Ranges {
		if err := set.CheckBlockBits(rec.BlockBits[i], fmt.Sprintf("blockBits[%d]", i)); err != nil {
			return PoolRecord{}, err
		}
	}
	return rec, nil
}

// poolKind names a pool in messages: an IPPool, or a CNI network's default pool.
func poolKind(name string, rec PoolRecord, named bool) string {
	if named {
		return "IPPool " + name
	}
	return fmt.Sprintf("the default pool of network %q (datastore record %s)", name, PoolKey(rec.Network))
}

// rangeDelta is what a change of a pool's ranges adds and removes in range set Set.
type rangeDelta struct {
	Set            int
	Added, Removed []pool.Range
}

func deltas(have, want []pool.RangeSet) []rangeDelta {
	var out []rangeDelta
	for i := range min(len(have), len(want)) {
		d := rangeDelta{Set: i}
		for _, r := range want[i] {
			if !slices.Contains(have[i], r) {
				d.Added = append(d.Added, r)
			}
		}
		for _, r := range have[i] {
			if !slices.Contains(want[i], r) {
				d.Removed = append(d.Removed, r)
			}
		}
		if len(d.Added)+len(d.Removed) > 0 {
			out = append(out, d)
		}
	}
	return out
}

// rangeText prints a range as an operator wrote it.
func rangeText(r pool.Range) string {
	return fmt.Sprintf("%s (%s-%s)", r.Subnet, r.RangeStart, r.RangeEnd)
}

// checkChange refuses a change of pool name's record from have to want that the
// nodes cannot serve, naming the field and the fix (ErrBadPool): another number or
// family of range sets, another block size while the pool has blocks (blocks > 0),
// or a range added or removed that shares a block with a range that stays (the
// block would change its addresses under its leases). others are the other pools'
// records, whose ranges none of want's may overlap.
func checkChange(name string, named bool, have, want PoolRecord, blocks int, others map[string]PoolRecord) error {
	what := poolKind(name, have, named)
	field := func(f string) string {
		if named {
			return "spec." + f
		}
		return f
	}
	if len(have.Ranges) != len(want.Ranges) {
		return fmt.Errorf("%w: %s: %s: %d range sets, it has %d; a range set (an address family) cannot be added to or removed from a pool in use: add or remove ranges inside its set, or create another IPPool",
			ErrBadPool, what, field("ranges"), len(want.Ranges), len(have.Ranges))
	}
	for i := range have.Ranges {
		if have.Ranges[i][0].Subnet.Addr().BitLen() != want.Ranges[i][0].Subnet.Addr().BitLen() {
			return fmt.Errorf("%w: %s: %s[%d] is %s, of the other family than %s; keep each range set's family: add or remove ranges inside it",
				ErrBadPool, what, field("ranges"), i, want.Ranges[i].String(), have.Ranges[i].String())
		}
	}
	if !slices.Equal(have.BlockBits, want.BlockBits) && blocks > 0 {
		size := "spec.blockSize"
		if !named {
			size = "blockBits"
		}
		return fmt.Errorf("%w: %s: %s: blocks of /%v, the pool's %d blocks are /%v; a pool with blocks keeps its block size: restore %s (or remove it if it was the default), or create another pool with the new size",
			ErrBadPool, what, size, want.BlockBits, blocks, have.BlockBits, size)
	}
	for _, d := range deltas(have.Ranges, want.Ranges) {
		bits := want.BlockBits[d.Set]
		kept := slices.DeleteFunc(slices.Clone(want.Ranges[d.Set]), func(r pool.Range) bool { return slices.Contains(d.Added, r) })
		for _, r := range append(slices.Clone(d.Added), d.Removed...) {
			for _, k := range kept {
				if b, ok := sharedBlock(r, k, bits); ok {
					verb := "added"
					if slices.Contains(d.Removed, r) {
						verb = "removed"
					}
					return fmt.Errorf("%w: %s: %s[%d]: range %s, %s, shares block %s with range %s, which stays; a range added or removed must cover whole /%d blocks: align its subnet (or rangeStart and rangeEnd) to the pool's blockSize",
						ErrBadPool, what, field("ranges"), d.Set, rangeText(r), verb, b, rangeText(k), bits)
				}
			}
		}
	}
	for other, rec := range others {
		if other == name {
			continue
		}
		for _, set := range want.Ranges {
			for _, r := range set {
				for _, oset := range rec.Ranges {
					for _, o := range oset {
						if r.RangeStart.BitLen() == o.RangeStart.BitLen() && !r.RangeEnd.Less(o.RangeStart) && !o.RangeEnd.Less(r.RangeStart) {
							return fmt.Errorf("%w: %s: %s: range %s overlaps range %s of pool %q; two pools must not share addresses: give %s ranges of their own",
								ErrBadPool, what, field("ranges"), rangeText(r), rangeText(o), other, name)
						}
					}
				}
			}
		}
	}
	return nil
}

// sharedBlock reports a block of prefix length bits that both ranges meet.
func sharedBlock(a, b pool.Range, bits int) (netip.Prefix, bool) {
	if a.RangeStart.BitLen() != b.RangeStart.BitLen() {
		return netip.Prefix{}, false
	}
	span := func(r pool.Range) (netip.Addr, netip.Addr) {
		lo, _ := r.RangeStart.Prefix(bits)
		hi, _ := r.RangeEnd.Prefix(bits)
		return lo.Addr(), pool.LastAddr(hi)
	}
	alo, ahi := span(a)
	blo, bhi := span(b)
	if ahi.Less(blo) || bhi.Less(alo) {
		return netip.Prefix{}, false
	}
	start := alo
	if start.Less(blo) {
		start = blo
	}
	p, _ := start.Prefix(bits)
	return p, true
}

// ledgerRanges are the ranges the node's ledger gives network's pool for record
// want: want's, and each range of the ledger's pool that want left out while a
// block of the node still lies in it (draining).
func (m *Manager) ledgerRanges(network string, want []pool.RangeSet) []pool.RangeSet {
	p, err := m.l.Pool(network)
	if err != nil || len(p.Ranges) != len(want) {
		return want
	}
	blocks := m.l.Blocks(network)
	out := make([]pool.RangeSet, len(want))
	for i := range want {
		out[i] = slices.Clone(want[i])
		for _, r := range p.Ranges[i] {
			if slices.Contains(want[i], r) {
				continue
			}
			for _, b := range blocks {
				if b.Set == i && len(pool.RangeSet{r}.Clip(b.Prefix)) > 0 {
					out[i] = append(out[i], r)
					break
				}
			}
		}
	}
	return out
}

// fitLedger gives network's ledger pool the ranges of record want (with the ranges
// its draining blocks still need) and drains every block of the node outside
// want. claimMu is held, or the network is not yet in m.nets.
func (m *Manager) fitLedger(network string, want PoolRecord) error {
	if p, err := m.l.Pool(network); err == nil && p.BlockBits != nil && slices.Equal(p.BlockBits, want.BlockBits) && len(p.Ranges) == len(want.Ranges) {
		if lr := m.ledgerRanges(network, want.Ranges); !pool.Equal(p.Ranges, lr) {
			if err := m.l.SetClusterRanges(network, lr); err != nil {
				return err
			}
		}
	} else if err := m.l.DeclareCluster(network, want.Ranges, want.BlockBits); err != nil {
		return err
	}
	for _, b := range m.l.Blocks(network) {
		m.drainOutside(want, b)
	}
	return nil
}

// drainOutside drains block b when record want's ranges hold none of its
// addresses (a range removed), unless it is lost or draining already.
func (m *Manager) drainOutside(want PoolRecord, b ledger.BlockStatus) {
	if b.State == ledger.BlockDraining || b.State == ledger.BlockLost || b.Set >= len(want.Ranges) {
		return
	}
	if want.Ranges[b.Set].Clip(b.Prefix).Usable() > 0 {
		return
	}
	if err := m.l.DrainBlock(b.Network, b.Prefix); err != nil {
		m.log.Error("draining a block of a removed range", "network", b.Network, "block", b.Prefix.String(), "err", err)
		return
	}
	m.log.Info("block draining: its range left the pool; it is given back once its leases are released", "network", b.Network, "block", b.Prefix.String(), "leases", b.Used)
}

// follow applies record want of network (a pool this node serves) when it differs
// from the one the node serves: checked (a change that cannot be served is refused
// and recorded for doctor; the node keeps serving the pool as it was), then the
// ledger fitted and m.nets updated under claimMu, so that no claim runs on the old
// ranges meanwhile. Adopted with it, for a named pool, is its IPPool (node
// selector).
func (m *Manager) followRecord(ctx context.Context, network string, want PoolRecord, named *IPPool) error {
	m.mu.Lock()
	have, ok := m.nets[network]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	if have.equal(want) {
		m.setRefused(network, nil)
		if named != nil {
			m.mu.Lock()
			m.pools[network] = *named
			m.mu.Unlock()
		}
		return nil
	}
	others, err := m.otherPools(ctx, network)
	if err != nil {
		return err
	}
	blocks, err := m.blockCount(ctx, network)
	if err != nil {
		return err
	}
	if err := checkChange(network, named != nil, have, want, blocks, others); err != nil {
		m.setRefused(network, err)
		m.log.Warn("pool change refused; serving the pool as it was", "pool", network, "err", err)
		return err
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	if err := m.fitLedger(network, want); err != nil {
		err = fmt.Errorf("%s: applying its new ranges %s: %w", poolKind(network, want, named != nil), pool.SetsString(want.Ranges), err)
		m.setRefused(network, err)
		return err
	}
	m.mu.Lock()
	m.nets[network] = want
	if named != nil {
		m.pools[network] = *named
	}
	m.mu.Unlock()
	m.setRefused(network, nil)
	for _, d := range deltas(have.Ranges, want.Ranges) {
		m.log.Info("pool ranges changed", "pool", network, "set", d.Set, "added", rangesText(d.Added), "removed", rangesText(d.Removed))
	}
	return nil
}

func rangesText(rs []pool.Range) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = rangeText(r)
	}
	return strings.Join(parts, ", ")
}

// setRefused records (err nil: clears) why the pool's current record is not served.
func (m *Manager) setRefused(network string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err == nil {
		delete(m.refused, network)
		return
	}
	m.refused[network] = err.Error()
}

// Refused returns, by pool, why its record's current spec is not served (the node
// serves it as it was): bad input an operator must fix.
func (m *Manager) Refused() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]string, len(m.refused))
	for k, v := range m.refused {
		out[k] = v
	}
	return out
}

// otherPools reads every pool record but network's (a record that does not parse
// is left out: it serves nothing).
func (m *Manager) otherPools(ctx context.Context, network string) (map[string]PoolRecord, error) {
	kvs, ok := m.poolCopy.records()
	if !ok {
		err := m.call(ctx, func(ctx context.Context) (err error) {
			kvs, _, err = m.ds.List(ctx, poolsKind)
			return err
		})
		m.note(err)
		if err != nil {
			return nil, fmt.Errorf("listing the pools: %w", err)
		}
	}
	out := map[string]PoolRecord{}
	for _, kv := range kvs {
		name := strings.TrimPrefix(kv.Key, poolsKind)
		rec, err := recordOf(name, kv.Value)
		if err != nil || rec.Network == network {
			continue
		}
		out[rec.Network] = rec
	}
	return out, nil
}

// blockCount counts the block records of network in the datastore.
func (m *Manager) blockCount(ctx context.Context, network string) (int, error) {
	if blocks, ok := m.cachedBlocks(network); ok {
		return len(blocks), nil
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	blocks, err := m.relist(ctx, network)
	return len(blocks), err
}

// retire deletes the record of draining block b of the node once it has held no
// lease and kept no address for the reuse delay (handBack): out of the ledger first, then the record by
// compare-and-swap, so no node claims it again. A failed delete puts it back in
// the ledger as draining when the datastore still gives it to the node.
func (m *Manager) retire(ctx context.Context, key string, b ledger.BlockStatus, own ownedBlock) error {
	if err := m.l.RemoveBlock(b.Network, b.Prefix); err != nil {
		if errors.Is(err, ledger.ErrBlockInUse) {
			return nil
		}
		return err
	}
	m.mu.Lock()
	delete(m.owned, key)
	delete(m.empty, key)
	m.mu.Unlock()
	err := m.call(ctx, func(ctx context.Context) error { return m.ds.Delete(ctx, key, own.rev) })
	m.note(err)
	if err == nil || errors.Is(err, datastore.ErrNotFound) {
		m.cacheDelete(b.Network, key)
		m.log.Info("drained block given back: its range left the pool", "network", b.Network, "block", b.Prefix.String())
		m.counts.handBacks.Add(1)
		return nil
	}
	kept, gerr := m.reAdopt(ctx, key, b)
	m.note(gerr)
	switch {
	case errors.Is(gerr, datastore.ErrNotFound):
		return nil
	case gerr != nil:
		return fmt.Errorf("giving back drained block %s of %q: outcome unknown: %w", b.Prefix, b.Network, err)
	case kept:
		if derr := m.l.DrainBlock(b.Network, b.Prefix); derr != nil {
			return derr
		}
		return fmt.Errorf("giving back drained block %s of %q failed; kept, draining: %w", b.Prefix, b.Network, err)
	}
	return nil
}

// shrinkLedgers takes out of the ledger's pools the removed ranges whose last
// block of the node is gone (Sweep).
func (m *Manager) shrinkLedgers() {
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	m.mu.Lock()
	nets := make(map[string]PoolRecord, len(m.nets))
	for n, rec := range m.nets {
		nets[n] = rec
	}
	m.mu.Unlock()
	for n, rec := range nets {
		p, err := m.l.Pool(n)
		if err != nil || p.BlockBits == nil {
			continue
		}
		if lr := m.ledgerRanges(n, rec.Ranges); !pool.Equal(p.Ranges, lr) {
			if err := m.l.SetClusterRanges(n, lr); err != nil {
				m.log.Warn("taking drained ranges out of the ledger", "network", n, "err", err)
			}
		}
	}
}

// WatchPools keeps every pool record followed: it lists them, applies each that
// this node serves (followRecord), watches them from the list's revision and
// applies every change, and does it all again when the watch breaks, after a pause
// that doubles up to 30s while the watches keep breaking within a minute. While
// the watch runs, EnsurePool reads the watched copy instead of one GET per ADD;
// before the first list since the start, and after the watch broke, it reads the
// datastore. A record deleted while the node serves its pool changes nothing
// (unknown means keep). Run it once, in a goroutine of its own, until ctx ends.
func (m *Manager) WatchPools(ctx context.Context) {
	pause := time.Second
	for {
		began := time.Now()
		err := m.watchPoolsOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			pause = time.Second
		}
		m.log.Info("the watch of the pool records ended; ADDs read the records until it runs again", "err", err, "retry", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

func (m *Manager) watchPoolsOnce(ctx context.Context) error {
	var kvs []datastore.KV
	var rev int64
	err := m.call(ctx, func(ctx context.Context) (err error) {
		kvs, rev, err = m.ds.List(ctx, poolsKind)
		return err
	})
	m.note(err)
	if err != nil {
		return err
	}
	w, err := m.ds.Watch(ctx, poolsKind, rev)
	if err != nil {
		return err
	}
	m.poolCopy.reset(kvs)
	defer m.poolCopy.dead()
	for _, kv := range kvs {
		m.followKV(ctx, kv)
	}
	m.poolsDone()
	for ev := range w.Events() {
		m.poolCopy.apply(ev)
		if ev.Type != datastore.Deleted {
			m.followKV(ctx, ev.KV)
		}
		m.poolsDone()
	}
	return w.Err()
}

func (m *Manager) poolsDone() {
	select {
	case m.poolsFollowed <- struct{}{}:
	default:
	}
}

// PoolsFollowed receives a value (coalesced) after WatchPools listed or applied a
// pool record.
func (m *Manager) PoolsFollowed() <-chan struct{} { return m.poolsFollowed }

// followKV applies one pool record to the node when it serves that pool.
func (m *Manager) followKV(ctx context.Context, kv datastore.KV) {
	name := strings.TrimPrefix(kv.Key, poolsKind)
	rec, err := recordOf(name, kv.Value)
	network := name
	if err == nil {
		network = rec.Network
	}
	m.mu.Lock()
	_, serves := m.nets[network]
	m.mu.Unlock()
	if !serves {
		return
	}
	if err != nil {
		m.setRefused(network, err)
		m.log.Warn("pool record refused; serving the pool as it was", "pool", network, "err", err)
		return
	}
	var named *IPPool
	if p, perr := ParseIPPool(name, kv.Value); perr == nil {
		named = &p
	}
	if err := m.followRecord(ctx, network, rec, named); err != nil && !errors.Is(err, ErrBadPool) {
		m.log.Warn("applying a pool record", "pool", network, "err", err)
	}
}
