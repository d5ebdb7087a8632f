package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Claiming ahead. An ADD that finds its node's blocks of a range set full claims a
// block before it is answered: a compare-and-swap through the datastore, and every
// other ADD of the node that finds them full waits for it (claimMu). Under a burst
// of pods that wait is paid by a queue of ADDs at once. So once the addresses the
// node's active blocks of a set can still hand out fall below a quarter of a block,
// the manager claims that set's next block in the background, and the ADDs that
// follow find room. It claims at most one block before it is needed, never the
// pool's last claimable block (another node may have none), never while the lease
// is not provable or the network's block copy is not live, and a set whose claim
// ahead failed waits an Interval before the next try. handBack keeps an empty block
// whose hand-back would leave the set below the same mark, so the two never undo
// each other.

// setRoom is what a node's active blocks of one range set can still hand out.
type setRoom struct {
	free   uint64 // addresses not held by a lease nor withheld
	block  uint64 // the largest active block's usable addresses
	active int    // active blocks
}

// low reports whether the set's free addresses are below a quarter of a block.
func (r setRoom) low() bool { return r.active > 0 && r.free < max(r.block/4, 1) }

// roomOf sums the node's active blocks by range set, from the ledger's view.
func roomOf(blocks []ledger.BlockStatus) map[setKey]setRoom {
	out := map[setKey]setRoom{}
	for _, b := range blocks {
		if b.State != ledger.BlockActive {
			continue
		}
		k := setKey{b.Network, b.Set}
		r := out[k]
		r.active++
		r.block = max(r.block, b.Usable)
		if taken := uint64(b.Used + b.Withheld); taken < b.Usable {
			r.free += b.Usable - taken
		}
		out[k] = r
	}
	return out
}

// setKey names one range set of a network.
type setKey struct {
	network string
	set     int
}

// wantAhead notes network for a claim ahead when one of its range sets runs low
// and wakes the background goroutine (Allocate calls it after each new lease).
func (m *Manager) wantAhead(network string) {
	low := false
	for _, r := range roomOf(m.l.Blocks(network)) {
		low = low || r.low()
	}
	if !low {
		return
	}
	m.mu.Lock()
	m.aheadWanted[network] = true
	m.mu.Unlock()
	select {
	case m.ahead <- struct{}{}:
	default:
	}
}

// aheadLoop claims ahead whenever wantAhead asks, until Stop.
func (m *Manager) aheadLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.ahead:
		}
		if _, err := m.ClaimAhead(ctx); err != nil {
			m.log.Warn("claiming a block ahead failed", "err", err)
		}
	}
}

// ClaimAhead claims one block of every range set that wantAhead noted and that is
// still low (the background goroutine calls it; tests with Options.Manual call it
// themselves). It returns the blocks claimed and the claims that failed.
func (m *Manager) ClaimAhead(ctx context.Context) (int, error) {
	m.mu.Lock()
	nets := make([]string, 0, len(m.aheadWanted))
	for n := range m.aheadWanted {
		nets = append(nets, n)
	}
	clear(m.aheadWanted)
	m.mu.Unlock()
	if !m.Provable() {
		return 0, nil // a claim would be refused; Allocate claims once it is provable
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	claimed := 0
	var errs []error
	now := m.mono()
	for _, network := range nets {
		m.mu.Lock()
		cfg, ok := m.nets[network]
		m.mu.Unlock()
		if !ok {
			continue
		}
		// read after claimMu: an ADD's own claim may have just made room
		room := roomOf(m.l.Blocks(network))
		for set := range cfg.Ranges {
			k := setKey{network, set}
			if !room[k].low() || now < m.aheadRetry[k] || !m.spareBlock(cfg, k) {
				continue
			}
			if err := m.claim(ctx, network, set); err != nil {
				m.aheadRetry[k] = now + m.opts.Interval
				errs = append(errs, fmt.Errorf("network %q range set %d: %w", network, set, err))
				continue
			}
			delete(m.aheadRetry, k)
			m.counts.claims.Add(1)
			m.counts.claimsAhead.Add(1)
			claimed++
		}
	}
	return claimed, errors.Join(errs...)
}

// spareBlock reports whether the network's live block copy shows at least two
// blocks of the set that nobody owns (free, or never claimed), so that claiming one
// ahead leaves one for a node that has none. No live copy: false (no LIST for a
// claim that is not needed yet). It looks at most at the known blocks and two more.
func (m *Manager) spareBlock(cfg PoolRecord, k setKey) bool {
	blocks, live := m.cachedBlocks(k.network)
	if !live {
		return false
	}
	ranges, bits := cfg.Ranges[k.set], cfg.BlockBits[k.set]
	owned := map[netip.Prefix]bool{}
	for _, b := range blocks {
		if b.err == nil && b.rec.Owner != "" {
			owned[b.rec.CIDR] = true
		}
	}
	spare := 0
	var from netip.Addr
	for tries := 0; tries <= len(owned)+2; tries++ {
		p, ok := ranges.NextBlock(bits, from)
		if !ok {
			break
		}
		from = pool.LastAddr(p).Next()
		if !owned[p] && ranges.Clip(p).Usable() > 0 {
			if spare++; spare == 2 {
				return true
			}
		}
	}
	return false
}

// Prepare sets network up as EnsureNetwork does and claims one block of each of
// its range sets in which the node has no active block, so that the node's first
// ADDs find room instead of waiting, all of them, for the first one's set-up and
// claim. The agent calls it at start with the conflist the node's pods use. It
// claims by the rule of claiming ahead: never the pool's last unowned block (a
// node with none may need it; this node's first ADD then claims it as before).
// With no live copy of the network's blocks it lists them and starts their watch,
// as the first claim would. It returns the blocks claimed; an error wraps
// ErrFenced while the lease is not provable (the caller tries again).
func (m *Manager) Prepare(ctx context.Context, network string, ranges []pool.RangeSet, blockBits []int) (int, error) {
	if err := m.EnsureNetwork(ctx, network, ranges, blockBits); err != nil {
		return 0, err
	}
	if !m.Provable() {
		return 0, fmt.Errorf("%w: node %s claims no block without a provable lease", ErrFenced, m.opts.Node)
	}
	m.claimMu.Lock()
	defer m.claimMu.Unlock()
	m.mu.Lock()
	cfg := m.nets[network]
	m.mu.Unlock()
	// read after claimMu: an ADD may have claimed meanwhile
	room := roomOf(m.l.Blocks(network))
	claimed := 0
	for set := range cfg.Ranges {
		k := setKey{network, set}
		if room[k].active > 0 {
			continue
		}
		if _, live := m.cachedBlocks(network); !live {
			if _, err := m.relist(ctx, network); err != nil {
				return claimed, err
			}
		}
		if !m.spareBlock(cfg, k) {
			m.log.Info("not claiming the pool's last unowned block before it is needed", "network", network, "set", set)
			continue
		}
		if err := m.claim(ctx, network, set); err != nil {
			return claimed, fmt.Errorf("network %q range set %d: %w", network, set, err)
		}
		m.counts.claims.Add(1)
		m.counts.claimsAhead.Add(1)
		claimed++
	}
	return claimed, nil
}
