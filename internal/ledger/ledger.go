// Package ledger is ipledger's address ledger: for every network's pool it knows which
// attachment holds each address, since when, and why every earlier holder let it go.
//
// The ledger keeps indexes in memory for O(log n) allocation and release and persists
// every change to a Store in one transaction that is durable before the call returns.
// Allocation hands out the least recently released address first (never-used addresses
// count as released at the beginning of time) and never one released less than the
// reuse delay ago, except back to the pod UID that held it.
//
// Failures: an operation whose input is bad fails alone, before it joins a group
// commit (every field is checked and bounded first, see Validate). After any failed
// commit the in-memory books are read back from the store, never patched by guess.
package ledger

import (
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/pool"
)

// Options tune a Ledger. Zero values take the defaults.
type Options struct {
	// Clock gives wall time for records (lease creation, release dates) and
	// monotonic time for the reuse delay; default clock.NewSystem().
	Clock clock.Clock
	// ReuseDelay is the least time between the release of an address and its
	// allocation to another pod (invariant 9). It is measured on the monotonic
	// clock, so a wall-clock step neither shortens nor stretches it. An address
	// found released in the store at Open (or at a re-read after a failed commit)
	// counts as released at that moment, unless Boot says how long ago it was: after
	// a restart a freed address waits at most one reuse delay more than it had to,
	// never less.
	ReuseDelay time.Duration
	// Boot, when set, is read at every release and stored with the free address;
	// at Open, an address released earlier on the same boot waits only what is left
	// of its reuse delay (not a whole one again). Another boot, or no reading, counts
	// from Open as above. It is also read at every allocation and stored with the
	// lease (Lease.BootID, SinceBoot), from which the reconciler counts its age.
	Boot clock.Boot
	// HistoryKeep is how many releases are kept per address; default 32.
	HistoryKeep int
	// Logger receives one line per state change; default discards.
	Logger *slog.Logger
}

// Ledger is safe for concurrent use.
type Ledger struct {
	// qmu guards the queue of operations waiting for a group commit.
	qmu     sync.Mutex
	queue   []*opReq
	leading bool

	mu     sync.Mutex
	st     Store
	opts   Options
	log    *slog.Logger
	pools  map[string]*poolState
	leases map[Key]*Lease
	byUID  map[string][]Key // live leases by pod UID (usually one)
	// broken is set when a commit failed and the books could not be read back from
	// the store: every later change is refused with it (wrapping ErrStateUnknown).
	broken error
	// brokenC is closed when broken is set.
	brokenC chan struct{}
	// guard, when set, is asked before every allocation in a cluster-scoped pool.
	guard func(network string) error
}

type poolState struct {
	rec  PoolRecord
	sets []*setState
	// held maps every address of a live lease to that lease: the *Lease of
	// Ledger.leases, not a copy of its key (three strings in every slot of a map
	// with one slot per held address).
	held map[netip.Addr]*Lease
	// retiredHeld counts the held addresses in each range set of rec.Retired.
	retiredHeld []int
}

type setState struct {
	set    pool.RangeSet
	size   uint64 // addresses, gateways included
	usable uint64
	free   freeHeap
	index  map[netip.Addr]*freeItem
	byUID  map[string][]*freeItem // free addresses by the UID that last held them
	// cluster-scoped pools only: the block prefix length (0 in node mode) and the
	// node's blocks, by prefix and in address order.
	bits   int
	blocks map[netip.Prefix]*blockState
	order  []*blockState
}

