package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// StickyPod names a StatefulSet pod whose addresses follow it from node to node.
type StickyPod struct {
	Namespace, StatefulSet, Pod string
	// Reservations are the IPReservations in force at the ADD: a kept address
	// AllocateRequest.Exclude covers is named by the one holding it.
	Reservations []Reservation
}

// For is the pod's name in a block record's Borrows: "namespace/statefulset/pod".
func (p StickyPod) For() string { return p.Namespace + "/" + p.StatefulSet + "/" + p.Pod }

// keptAddr is one address kept for a pod, and the block's owner.
type keptAddr struct {
	addr  netip.Addr
	owner string
}

// keptFor reads the addresses of network kept for forName, from the watched copy
// of every block when it runs; when the copy shows none (it may lag a Keep made
// a moment ago on another node), or runs not, from one List.
func (m *Manager) keptFor(ctx context.Context, network, forName string) ([]keptAddr, error) {
	if kvs, ok := m.owners.records(); ok {
		if out := keptIn(kvs, network, forName); len(out) > 0 {
			return out, nil
		}
	}
	kvs, _, err := m.listBlocks(ctx, BlocksPrefix(network))
	if err != nil {
		return nil, fmt.Errorf("listing blocks of %q: %w", network, err)
	}
	return keptIn(kvs, network, forName), nil
}

// keptIn is the addresses of network kept for forName in the block records kvs.
func keptIn(kvs []datastore.KV, network, forName string) []keptAddr {
	var out []keptAddr
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil || rec.Network != network {
			continue
		}
		for _, b := range rec.Borrows {
			if b.For == forName {
				out = append(out, keptAddr{addr: b.Addr, owner: rec.Owner})
			}
		}
	}
	return out
}

