package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/ipledger/ipledger/internal/datastore"
)

// Sticky addresses across nodes. A StatefulSet pod's address is kept for it (Keep,
// by the node owning the address's block: its ledger withholds the address from
// then on, and the block record lists it in Borrows). Whichever node runs the pod
// holds the address in that record first, by one compare-and-swap that sets
// Borrow.Node: a node the pod is re-created on borrows it (Borrow), and the owner
// itself holds it the same way before its ledger hands it out (hold), so of two
// nodes racing for it, the owner among them, exactly one wins. The holder gives it
// back to the block when the pod goes (Return). Every node routes a borrowed
// address to its borrower (Owners). The owner lets the address go when the pod's
// retention ends (Unkeep), never while another node holds it.

// maxEditTries bounds the re-reads of one block edit that keeps losing its
// compare-and-swap to other writers (each loss re-decides on the fresh record).
const maxEditTries = 8

// errNoChange: an edit found the record already as wanted; nothing is written.
var errNoChange = errors.New("no change")

// blockOfAddr is the block prefix holding addr in network's pool.
func (m *Manager) blockOfAddr(network string, addr netip.Addr) (netip.Prefix, error) {
	m.mu.Lock()
	cfg, ok := m.nets[network]
	m.mu.Unlock()
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w: %q (EnsureNetwork first)", ErrUnknownNetwork, network)
	}
	for i, set := range cfg.Ranges {
		if set.Contains(addr) {
			return addr.Prefix(cfg.BlockBits[i])
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: address %s is in no range of network %q", ErrNotKept, addr, network)
}

// editBlock applies edit to the block record holding addr and writes it by
// compare-and-swap, re-reading and deciding again after each lost race. edit
// returns errNoChange when the record is already as wanted (nothing is written),
// or an error that ends the edit. The record as written (or found) is returned.
func (m *Manager) editBlock(ctx context.Context, network string, addr netip.Addr, edit func(*BlockRecord) error) (BlockRecord, error) {
	p, err := m.blockOfAddr(network, addr)
	if err != nil {
		return BlockRecord{}, err
	}
	key := BlockKey(network, p)
	for range maxEditTries {
		var kv datastore.KV
		err := m.call(ctx, func(ctx context.Context) (err error) {
			kv, err = m.ds.Get(ctx, key)
			return err
		})
		m.note(err)
		if errors.Is(err, datastore.ErrNotFound) {
			return BlockRecord{}, fmt.Errorf("%w: block %s of %q holding %s has never been claimed", ErrNotKept, p, network, addr)
		}
		if err != nil {
			return BlockRecord{}, fmt.Errorf("reading block %s of %q: %w", p, network, err)
		}
		rec, err := decodeBlock(kv)
		if err != nil {
			return BlockRecord{}, err
		}
		rec.Borrows = slices.Clone(rec.Borrows)
		if err := edit(&rec); errors.Is(err, errNoChange) {
			return rec, nil
		} else if err != nil {
			return rec, err
		}
		val, _ := json.Marshal(rec)
		var rev int64
		err = m.call(ctx, func(ctx context.Context) (err error) {
			rev, err = m.ds.Update(ctx, key, val, kv.Revision)
			return err
		})
		m.note(err)
		switch {
		case err == nil:
		case errors.Is(err, datastore.ErrConflict), errors.Is(err, datastore.ErrNotFound):
			continue // somebody wrote it first: decide again on what they wrote
		default:
			got, grev, ok := m.settle(ctx, key, rec)
			if !ok {
				return rec, fmt.Errorf("writing block %s of %q: %w", p, network, err)
			}
			rec, rev = got, grev
		}
		m.cacheWrite(network, key, val, rev)
		m.mu.Lock()
		if o, ok := m.owned[key]; ok && rec.Owner == m.opts.Node && rec.Epoch == o.rec.Epoch {
			m.owned[key] = ownedBlock{rec: rec, rev: rev}
		}
		m.mu.Unlock()
		return rec, nil
	}
	return BlockRecord{}, fmt.Errorf("writing block %s of %q: lost the compare-and-swap %d times in a row: %w", p, network, maxEditTries, datastore.ErrConflict)
}

// Keep keeps addr, of a block this node owns, for the StatefulSet pod forName
// ("namespace/statefulset/pod"): from now on this node's ledger never hands it out
// to another pod (a lease holding it keeps it), and a node the pod is re-created on
// may borrow it. Keeping it again for the same pod does nothing; an address kept
// for another pod fails with ErrKept.
func (m *Manager) Keep(ctx context.Context, network string, addr netip.Addr, forName string) error {
	m.stickyMu.Lock() // no sweep between the ledger's withholding and the record's write
	defer m.stickyMu.Unlock()
	return m.keep(ctx, network, addr, forName, false)
}

// keep is Keep, called with stickyMu held; with held, this node holds the
// address from the start (the record says so in the same write), for the lease
// that was just given it.
func (m *Manager) keep(ctx context.Context, network string, addr netip.Addr, forName string, held bool) error {
	if forName == "" {
		return fmt.Errorf("%w: keeping %s: the pod it is kept for is empty", ErrNotKept, addr)
	}
	p, err := m.blockOfAddr(network, addr)
	if err != nil {
		return err
	}
	// withheld in the ledger first: from here the address goes to nobody else
	withheld := m.l.Withheld(network, p)
	was := slices.Contains(withheld, addr)
	if !was {
		if err := m.l.SetWithheld(network, p, append(withheld, addr)); err != nil {
			return fmt.Errorf("keeping %s for %s: %w", addr, forName, err)
		}
	}
	_, err = m.editBlock(ctx, network, addr, func(rec *BlockRecord) error {
		if rec.Owner != m.opts.Node {
			return fmt.Errorf("%w: block %s of %q is owned by %q, not by this node (%s)", ErrNotOwner, rec.CIDR, network, rec.Owner, m.opts.Node)
		}
		if i := rec.borrowIndex(addr); i >= 0 {
			if rec.Borrows[i].For != forName {
				return fmt.Errorf("%w: %s is kept for %s, not %s", ErrKept, addr, rec.Borrows[i].For, forName)
			}
			return errNoChange
		}
		b := Borrow{Addr: addr, For: forName}
		if held {
			b.Node, b.Holder, b.Lease = m.opts.Node, m.opts.Holder, m.leaseID()
		}
		rec.Borrows = append(rec.Borrows, b)
		slices.SortFunc(rec.Borrows, func(a, b Borrow) int { return a.Addr.Compare(b.Addr) })
		return nil
	})
	if err != nil && !was && !errors.Is(err, datastore.ErrUnavailable) {
		// definitely not kept: let the ledger hand it out again (an unknown
		// outcome keeps it withheld; the record decides at the next resume)
		if uerr := m.l.SetWithheld(network, p, withheld); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	if err == nil {
		m.log.Info("address kept for a StatefulSet pod", "network", network, "addr", addr.String(), "for", forName)
	}
	return err
}

// Unkeep ends the keeping of addr (the pod's retention ended: its StatefulSet was
// scaled down below it or deleted): the block record forgets it and this node's
// ledger may hand it out again after the reuse delay (a pod of this node holding
// it keeps it until it goes). It fails with ErrBorrowed while another node holds
// it, and does nothing for an address not kept.
func (m *Manager) Unkeep(ctx context.Context, network string, addr netip.Addr) error {
	_, err := m.editBlock(ctx, network, addr, func(rec *BlockRecord) error {
		if rec.Owner != m.opts.Node {
			return fmt.Errorf("%w: block %s of %q is owned by %q, not by this node (%s)", ErrNotOwner, rec.CIDR, network, rec.Owner, m.opts.Node)
		}
		i := rec.borrowIndex(addr)
		if i < 0 {
			return errNoChange
		}
		if b := rec.Borrows[i]; b.Node != "" && b.Node != m.opts.Node {
			return fmt.Errorf("%w: %s (kept for %s) is borrowed by node %s; it must return it first", ErrBorrowed, addr, b.For, b.Node)
		}
		rec.Borrows = slices.Delete(rec.Borrows, i, i+1)
		return nil
	})
	if err != nil {
		return err
	}
	if err := m.unwithhold(network, addr); err != nil {
		return err
	}
	m.log.Info("address no longer kept", "network", network, "addr", addr.String())
	return nil
}

// Borrow lends this node addr, kept for forName in another node's block, by one
// compare-and-swap on the block record; it returns the block's owner. Of nodes
// racing for it exactly one wins; the others get ErrBorrowed naming the winner.
// Borrowing it again (this node holds it) succeeds. It fails with ErrNotKept when
// the address is not kept for forName, with ErrOwnBlock when the block is this
// node's (its ledger hands the address out), and with ErrFenced while the node
// lease cannot be proven.
func (m *Manager) Borrow(ctx context.Context, network string, addr netip.Addr, forName string) (string, error) {
	if !m.Provable() {
		return "", fmt.Errorf("%w: node %s borrows no address without a provable lease", ErrFenced, m.opts.Node)
	}
	lid := m.leaseID()
	rec, err := m.editBlock(ctx, network, addr, func(rec *BlockRecord) error {
		if rec.Owner == m.opts.Node {
			return fmt.Errorf("%w: %s is in block %s of this node", ErrOwnBlock, addr, rec.CIDR)
		}
		return m.take(rec, addr, forName, lid)
	})
	if err != nil {
		return rec.Owner, err
	}
	m.log.Info("address borrowed", "network", network, "addr", addr.String(), "for", forName, "from", rec.Owner)
	return rec.Owner, nil
}

// hold marks addr, kept for forName in a block of this node, as held by this
// node, by one compare-and-swap on the block record, before the ledger hands it
// to the pod: the owner's claim on its own kept address is decided in the
// datastore as a borrower's is, so a pod re-created elsewhere while its old
// sandbox restarts here (a split brain) gets the address on one node only. It
// fails with ErrBorrowed naming the node that holds it, ErrNotKept when it is not
// kept for forName, ErrNotOwner when the block is not this node's, and ErrFenced
// while the node lease cannot be proven. Holding it again succeeds.
func (m *Manager) hold(ctx context.Context, network string, addr netip.Addr, forName string) error {
	if !m.Provable() {
		return fmt.Errorf("%w: node %s holds no kept address without a provable lease", ErrFenced, m.opts.Node)
	}
	lid := m.leaseID()
	_, err := m.editBlock(ctx, network, addr, func(rec *BlockRecord) error {
		if rec.Owner != m.opts.Node {
			return fmt.Errorf("%w: block %s of %q is owned by %q, not by this node (%s)", ErrNotOwner, rec.CIDR, network, rec.Owner, m.opts.Node)
		}
		return m.take(rec, addr, forName, lid)
	})
	return err
}

// take sets this node as the holder of addr, kept for forName, in the block
// record rec (Borrow's and hold's edit): errNoChange when it holds it already
// under lease lid, ErrNotKept when the address is not kept for forName,
// ErrBorrowed naming the node that holds it.
func (m *Manager) take(rec *BlockRecord, addr netip.Addr, forName, lid string) error {
	i := rec.borrowIndex(addr)
	if i < 0 || rec.Borrows[i].For != forName {
		kept := "nobody"
		if i >= 0 {
			kept = rec.Borrows[i].For
		}
		return fmt.Errorf("%w: %s in block %s (owner %q) is kept for %s, not %s", ErrNotKept, addr, rec.CIDR, rec.Owner, kept, forName)
	}
	b := &rec.Borrows[i]
	switch {
	case b.Node == m.opts.Node && b.Holder == m.opts.Holder && b.Lease == lid:
		return errNoChange
	case b.Node != "" && b.Node != m.opts.Node:
		return fmt.Errorf("%w: %s (kept for %s) is borrowed by node %s", ErrBorrowed, addr, forName, b.Node)
	}
	b.Node, b.Holder, b.Lease = m.opts.Node, m.opts.Holder, lid
	return nil
}

// Return gives back to its block an address this node borrowed or held (the pod
// went): it stays kept for its pod, for any node to borrow again. Returning an
// address this node does not hold does nothing.
func (m *Manager) Return(ctx context.Context, network string, addr netip.Addr) error {
	_, err := m.editBlock(ctx, network, addr, func(rec *BlockRecord) error {
		i := rec.borrowIndex(addr)
		if i < 0 || rec.Borrows[i].Node != m.opts.Node {
			return errNoChange
		}
		b := &rec.Borrows[i]
		b.Node, b.Holder, b.Lease = "", "", ""
		return nil
	})
	if err == nil {
		m.log.Info("borrowed address returned", "network", network, "addr", addr.String())
	}
	return err
}

// returnDead ends the borrows of nodes found dead (due) in the block records kvs:
// the address stays kept for its pod. The same evidence as a block's reclaim, and
// the same compare-and-swap: a borrower that renewed in between is not touched
// (its lease is judged again at the next sweep).
func (m *Manager) returnDead(ctx context.Context, kvs []datastore.KV, due func(node string) bool) error {
	var errs []error
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			continue
		}
		for _, b := range rec.Borrows {
			if b.Node == "" || b.Node == m.opts.Node || !due(b.Node) {
				continue
			}
			dead := b.Node
			_, err := m.editBlock(ctx, rec.Network, b.Addr, func(r *BlockRecord) error {
				i := r.borrowIndex(b.Addr)
				if i < 0 || r.Borrows[i].Node != dead || r.Borrows[i].Lease != b.Lease {
					return errNoChange
				}
				r.Borrows[i].Node, r.Borrows[i].Holder, r.Borrows[i].Lease = "", "", ""
				return nil
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("ending the borrow of %s by dead node %s: %w", b.Addr, dead, err))
				continue
			}
			m.log.Warn("dead node's borrowed address returned to its block", "network", rec.Network, "addr", b.Addr.String(), "borrower", dead, "for", b.For)
		}
	}
	return errors.Join(errs...)
}