// Open loads the ledger kept in st.
func Open(st Store, opts Options) (*Ledger, error) {
	if opts.Clock == nil {
		opts.Clock = clock.NewSystem()
	}
	if opts.HistoryKeep <= 0 {
		opts.HistoryKeep = 32
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Ledger{st: st, opts: opts, log: log, brokenC: make(chan struct{})}
	if err := l.load(nil); err != nil {
		return nil, err
	}
	return l, nil
}

// freeMark names one release of one address, to carry its monotonic reading over a
// re-read of the books.
type freeMark struct {
	network string
	ip      netip.Addr
	seq     uint64
}

// load reads the books from the store in one consistent view and replaces the
// in-memory ones. Released addresses take the monotonic reading of their release
// from keep when they are there (a re-read after a failed commit), else now's
// (conservative: the reuse delay starts again).
func (l *Ledger) load(keep map[freeMark]time.Duration) error {
	// the boot reading before the monotonic one: the time since a release comes
	// out short by the gap between them, never long (invariant 9)
	var bootID string
	var bootNow time.Duration
	bootOK := false
	if l.opts.Boot != nil {
		bootID, bootNow, bootOK = l.opts.Boot.Boot()
	}
	now := l.opts.Clock.Mono()
	pools := map[string]*poolState{}
	var leases map[Key]*Lease
	var byUID map[string][]Key
	err := l.st.View(func(tx ReadTx) error {
		nLeases := 0
		if err := tx.ForEachPool(func(p PoolRecord) error {
			ps, err := newPoolState(p)
			if err != nil {
				return fmt.Errorf("%w: pool %q: %v", ErrCorrupt, p.Network, err)
			}
			nLeases += ps.presize()
			pools[p.Network] = ps
			return nil
		}); err != nil {
			return err
		}
		if err := tx.ForEachBlock(func(b BlockRecord) error {
			ps := pools[b.Network]
			if ps == nil || ps.rec.BlockBits == nil || b.Set < 0 || b.Set >= len(ps.sets) {
				return fmt.Errorf("%w: block %s of %q has no cluster-scoped pool", ErrCorrupt, b.Prefix, b.Network)
			}
			s := ps.sets[b.Set]
			if b.Prefix.Bits() != s.bits || b.Prefix.Masked() != b.Prefix || !b.State.Valid() || s.blocks[b.Prefix] != nil {
				return fmt.Errorf("%w: block %s of %q: not a /%d block of range set %d, or state %q", ErrCorrupt, b.Prefix, b.Network, s.bits, b.Set, b.State)
			}
			bs, err := newBlockState(s.set, b)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrCorrupt, err)
			}
			s.insertBlock(bs)
			return nil
		}); err != nil {
			return err
		}
		// Sized from the pool records' counts, so that loading does not grow them
		// lease by lease: every growth rehashes the map and leaves its old table to
		// the GC, and Open's time is time the agent does not serve. Each lease of a
		// UID gets its own one-element slice of uids, so that indexUID's append
		// copies rather than writes into a neighbour.
		leases = make(map[Key]*Lease, nLeases)
		byUID = make(map[string][]Key, nLeases)
		uids := make([]Key, nLeases)
		if err := tx.ForEachLease(func(ls Lease) error {
			ps := pools[ls.PoolNetwork()]
			if ps == nil {
				return fmt.Errorf("%w: lease %s has no pool", ErrCorrupt, ls.Key)
			}
			c := ls
			leases[ls.Key] = &c
			if c.Pod.UID != "" {
				if u := byUID[c.Pod.UID]; u != nil || len(uids) == 0 {
					byUID[c.Pod.UID] = append(u, c.Key)
				} else {
					uids[0] = c.Key
					byUID[c.Pod.UID], uids = uids[:1:1], uids[1:]
				}
			}
			for _, p := range ls.IPs {
				if other, dup := ps.held[p.Addr()]; dup {
					return fmt.Errorf("%w: %s is held by both %s and %s", ErrCorrupt, p.Addr(), other.Key, ls.Key)
				}
				ps.held[p.Addr()] = &c
				if ps.rec.BlockBits != nil && !slices.Contains(ls.Borrowed, p.Addr()) {
					b := ps.blockOf(p.Addr())
					if b == nil {
						return fmt.Errorf("%w: lease %s holds %s outside the node's blocks", ErrCorrupt, ls.Key, p.Addr())
					}
					b.held++
					if b.rec.State != BlockLost {
						b.used(p.Addr())
					}
				}
			}
			return nil
		}); err != nil {
			return err
		}
		for _, ps := range pools {
			if err := ps.countRetired(); err != nil {
				return err
			}
		}
		return tx.ForEachFree(func(f Free) error {
			ps := pools[f.Network]
			if ps == nil || f.Set < 0 || f.Set >= len(ps.sets) {
				return fmt.Errorf("%w: free address %s of %q has no pool", ErrCorrupt, f.IP, f.Network)
			}
			if s := ps.sets[f.Set]; s.bits != 0 {
				b := s.blockOf(f.IP)
				if b == nil || b.rec.State == BlockLost {
					return fmt.Errorf("%w: free address %s of %q is outside the node's blocks", ErrCorrupt, f.IP, f.Network)
				}
				b.used(f.IP)
			}
			mono, ok := keep[freeMark{f.Network, f.IP, f.Seq}]
			switch {
			case f.neverUsed():
				mono = neverReleased // no pod held it: no reuse delay to wait
			case !ok:
				mono = now
				if bootOK && f.BootID == bootID && f.SinceBoot > 0 && f.SinceBoot <= bootNow {
					// released earlier on this boot: as long ago as CLOCK_BOOTTIME says
					mono = now - (bootNow - f.SinceBoot)
				}
			}
			ps.sets[f.Set].addFree(f, mono)
			return nil
		})
	})
	if err != nil {
		return err
	}
	l.pools, l.leases, l.byUID = pools, leases, byUID
	return nil
}