// AllocateSticky allocates req for the StatefulSet pod pod: the addresses kept for
// it when there are, else new ones, which are then kept for it. A kept address is
// held in its block record first, by compare-and-swap, by whichever node runs the
// pod: borrowed from the block of the node that keeps it, or held by that node
// itself; ErrBorrowed when another node holds one (its ADD fails and nothing is
// allocated). The lease's Why says which: "sticky for web-0 (StatefulSet
// default/web)" or "sticky for web-0, borrowed from node node2". An attachment
// that holds a lease gets it back.
func (m *Manager) AllocateSticky(ctx context.Context, req ledger.AllocateRequest, pod StickyPod) (ledger.Lease, bool, error) {
	if ls, ok := m.l.Lease(req.Key); ok {
		return ls, true, nil
	}
	if pod.Namespace == "" || pod.StatefulSet == "" || pod.Pod == "" {
		return ledger.Lease{}, false, fmt.Errorf("%w: sticky pod %q: namespace, StatefulSet and pod name are all needed", ErrNotKept, pod.For())
	}
	m.stickyMu.Lock() // no orphan sweep between a hold and its lease
	defer m.stickyMu.Unlock()
	network := req.Key.Network
	kept, err := m.keptFor(ctx, network, pod.For())
	if err != nil {
		return ledger.Lease{}, false, err
	}
	kept, ended, err := m.endReserved(ctx, network, kept, req.Exclude, pod)
	if err != nil {
		return ledger.Lease{}, false, err
	}
	if len(kept) == 0 {
		req.Why = withEnded(fmt.Sprintf("sticky for %s (StatefulSet %s/%s)", pod.Pod, pod.Namespace, pod.StatefulSet), ended)
		ls, existed, err := m.Allocate(ctx, req)
		if err != nil || existed {
			return ls, existed, err
		}
		for _, p := range ls.IPs {
			if kerr := m.keep(ctx, network, p.Addr(), pod.For(), true); kerr != nil {
				// not kept: the pod must not start with an address that would not
				// follow it (the runtime retries the ADD)
				if _, _, rerr := m.l.Release(req.Key, ledger.ReasonDEL, "sticky address could not be kept: "+kerr.Error()); rerr != nil {
					kerr = errors.Join(kerr, rerr)
				}
				return ledger.Lease{}, false, fmt.Errorf("keeping %s for %s: %w", p.Addr(), pod.For(), kerr)
			}
		}
		return ls, false, nil
	}
	var held []netip.Addr
	var from []string
	giveBack := func() {
		for _, a := range held {
			if err := m.Return(ctx, network, a); err != nil {
				m.log.Warn("returning a held address after a failed allocation", "addr", a.String(), "err", err)
			}
		}
	}
	for _, k := range kept {
		req.Want, req.Sticky = append(req.Want, k.addr), true
		owner, err := k.owner, error(nil)
		if owner == m.opts.Node {
			err = m.hold(ctx, network, k.addr, pod.For())
		}
		if owner != m.opts.Node || errors.Is(err, ErrNotOwner) {
			owner, err = m.Borrow(ctx, network, k.addr, pod.For())
			if errors.Is(err, ErrOwnBlock) { // the block became this node's since the read
				owner, err = m.opts.Node, m.hold(ctx, network, k.addr, pod.For())
			}
		}
		if err != nil {
			giveBack()
			return ledger.Lease{}, false, err
		}
		held = append(held, k.addr)
		if owner != m.opts.Node {
			from = append(from, owner)
		}
	}
	req.Why = fmt.Sprintf("sticky for %s (StatefulSet %s/%s)", pod.Pod, pod.Namespace, pod.StatefulSet)
	if len(from) > 0 {
		req.Why = fmt.Sprintf("sticky for %s, borrowed from node %s", pod.Pod, strings.Join(slices.Compact(from), ", "))
	}
	req.Why = withEnded(req.Why, ended)
	ls, existed, err := m.Allocate(ctx, req)
	if err != nil {
		giveBack()
		return ledger.Lease{}, false, err
	}
	if existed {
		return ls, existed, nil
	}
	// a family whose kept address a reservation ended got a fresh address: it is
	// kept for the pod from now on
	for _, p := range ls.IPs {
		if slices.Contains(held, p.Addr()) {
			continue
		}
		if kerr := m.keep(ctx, network, p.Addr(), pod.For(), true); kerr != nil {
			if _, _, rerr := m.l.Release(req.Key, ledger.ReasonDEL, "sticky address could not be kept: "+kerr.Error()); rerr != nil {
				kerr = errors.Join(kerr, rerr)
			}
			giveBack()
			return ledger.Lease{}, false, fmt.Errorf("keeping %s for %s: %w", p.Addr(), pod.For(), kerr)
		}
	}
	return ls, false, nil
}

// errLive: a kept address is held by a pod (endReserved leaves it kept).
var errLive = errors.New("held by a live pod")

