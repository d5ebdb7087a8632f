package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// guard is the ledger's allocation guard: nothing is handed out from the node's
// blocks unless the lease is provable now.
func (m *Manager) guard(network string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.fencing.started {
		return ErrNotStarted
	}
	if now := m.mono(); m.fencing.lapsed || now >= m.fencing.deadline {
		return fmt.Errorf("%w: node %s: no successful lease renewal for too long (datastore unreachable?); allocation resumes once it renews", ErrFenced, m.opts.Node)
	}
	return nil
}

// Provable reports whether the node's lease is provable now.
func (m *Manager) Provable() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fencing.started && !m.fencing.lapsed && m.mono() < m.fencing.deadline
}

// Renew renews the node lease (acquiring it when the manager holds none or lost it)
// and, after a lapse, re-verifies the node's blocks. It also suspends the blocks once
// the lease can no longer be proven.
//
// Concurrency: the renewal holds renewMu only, so it never waits behind a Sweep;
// the re-verification after it holds stepMu, as Sweep does, so it waits for a
// running sweep and never runs beside one. The background loop renews with
// renewLease alone and has sweepLoop re-verify, so that no renewal waits for a
// re-verification either.
func (m *Manager) Renew(ctx context.Context) error {
	lapsed, err := m.renewLease(ctx)
	if err != nil || !lapsed {
		return err
	}
	return m.verifyLapsed(ctx)
}

// renewLease renews (or acquires) the node lease under renewMu, suspending the
// blocks when the lease was lost or its proof ran out, and moves the fencing
// deadline on. lapsed: the blocks stay suspended until verifyLapsed.
func (m *Manager) renewLease(ctx context.Context) (lapsed bool, err error) {
	m.renewMu.Lock()
	defer m.renewMu.Unlock()
	m.fence()
	m.mu.Lock()
	cur := m.fencing.lease
	m.mu.Unlock()
	leases := m.ds.Leases()
	sent := m.mono()
	var nl datastore.NodeLease
	acquire := func(ctx context.Context) (err error) {
		nl, err = leases.Acquire(ctx, m.opts.Node, m.opts.Holder, m.opts.LeaseTTL, m.opts.Addrs...)
		return err
	}
	if cur.ID == "" {
		err = m.call(ctx, acquire)
	} else {
		err = m.call(ctx, func(ctx context.Context) (err error) {
			nl, err = leases.Renew(ctx, cur)
			return err
		})
		if errors.Is(err, datastore.ErrNotFound) || errors.Is(err, datastore.ErrConflict) {
			// The lease expired or was taken over: whatever the node proved before is
			// void; suspend, take a new lease, re-verify every block.
			m.log.Warn("node lease lost; suspending blocks", "err", err)
			m.suspend()
			sent = m.mono()
			err = m.call(ctx, acquire)
		}
	}
	m.note(err)
	if err != nil {
		m.fence()
		return false, fmt.Errorf("node lease of %s: %w", m.opts.Node, err)
	}
	m.mu.Lock()
	if sent >= m.fencing.deadline {
		// sent after the last proof ran out: nothing proved the lease in between, so
		// a re-verification running across that gap proves nothing
		m.fencing.proof++
	}
	m.fencing.lease = nl
	m.fencing.deadline = sent + m.opts.LeaseTTL - m.opts.Margin
	lapsed = m.fencing.lapsed
	m.mu.Unlock()
	return lapsed, nil
}

// verifyLapsed re-verifies the blocks (verify) under stepMu when they are suspended
// and the lease is provable by time; it does nothing when they are not suspended
// (another re-verification came first).
func (m *Manager) verifyLapsed(ctx context.Context) error {
	m.stepMu.Lock()
	defer m.stepMu.Unlock()
	m.mu.Lock()
	f, now := m.fencing, m.mono()
	m.mu.Unlock()
	switch {
	case !f.lapsed:
		return nil
	case f.lease.ID == "" || now >= f.deadline:
		return fmt.Errorf("%w: node %s: its blocks are re-verified after the next successful renewal", ErrFenced, m.opts.Node)
	}
	return m.verify(ctx, f.proof)
}

// fence suspends the node's blocks once the lease can no longer be proven. Its
// log line says how long after the proof ran out this was noticed: about an
// Interval when renewals were answered late or failed, much longer when the
// renewal loop itself did not run (a starved or stopped process).
func (m *Manager) fence() {
	m.mu.Lock()
	now := m.mono()
	expired := m.fencing.started && !m.fencing.lapsed && now >= m.fencing.deadline
	overdue := now - m.fencing.deadline
	if expired {
		m.lapseLocked()
	}
	m.mu.Unlock()
	if expired {
		m.log.Warn("node lease not proven in time; suspending blocks", "overdue", overdue.Round(time.Millisecond))
		m.suspendLedger()
	}
}

// suspend suspends the node's blocks until a renewal and a re-verification.
func (m *Manager) suspend() {
	m.mu.Lock()
	m.lapseLocked()
	m.mu.Unlock()
	m.suspendLedger()
}