func newPoolState(p PoolRecord) (*poolState, error) {
	if err := pool.Validate(p.Ranges); err != nil {
		return nil, err
	}
	if len(p.NextFresh) != len(p.Ranges) {
		return nil, fmt.Errorf("nextFresh has %d entries for %d range sets", len(p.NextFresh), len(p.Ranges))
	}
	if p.BlockBits != nil && len(p.BlockBits) != len(p.Ranges) {
		return nil, fmt.Errorf("blockBits has %d entries for %d range sets", len(p.BlockBits), len(p.Ranges))
	}
	if len(p.Retired) > 0 {
		if p.BlockBits != nil {
			return nil, fmt.Errorf("a cluster-scoped pool has retired range sets")
		}
		if err := pool.Validate(p.Retired); err != nil {
			return nil, fmt.Errorf("retired range sets: %w", err)
		}
	}
	ps := &poolState{rec: p, held: map[netip.Addr]*Lease{}, retiredHeld: make([]int, len(p.Retired))}
	for i, set := range p.Ranges {
		s := newSetState(set)
		if p.BlockBits != nil {
			s.bits = p.BlockBits[i]
			s.blocks = map[netip.Prefix]*blockState{}
		}
		ps.sets = append(ps.sets, s)
	}
	return ps, nil
}

// newSetState is the empty state of a node-mode range set.
func newSetState(set pool.RangeSet) *setState {
	size := set.Size()
	usable := size
	for _, r := range set {
		if r.Gateway.IsValid() && set.Contains(r.Gateway) && usable > 0 && usable != math.MaxUint64 {
			usable--
		}
	}
	return &setState{set: set, size: size, usable: usable, index: map[netip.Addr]*freeItem{}, byUID: map[string][]*freeItem{}}
}

// setOf returns the index of the pool's range set holding a, or -1.
func (ps *poolState) setOf(a netip.Addr) int {
	for i, s := range ps.sets {
		if s.set.Contains(a) {
			return i
		}
	}
	return -1
}

// retiredOf returns the index of the pool's retired range set holding a, or -1.
func (ps *poolState) retiredOf(a netip.Addr) int {
	for i, set := range ps.rec.Retired {
		if set.Contains(a) {
			return i
		}
	}
	return -1
}