// endReserved ends the keeping of each address of kept that exclude covers (an
// IPReservation, ipam.exclude) and that no pod holds: the record forgets it, by
// compare-and-swap, and when the block is this node's its ledger stops
// withholding it (the owner's sweep does that for another node's block). It
// returns the addresses still kept, and one line per ended keeping naming its
// reason ("10.0.0.5 reserved by IPReservation db"). An address a pod holds (on
// another node, or a lease of this node's ledger) stays kept: a reservation never
// takes an address from a live pod. An error (the datastore could not say)
// fails the allocation, and nothing is ended on a guess.
func (m *Manager) endReserved(ctx context.Context, network string, kept []keptAddr, exclude []netip.Prefix, pod StickyPod) ([]keptAddr, []string, error) {
	var left []keptAddr
	var ended []string
	for _, k := range kept {
		if !slices.ContainsFunc(exclude, func(p netip.Prefix) bool { return p.Contains(k.addr) }) {
			left = append(left, k)
			continue
		}
		why := "excluded by ipam.exclude"
		if r, ok := Covering(pod.Reservations, k.addr); ok {
			why = "reserved by IPReservation " + r.Name
		}
		rec, err := m.editBlock(ctx, network, k.addr, func(rec *BlockRecord) error {
			i := rec.borrowIndex(k.addr)
			if i < 0 || rec.Borrows[i].For != pod.For() {
				return errNoChange
			}
			if b := rec.Borrows[i]; b.Node != "" && (b.Node != m.opts.Node || m.holds(network, k.addr)) {
				return fmt.Errorf("%w: %s (kept for %s) is held by node %s", errLive, k.addr, b.For, b.Node)
			}
			rec.Borrows = slices.Delete(rec.Borrows, i, i+1)
			return nil
		})
		if errors.Is(err, errLive) {
			left = append(left, k)
			continue
		}
		if err != nil {
			return nil, nil, fmt.Errorf("ending the keeping of %s for %s (%s): %w", k.addr, pod.For(), why, err)
		}
		if rec.Owner == m.opts.Node {
			if err := m.unwithhold(network, k.addr); err != nil {
				return nil, nil, err
			}
		}
		m.log.Info("sticky address no longer kept: reserved", "network", network, "addr", k.addr.String(), "for", pod.For(), "why", why, "owner", rec.Owner)
		ended = append(ended, fmt.Sprintf("%s %s", k.addr, why))
	}
	return left, ended, nil
}

// WhyNoLongerKept begins the part of a sticky lease's Why that names the kept
// addresses a reservation ended at its allocation: "sticky for web-0 (StatefulSet
// default/web); no longer kept: 10.0.0.5 reserved by IPReservation db".
const WhyNoLongerKept = "; no longer kept: "

// withEnded is a sticky lease's Why with the keepings a reservation ended,
// bounded to ledger.MaxWhyLen.
func withEnded(why string, ended []string) string {
	if len(ended) == 0 {
		return why
	}
	why += WhyNoLongerKept + strings.Join(ended, ", ")
	if len(why) > ledger.MaxWhyLen {
		why = why[:ledger.MaxWhyLen-3] + "..."
	}
	return why
}

// unwithhold lets this node's ledger hand addr out again (no longer kept; a
// lease holding it keeps it).
func (m *Manager) unwithhold(network string, addr netip.Addr) error {
	p, err := m.blockOfAddr(network, addr)
	if err != nil {
		return err
	}
	withheld := m.l.Withheld(network, p)
	if i := slices.Index(withheld, addr); i >= 0 {
		return m.l.SetWithheld(network, p, slices.Delete(withheld, i, i+1))
	}
	return nil
}

// ReturnBorrowed returns to their blocks the kept addresses of a lease this node
// released (the pod's DEL): those it borrowed and those of its own blocks it held.
// They stay kept for the pod. An address a lease of the ledger holds again (the
// pod's next sandbox on this node took it since) is not returned. A failure is
// retried by the sweep (returnOrphans). A lease with no kept address costs no
// datastore call.
func (m *Manager) ReturnBorrowed(ctx context.Context, released ledger.Lease) error {
	cand := m.keptOf(released)
	if len(cand) == 0 {
		return nil
	}
	m.stickyMu.Lock() // no hold between the ledger's word and the return
	defer m.stickyMu.Unlock()
	var errs []error
	for _, a := range cand {
		if m.holds(released.Key.Network, a) {
			continue
		}
		errs = append(errs, m.Return(ctx, released.Key.Network, a))
	}
	return errors.Join(errs...)
}

// keptOf is the addresses of ls this node may hold in a block record: those it
// borrowed, and those of its own blocks its ledger withholds (kept). It reads only
// the ledger.
func (m *Manager) keptOf(ls ledger.Lease) []netip.Addr {
	out := slices.Clone(ls.Borrowed)
	for _, p := range ls.IPs {
		a := p.Addr()
		if slices.Contains(out, a) {
			continue
		}
		b, err := m.blockOfAddr(ls.Key.Network, a)
		if err == nil && slices.Contains(m.l.Withheld(ls.Key.Network, b), a) {
			out = append(out, a)
		}
	}
	return out
}