// lapseLocked marks the blocks suspended and the lease's proof broken (Manager.mu
// held).
func (m *Manager) lapseLocked() {
	if !m.fencing.lapsed {
		m.counts.suspensions.Add(1)
	}
	m.fencing.lapsed = true
	m.fencing.proof++
}

func (m *Manager) suspendLedger() {
	if err := m.l.SuspendAll(); err != nil {
		m.log.Error("suspending blocks in the ledger", "err", err)
	}
}

// verify re-reads every block the ledger holds (and every block the datastore says
// the node owns in its networks) after a lapse: a block still the node's at the
// ledger's epoch is re-affirmed by compare-and-swap and resumed; any other is lost.
// The allocation guard opens only when every block was judged, and only if the
// lease's proof did not break since it began (proof, the fencing's count when it
// began) and is still provable: else the blocks stay suspended for the next one.
// The caller holds stepMu.
func (m *Manager) verify(ctx context.Context, proof uint64) error {
	type want struct {
		network string
		prefix  netip.Prefix
	}
	seen := map[want]bool{}
	for _, b := range m.l.Blocks("") {
		if b.State == ledger.BlockLost {
			continue
		}
		seen[want{b.Network, b.Prefix}] = true
		key := BlockKey(b.Network, b.Prefix)
		var kv datastore.KV
		err := m.call(ctx, func(ctx context.Context) (err error) {
			kv, err = m.ds.Get(ctx, key)
			return err
		})
		m.note(err)
		var rec BlockRecord
		if err == nil {
			rec, err = decodeBlock(kv)
		}
		switch {
		case errors.Is(err, datastore.ErrNotFound):
			m.lose(b.Network, b.Prefix, "its record is gone from the datastore")
			continue
		case err != nil:
			return fmt.Errorf("re-verifying block %s of %q: %w", b.Prefix, b.Network, err)
		}
		if rec.Owner != m.opts.Node || rec.Epoch != b.Epoch {
			m.lose(b.Network, b.Prefix, fmt.Sprintf("owner %q at epoch %d now (ours was epoch %d)", rec.Owner, rec.Epoch, b.Epoch))
			continue
		}
		// Re-affirm: a reclaimer that read the block before this write fails its
		// compare-and-swap, one that reads it after sees the renewed lease.
		rec.Holder, rec.Lease = m.opts.Holder, m.leaseID()
		val, _ := json.Marshal(rec)
		var rev int64
		err = m.call(ctx, func(ctx context.Context) (err error) {
			rev, err = m.ds.Update(ctx, key, val, kv.Revision)
			return err
		})
		m.note(err)
		if errors.Is(err, datastore.ErrConflict) || errors.Is(err, datastore.ErrNotFound) {
			return fmt.Errorf("re-verifying block %s of %q: changed while re-affirming; retrying at the next renewal: %w", b.Prefix, b.Network, err)
		}
		if err != nil {
			return fmt.Errorf("re-affirming block %s of %q: %w", b.Prefix, b.Network, err)
		}
		if err := m.l.SetWithheld(b.Network, b.Prefix, rec.kept()); err != nil {
			return err
		}
		if err := m.l.ResumeBlock(b.Network, b.Prefix, b.Epoch); err != nil {
			return err
		}
		m.mu.Lock()
		m.owned[key] = ownedBlock{rec: rec, rev: rev}
		m.mu.Unlock()
	}
	// blocks the datastore gives the node that the ledger lacks (a crash between a
	// claim and its AddBlock)
	m.mu.Lock()
	nets := make([]string, 0, len(m.nets))
	for n := range m.nets {
		nets = append(nets, n)
	}
	m.mu.Unlock()
	for _, n := range nets {
		if err := m.adopt(ctx, n, func(p netip.Prefix) bool { return seen[want{n, p}] }); err != nil {
			return err
		}
	}
	m.mu.Lock()
	held := m.fencing.proof == proof && m.mono() < m.fencing.deadline
	if held {
		m.fencing.lapsed = false
	}
	m.mu.Unlock()
	if !held {
		return fmt.Errorf("%w: node %s: the lease lapsed while its blocks were re-verified; they are re-verified after the next successful renewal", ErrFenced, m.opts.Node)
	}
	m.log.Info("blocks verified; allocation allowed")
	return nil
}

func (m *Manager) leaseID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fencing.lease.ID
}

// lose drops a block the node no longer owns from the ledger and from its books.
func (m *Manager) lose(network string, p netip.Prefix, why string) {
	m.log.Warn("block lost", "network", network, "block", p.String(), "why", why)
	if err := m.l.LoseBlock(network, p); err != nil {
		m.log.Error("recording a lost block", "network", network, "block", p.String(), "err", err)
	}
	m.mu.Lock()
	delete(m.owned, BlockKey(network, p))
	delete(m.empty, BlockKey(network, p))
	m.mu.Unlock()
}
