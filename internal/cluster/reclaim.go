package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"github.com/ipledger/ipledger/internal/datastore"
)

// NodeGone tells the manager that node's Node object was deleted (Kubernetes): its
// blocks are reclaimed as soon as its lease has run out, without the quarantine,
// unless NodeBack says the Node exists again before that.
func (m *Manager) NodeGone(node string) {
	m.log.Warn("Node deleted: its blocks are reclaimed once its lease runs out", "node", node)
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
	var leases []datastore.NodeLease
	err = m.call(ctx, func(ctx context.Context) (err error) {
		leases, err = m.ds.Leases().List(ctx)
		return err
	})
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
	// due: node's lease has stayed expired (or gone) for the quarantine, or its
	// Node object was deleted and its lease ran out
	due := func(node string) bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		o := m.obs[node]
		if o == nil { // a node without a lease since this manager looks
			o = &leaseObs{gone: true, goneSince: now}
			m.obs[node] = o
		}
		expiredAt := o.seen + o.ttl
		if o.gone {
			expiredAt = o.goneSince
		}
		wait := m.opts.Quarantine
		if m.gone[node] {
			wait = 0
		}
		return now >= expiredAt+wait
	}
	var errs []error
	errs = append(errs, m.returnDead(ctx, kvs, due), m.returnOrphans(ctx, kvs))
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			continue
		}
		if rec.Owner == "" {
			errs = append(errs, m.dropDrainedFree(ctx, kv, rec))
			continue
		}
		if rec.Owner == m.opts.Node {
			m.mu.Lock()
			_, net := m.nets[rec.Network]
			_, own := m.owned[kv.Key]
			m.mu.Unlock()
			if net && !own && m.Provable() {
				errs = append(errs, m.readopt(ctx, kv.Key))
			}
			continue
		}
		if !due(rec.Owner) {
			continue
		}
		prev := rec
		rec.Owner, rec.Holder, rec.Lease, rec.Epoch = "", "", "", rec.Epoch+1
		val, _ := json.Marshal(rec)
		var rev int64
		err = m.call(ctx, func(ctx context.Context) (err error) {
			rev, err = m.ds.Update(ctx, kv.Key, val, kv.Revision)
			return err
		})
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
// datastore. A copy that has not yet seen another node reclaim the block (epoch+1,
// no owner) still shows it ours at the old epoch; adopting it from there would hand
// out addresses from a block that is free for anyone to claim.
func (m *Manager) readopt(ctx context.Context, key string) error {
	var kv datastore.KV
	err := m.call(ctx, func(ctx context.Context) (err error) {
		kv, err = m.ds.Get(ctx, key)
		return err
	})
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

// dropDrainedFree deletes, by compare-and-swap, free block record rec when the
// pool this node serves no longer holds any of its addresses (its range was
// drained) and it keeps no address for a pod: a dead node's draining block, once
// reclaimed, or a block given back before its range was removed. Nothing can be
// claimed there any more (claimFrom skips it), so the record goes as a drained
// block's record goes when its owner gives it back. A record that changed since it
// was read, or a pool this node does not serve, is left as it is.
func (m *Manager) dropDrainedFree(ctx context.Context, kv datastore.KV, rec BlockRecord) error {
	m.mu.Lock()
	cfg, serves := m.nets[rec.Network]
	m.mu.Unlock()
	if !serves || rec.Set >= len(cfg.Ranges) || cfg.Ranges[rec.Set].Clip(rec.CIDR).Usable() > 0 || len(rec.Borrows) > 0 {
		return nil
	}
	err := m.call(ctx, func(ctx context.Context) error { return m.ds.Delete(ctx, kv.Key, kv.Revision) })
	m.note(err)
	switch {
	case err == nil:
		m.cacheDelete(rec.Network, kv.Key)
		m.log.Info("free block of a drained range deleted: its range left the pool", "network", rec.Network, "block", rec.CIDR.String(), "epoch", rec.Epoch)
		return nil
	case errors.Is(err, datastore.ErrConflict), errors.Is(err, datastore.ErrNotFound):
		return nil // claimed, changed or deleted since it was read
	}
	return fmt.Errorf("deleting free block %s of drained range of %q: %w", rec.CIDR, rec.Network, err)
}