// ReleaseKept ends the keeping of every address kept for pod in this node's
// blocks (its StatefulSet was scaled down below it, or deleted): they go back to
// the node's free addresses after the reuse delay. One another node holds is left
// (ErrBorrowed in the result) until its borrower returns it.
func (m *Manager) ReleaseKept(ctx context.Context, network string, pod StickyPod) error {
	kept, err := m.keptFor(ctx, network, pod.For())
	if err != nil {
		return err
	}
	var errs []error
	for _, k := range kept {
		if k.owner == m.opts.Node {
			errs = append(errs, m.Unkeep(ctx, network, k.addr))
		}
	}
	return errors.Join(errs...)
}

// returnOrphans returns the addresses the block records kvs show held by this
// node (borrowed, or held in its own block) that no lease of its ledger holds (a
// Return that failed, a crash between a hold and its lease): the ledger is this
// node's own, so its word is complete. Its ledger stops withholding what its
// blocks' records no longer keep (unwithholdForgotten). It records the holds of this node's pods on
// addresses of its own blocks that the records do not show.
func (m *Manager) returnOrphans(ctx context.Context, kvs []datastore.KV) error {
	m.stickyMu.Lock()
	defer m.stickyMu.Unlock()
	var errs []error
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			continue
		}
		errs = append(errs, m.unwithholdForgotten(ctx, rec))
		for _, b := range rec.Borrows {
			held := m.holds(rec.Network, b.Addr)
			switch {
			case b.Node == m.opts.Node && !held:
				errs = append(errs, m.Return(ctx, rec.Network, b.Addr))
			case b.Node == "" && rec.Owner == m.opts.Node && held:
				// a pod of this node holds it, and the record does not say so
				// (a lease from before holds were recorded): say it, so that
				// no other node borrows it from under the pod
				if err := m.hold(ctx, rec.Network, b.Addr, b.For); err != nil && !errors.Is(err, ErrBorrowed) {
					errs = append(errs, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// unwithholdForgotten lets this node's ledger hand out again the addresses it
// withholds in its block rec that the record no longer keeps and no lease holds
// (another node ended their keeping: a reservation covers them). Called with
// stickyMu held; rec may be stale, so each candidate is judged again on a fresh
// read of the record.
func (m *Manager) unwithholdForgotten(ctx context.Context, rec BlockRecord) error {
	if rec.Owner != m.opts.Node {
		return nil
	}
	var cand []netip.Addr
	for _, a := range m.l.Withheld(rec.Network, rec.CIDR) {
		if rec.borrowIndex(a) < 0 && !m.holds(rec.Network, a) {
			cand = append(cand, a)
		}
	}
	if len(cand) == 0 {
		return nil
	}
	var kv datastore.KV
	err := m.call(ctx, func(ctx context.Context) (err error) {
		kv, err = m.ds.Get(ctx, BlockKey(rec.Network, rec.CIDR))
		return err
	})
	m.note(err)
	if err != nil {
		return fmt.Errorf("re-reading block %s of %q: %w", rec.CIDR, rec.Network, err)
	}
	cur, err := decodeBlock(kv)
	if err != nil || cur.Owner != m.opts.Node || cur.Epoch != rec.Epoch {
		return err // not this node's now: the block's loss settles its ledger
	}
	var errs []error
	for _, a := range cand {
		if cur.borrowIndex(a) >= 0 {
			continue
		}
		if err := m.unwithhold(rec.Network, a); err != nil {
			errs = append(errs, err)
			continue
		}
		m.log.Info("address no longer kept by its record (another node ended its keeping)", "network", rec.Network, "addr", a.String())
	}
	return errors.Join(errs...)
}

// holds: a lease of the ledger holds a.
func (m *Manager) holds(network string, a netip.Addr) bool {
	_, ok := m.l.Holder(network, a)
	return ok
}