// countRetired counts the held addresses of each retired range set (at load): every
// held address outside the pool's range sets must be in one of them.
func (ps *poolState) countRetired() error {
	if len(ps.rec.Retired) == 0 {
		return nil
	}
	for a, ls := range ps.held {
		if ps.setOf(a) >= 0 {
			continue
		}
		r := ps.retiredOf(a)
		if r < 0 {
			return fmt.Errorf("%w: lease %s holds %s outside its pool", ErrCorrupt, ls.Key, a)
		}
		ps.retiredHeld[r]++
	}
	return nil
}

// blockOf returns the block of the pool holding a, or nil.
func (ps *poolState) blockOf(a netip.Addr) *blockState {
	for _, s := range ps.sets {
		if b := s.blockOf(a); b != nil {
			return b
		}
	}
	return nil
}

// presizeMax bounds the size hints taken from a pool record, so that a damaged count
// costs a failed Open (ErrCorrupt, from the records themselves), never a huge
// allocation.
const presizeMax = 1 << 22

// presize sizes the pool's maps for what its record says it holds (allocations minus
// releases are its live addresses; every lease holds one address per range set, and
// below the fresh cursor whatever is not held is free), and returns its lease count.
// The counts are hints: the records that follow decide.
func (ps *poolState) presize() int {
	p := &ps.rec
	if p.Releases > p.Allocations || len(ps.sets) == 0 {
		return 0
	}
	live := min(p.Allocations-p.Releases, presizeMax)
	ps.held = make(map[netip.Addr]*Lease, live)
	perSet := live / uint64(len(ps.sets))
	for i, s := range ps.sets {
		if i >= len(p.NextFresh) { // a cluster-scoped pool keeps its cursors per block
			break
		}
		if fresh := p.NextFresh[i]; fresh > perSet {
			n := int(min(fresh-perSet, s.size, presizeMax))
			s.index = make(map[netip.Addr]*freeItem, n)
			s.free = make(freeHeap, 0, n)
		}
	}
	return int(perSet)
}

func (s *setState) addFree(f Free, mono time.Duration) *freeItem {
	it := &freeItem{f: f, mono: mono}
	if b := s.blockOf(f.IP); b != nil {
		b.items[f.IP] = it
		it.parked = b.rec.State != BlockActive
	}
	if !it.parked {
		s.free.add(it)
	}
	s.index[f.IP] = it
	if f.LastUID != "" {
		s.byUID[f.LastUID] = append(s.byUID[f.LastUID], it)
	}
	return it
}

func (s *setState) removeFree(it *freeItem) {
	if b := s.blockOf(it.f.IP); b != nil {
		delete(b.items, it.f.IP)
	}
	if !it.parked {
		s.free.remove(it)
	}
	delete(s.index, it.f.IP)
	if it.f.LastUID != "" {
		s.byUID[it.f.LastUID] = removeItem(s.byUID[it.f.LastUID], it)
		if len(s.byUID[it.f.LastUID]) == 0 {
			delete(s.byUID, it.f.LastUID)
		}
	}
}

func (l *Ledger) indexUID(ls *Lease) {
	if ls.Pod.UID == "" {
		return
	}
	l.byUID[ls.Pod.UID] = append(l.byUID[ls.Pod.UID], ls.Key)
}

func (l *Ledger) unindexUID(ls *Lease) {
	if ls.Pod.UID == "" {
		return
	}
	l.byUID[ls.Pod.UID] = removeItem(l.byUID[ls.Pod.UID], ls.Key)
	if len(l.byUID[ls.Pod.UID]) == 0 {
		delete(l.byUID, ls.Pod.UID)
	}
}

// removeItem drops the first x from s, keeping order; the slices are tiny.
func removeItem[T comparable](s []T, x T) []T {
	for i, v := range s {
		if v == x {
			return append(s[:i:i], s[i+1:]...)
		}
	}
	return s
}

func cloneLease(ls *Lease) Lease {
	c := *ls
	c.IPs = append([]netip.Prefix(nil), ls.IPs...)
	c.Borrowed = slices.Clone(ls.Borrowed)
	return c
}

// Close closes the store.
func (l *Ledger) Close() error { return l.st.Close() }
