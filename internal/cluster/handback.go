package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// handBack gives back blocks seen empty on two observations at least Grace apart
// with nothing allocated in between; the node keeps its last active block of every
// range set. A draining block (its range left the pool) goes on two observations
// the ledger's reuse delay apart: whoever claims its addresses next (another node,
// once its range is in the pool again) hands them out as never used, so the last
// of them released must be at least the reuse delay old by then, whatever
// happened to its range meanwhile. An empty block whose hand-back would leave its
// set's other blocks below a quarter of a block free is kept: the node would claim
// it again ahead of need (ahead.go).
func (m *Manager) handBack(ctx context.Context) error {
	now := m.mono()
	reuse := m.l.ReuseDelay()
	blocks := m.l.Blocks("")
	room := roomOf(blocks)
	var errs []error
	for _, b := range blocks {
		key := BlockKey(b.Network, b.Prefix)
		if b.State == ledger.BlockDraining && b.Used == 0 && b.Withheld == 0 {
			// its range left the pool: given back once it has been empty for the
			// reuse delay (every release there is older than the first sighting)
			m.mu.Lock()
			o, seen := m.empty[key]
			if !seen || o.gen != b.Allocations {
				o = emptyObs{since: now, gen: b.Allocations}
				m.empty[key] = o
			}
			own, ok := m.owned[key]
			m.mu.Unlock()
			if ok && now-o.since >= reuse {
				if err := m.retire(ctx, key, b, own); err != nil {
					errs = append(errs, err)
				}
			}
			continue
		}
		if b.State != ledger.BlockActive || b.Used > 0 || b.Withheld > 0 {
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
		k := setKey{b.Network, b.Set}
		r := room[k]
		r.active--
		r.free -= min(r.free, b.Usable)
		if now-o.since < m.opts.Grace || r.active < 1 || r.low() || !ok {
			continue
		}
		if err := m.giveBack(ctx, key, b, own); err != nil {
			errs = append(errs, err)
			continue
		}
		room[k] = r
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
	var rev int64
	err := m.call(ctx, func(ctx context.Context) (err error) {
		rev, err = m.ds.Update(ctx, key, val, own.rev)
		return err
	})
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
	kept, gerr := m.reAdopt(ctx, key, b)
	if gerr == nil {
		if kept {
			return fmt.Errorf("giving back block %s of %q failed; kept: %w", b.Prefix, b.Network, err)
		}
		return nil
	}
	// Unknown: keep it out of the ledger; the sweep re-adopts it if the datastore
	// still gives it to the node.
	return fmt.Errorf("giving back block %s of %q: outcome unknown: %w", b.Prefix, b.Network, err)
}

// reAdopt reads block key after a give-back whose write failed and puts it back
// in the ledger (and the node's books) when the datastore still gives it to the
// node at b's epoch: kept. Not kept, with no error: the record says another owner
// or epoch. An error: it could not be read (ErrNotFound: the record is gone).
func (m *Manager) reAdopt(ctx context.Context, key string, b ledger.BlockStatus) (kept bool, err error) {
	var kv datastore.KV
	err = m.call(ctx, func(ctx context.Context) (err error) {
		kv, err = m.ds.Get(ctx, key)
		return err
	})
	if err != nil {
		return false, err
	}
	cur, derr := decodeBlock(kv)
	if derr != nil || cur.Owner != m.opts.Node || cur.Epoch != b.Epoch {
		return false, nil
	}
	if err := m.l.AddBlock(b.Network, b.Prefix, b.Epoch, cur.kept()...); err != nil {
		return false, err
	}
	m.mu.Lock()
	m.owned[key] = ownedBlock{rec: cur, rev: kv.Revision}
	m.mu.Unlock()
	return true, nil
}
