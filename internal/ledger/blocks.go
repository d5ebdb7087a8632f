package ledger

// Cluster-scoped pools. A network declared with DeclareCluster has cluster-wide
// ranges split into aligned blocks; this node allocates only inside the blocks it
// owns (AddBlock), each with its own fresh cursor, and the free addresses of all its
// active blocks share the range set's least-recently-released heap, so allocation
// stays O(log n) (plus a scan over the node's few blocks for a never-used address).
// Fencing: a suspended block's free addresses leave the heap (parked) until it is
// resumed; a lost block hands nothing out and its releases are recorded locally only.

import (
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/ipledger/ipledger/internal/attachment"
	"github.com/ipledger/ipledger/internal/pool"
)

// blockState is one block of a cluster-scoped range set in memory.
type blockState struct {
	rec    BlockRecord
	clip   pool.RangeSet // the range set cut to the block
	size   uint64
	usable uint64
	held   int
	items  map[netip.Addr]*freeItem // free addresses of the block
	gen    uint64                   // allocations from the block since it was loaded
	// withheld: addresses not handed out (SetWithheld); nil when none
	withheld map[netip.Addr]bool
	// removed is set when the block left the ledger within the current change (its
	// record is deleted; a later AddBlock makes a new blockState).
	removed bool
}

func newBlockState(set pool.RangeSet, rec BlockRecord) (*blockState, error) {
	clip := set.Clip(rec.Prefix)
	if len(clip) == 0 || clip.Usable() == 0 {
		return nil, fmt.Errorf("%w: %s holds no usable address of range set %d (%s)", ErrUnknownBlock, rec.Prefix, rec.Set, set.String())
	}
	return &blockState{rec: rec, clip: clip, size: clip.Size(), usable: clip.Usable(), items: map[netip.Addr]*freeItem{}}, nil
}

// used raises b's fresh cursor past a (an address found held or free at load): the
// cursor is persisted only with the block's other changes, and every address handed
// out below it is held or free, so the highest of them bounds it.
func (b *blockState) used(a netip.Addr) {
	if off, ok := b.clip.Offset(a); ok && off >= b.rec.NextFresh {
		b.rec.NextFresh = off + 1
	}
}

// blockOf returns the block of s holding a, or nil.
func (s *setState) blockOf(a netip.Addr) *blockState {
	if s.bits == 0 || a.BitLen() != s.set[0].Subnet.Addr().BitLen() {
		return nil
	}
	p, err := a.Prefix(s.bits)
	if err != nil {
		return nil
	}
	return s.blocks[p]
}

func (s *setState) insertBlock(b *blockState) {
	s.blocks[b.rec.Prefix] = b
	i, _ := slices.BinarySearchFunc(s.order, b, func(x, y *blockState) int { return x.rec.Prefix.Addr().Compare(y.rec.Prefix.Addr()) })
	s.order = slices.Insert(s.order, i, b)
}

func (s *setState) deleteBlock(b *blockState) {
	delete(s.blocks, b.rec.Prefix)
	s.order = removeItem(s.order, b)
}

// park takes the free addresses of b out of the heap (b stops handing them out).
func (s *setState) park(b *blockState) {
	for _, it := range b.items {
		if !it.parked {
			s.free.remove(it)
			it.parked = true
		}
	}
}

// unpark puts the free addresses of b back into the heap.
func (s *setState) unpark(b *blockState) {
	for _, it := range b.items {
		if it.parked {
			it.parked = false
			s.free.add(it)
		}
	}
}

// BlockCapacityError is the error of an allocation in a cluster-scoped pool whose
// range set Set has no address to hand out in the node's active blocks. It matches
// ErrNoBlockCapacity and ErrPoolExhausted with errors.Is.
type BlockCapacityError struct {
	Network string
	Set     int
	Blocks  int // active blocks of the range set
	Waiting int // free addresses of active blocks still inside the reuse delay
}

func (e *BlockCapacityError) Error() string {
	return fmt.Sprintf("%v: %v: network %q range set %d: no free address in the node's %d active blocks (%d more released less than the reuse delay ago); a new block must be claimed",
		ErrNoBlockCapacity, ErrPoolExhausted, e.Network, e.Set, e.Blocks, e.Waiting)
}

// Is makes the error match ErrNoBlockCapacity and ErrPoolExhausted.
func (e *BlockCapacityError) Is(target error) bool {
	return target == ErrNoBlockCapacity || target == ErrPoolExhausted
}

// SetAllocationGuard installs fn, called (under the ledger's lock) before every
// allocation in a cluster-scoped pool; an allocation fails with its error (wrapped)
// when it returns one. The block manager refuses allocation through it once it can
// no longer prove its node lease, without waiting for SuspendBlock to commit.
func (l *Ledger) SetAllocationGuard(fn func(network string) error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.guard = fn
}

// DeclareCluster makes network's pool cluster-scoped: ranges are cluster-wide and
// range set i is split into blocks of prefix length blockBits[i]; the node hands out
// only addresses of the blocks added with AddBlock. It creates the pool when it does
// not exist; declaring again with the same ranges and block sizes does nothing. A
// node-mode pool of that name, or one with other ranges or block sizes, starts again
// as the cluster-scoped pool when no lease is live in it and is refused
// (ErrPoolConflict) while one is (replacePool).
func (l *Ledger) DeclareCluster(network string, ranges []pool.RangeSet, blockBits []int) error {
	if err := attachment.ValidateName(ErrInvalidAttachment, "network name", network, MaxNetworkLen); err != nil {
		return err
	}
	if err := pool.Validate(ranges); err != nil {
		return err
	}
	if len(blockBits) != len(ranges) {
		return fmt.Errorf("%w: network %q: %d block sizes for %d range sets", ErrPoolConflict, network, len(blockBits), len(ranges))
	}
	for i, set := range ranges {
		if err := set.CheckBlockBits(blockBits[i], fmt.Sprintf("blockSize (range set %d)", i)); err != nil {
			return err
		}
	}
	return l.do(func(c *change) error {
		if ps := l.pools[network]; ps != nil {
			if pool.Equal(ps.rec.Ranges, ranges) && ps.rec.BlockBits != nil && slices.Equal(ps.rec.BlockBits, blockBits) {
				return nil
			}
			return c.replacePool(ps, ranges, blockBits)
		}
		if err := l.checkDisjoint(network, ranges); err != nil {
			return err
		}
		rec := PoolRecord{Network: network, Ranges: ranges, Created: l.opts.Clock.Now().UTC(), NextFresh: make([]uint64, len(ranges)), BlockBits: slices.Clone(blockBits)}
		ps, err := newPoolState(rec)
		if err != nil {
			return err
		}
		l.pools[network] = ps
		c.onUndo(func() { delete(l.pools, network) })
		c.touchPool(ps)
		return nil
	})
}

// clusterBlock finds the set and the block state of prefix in network's
// cluster-scoped pool; b is nil when the ledger does not hold the block.
func (l *Ledger) clusterBlock(network string, prefix netip.Prefix) (*poolState, int, *blockState, error) {
	ps := l.pools[network]
	if ps == nil {
		return nil, 0, nil, fmt.Errorf("%w: %q", ErrUnknownNetwork, network)
	}
	if ps.rec.BlockBits == nil {
		return nil, 0, nil, fmt.Errorf("%w: network %q is not cluster-scoped", ErrUnknownBlock, network)
	}
	for i, s := range ps.sets {
		if prefix.Addr().BitLen() != s.set[0].Subnet.Addr().BitLen() || prefix.Bits() != s.bits {
			continue
		}
		if prefix.Masked() != prefix {
			return nil, 0, nil, fmt.Errorf("%w: %s is not aligned to /%d (use %s)", ErrUnknownBlock, prefix, s.bits, prefix.Masked())
		}
		if c := s.set.Clip(prefix); len(c) == 0 || c.Usable() == 0 {
			continue
		}
		return ps, i, s.blocks[prefix], nil
	}
	return nil, 0, nil, fmt.Errorf("%w: %s is not a block of network %q (blocks of /%v in ranges %s)", ErrUnknownBlock, prefix, network, ps.rec.BlockBits, pool.SetsString(ps.rec.Ranges))
}

// heldClusterBlock is clusterBlock for a block the ledger holds: ErrUnknownBlock when
// prefix is a block of network that it does not hold.
func (l *Ledger) heldClusterBlock(network string, prefix netip.Prefix) (*poolState, int, *blockState, error) {
	ps, i, b, err := l.clusterBlock(network, prefix)
	if err != nil {
		return nil, 0, nil, err
	}
	if b == nil {
		return nil, 0, nil, fmt.Errorf("%w: the ledger holds no block %s of %q", ErrUnknownBlock, prefix, network)
	}
	return ps, i, b, nil
}

// saveBlock remembers b's record before the current operation, to restore it if the
// operation is undone.
func (c *change) saveBlock(b *blockState) {
	if c.opBlocks[b] {
		return
	}
	c.opBlocks[b] = true
	old := b.rec
	c.onUndo(func() { b.rec = old })
}

// touchBlock marks b's record to be written at commit (saving it first).
func (c *change) touchBlock(b *blockState) {
	c.saveBlock(b)
	if !c.blocks[b] {
		c.blocks[b] = true
		c.onUndo(func() { delete(c.blocks, b) })
	}
}

// AddBlock makes the block prefix of network's cluster-scoped pool the node's, at
// epoch, and active: its addresses may be handed out (those never used here count as
// fresh). Adding a block the ledger holds updates its epoch and activates it (a lost
// block starts afresh; the leases it still holds keep their addresses); an epoch
// older than the block's is refused (ErrBlockEpoch). withheld, when given, become
// the block's withheld addresses in the same transaction (SetWithheld): none of them
// is handed out from the moment the block is.
func (l *Ledger) AddBlock(network string, prefix netip.Prefix, epoch uint64, withheld ...netip.Addr) error {
	return l.do(func(c *change) error {
		if err := l.addBlock(c, network, prefix, epoch); err != nil {
			return err
		}
		if withheld == nil {
			return nil
		}
		return l.setWithheld(c, network, prefix, withheld)
	})
}

func (l *Ledger) addBlock(c *change, network string, prefix netip.Prefix, epoch uint64) error {
	{
		ps, i, b, err := l.clusterBlock(network, prefix)
		if err != nil {
			return err
		}
		s := ps.sets[i]
		if b != nil {
			if epoch < b.rec.Epoch {
				return fmt.Errorf("%w: block %s of %q is at epoch %d; refusing to add it at older epoch %d", ErrBlockEpoch, prefix, network, b.rec.Epoch, epoch)
			}
			c.touchBlock(b)
			if b.rec.State == BlockLost {
				// afresh, but past the leases it still holds (the cursor's rule)
				b.rec.NextFresh = 0
				for a := range ps.held {
					if s.blockOf(a) == b {
						b.used(a)
					}
				}
			}
			was := b.rec.State
			b.rec.Epoch, b.rec.State = epoch, BlockActive
			if was == BlockSuspended {
				s.unpark(b)
				c.onUndo(func() { s.park(b) })
			}
			return nil
		}
		rec := BlockRecord{Network: network, Prefix: prefix, Set: i, Epoch: epoch, State: BlockActive, Added: l.opts.Clock.Now().UTC()}
		b, err = newBlockState(s.set, rec)
		if err != nil {
			return err
		}
		// leases of an earlier holding of the block (lost, then added again)
		for a := range ps.held {
			if s.blockOf(a) == nil && a.BitLen() == prefix.Addr().BitLen() && prefix.Contains(a) {
				b.held++
				b.used(a)
			}
		}
		s.insertBlock(b)
		c.onUndo(func() { s.deleteBlock(b) })
		c.touchBlock(b)
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelInfo, "block added", "network", network, "block", prefix.String(), "epoch", epoch)
		})
		return nil
	}
}

// forgetFrees forgets b's free addresses within c: they leave the free index and are
// deleted from the store (their history stays).
func (c *change) forgetFrees(s *setState, b *blockState) {
	for _, it := range b.items {
		f, m := it.f, it.mono
		s.removeFree(it)
		c.onUndo(func() { s.addFree(f, m) })
		c.write(func(tx Tx) error { return tx.DeleteFree(f.Network, f.IP) })
	}
}

// dropBlock removes b from the ledger within c: its free addresses are forgotten
// (forgetFrees) and its record deleted.
func (c *change) dropBlock(s *setState, b *blockState) {
	c.forgetFrees(s, b)
	s.deleteBlock(b)
	b.removed = true
	c.onUndo(func() { b.removed = false; s.insertBlock(b) })
	network, prefix := b.rec.Network, b.rec.Prefix
	c.write(func(tx Tx) error { return tx.DeleteBlock(network, prefix) })
}

// RemoveBlock takes the block out of the ledger: it hands nothing out any more and
// its free addresses are forgotten. It fails with ErrBlockInUse while a lease holds
// one of its addresses. Removing a block the ledger does not hold does nothing.
func (l *Ledger) RemoveBlock(network string, prefix netip.Prefix) error {
	return l.do(func(c *change) error {
		ps, i, b, err := l.clusterBlock(network, prefix)
		if err != nil || b == nil {
			return err
		}
		if b.held > 0 {
			return fmt.Errorf("%w: block %s of %q: %d addresses are held", ErrBlockInUse, prefix, network, b.held)
		}
		if len(b.withheld) > 0 {
			return fmt.Errorf("%w: block %s of %q: %d addresses are withheld (borrowed by another node or kept for a pod)", ErrBlockInUse, prefix, network, len(b.withheld))
		}
		c.dropBlock(ps.sets[i], b)
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelInfo, "block removed", "network", network, "block", prefix.String())
		})
		return nil
	})
}

// setBlockState changes the state of a block the ledger holds.
func (c *change) setBlockState(s *setState, b *blockState, st BlockState) {
	if b.rec.State == st {
		return
	}
	c.touchBlock(b)
	was := b.rec.State
	b.rec.State = st
	switch {
	case was == BlockActive && st == BlockSuspended:
		s.park(b)
		c.onUndo(func() { s.unpark(b) })
	case was == BlockSuspended && st == BlockActive:
		s.unpark(b)
		c.onUndo(func() { s.park(b) })
	}
}

// SuspendBlock stops handing out the block's addresses until ResumeBlock; releases of
// its addresses are still recorded (and kept free for when it resumes). Suspending a
// lost block does nothing.
func (l *Ledger) SuspendBlock(network string, prefix netip.Prefix) error {
	return l.do(func(c *change) error {
		ps, i, b, err := l.heldClusterBlock(network, prefix)
		if err != nil {
			return err
		}
		if b.rec.State == BlockActive {
			c.setBlockState(ps.sets[i], b, BlockSuspended)
		}
		return nil
	})
}

// SuspendAll suspends every active block of every cluster-scoped pool in one
// transaction (the node can no longer prove its lease).
func (l *Ledger) SuspendAll() error {
	return l.do(func(c *change) error {
		for _, ps := range l.pools {
			for _, s := range ps.sets {
				for _, b := range s.order {
					if b.rec.State == BlockActive {
						c.setBlockState(s, b, BlockSuspended)
					}
				}
			}
		}
		return nil
	})
}

// ResumeBlock hands the block's addresses out again after SuspendBlock, provided the
// block is still at epoch (the caller re-read it from the datastore); otherwise it
// fails with ErrBlockEpoch and the block stays suspended.
func (l *Ledger) ResumeBlock(network string, prefix netip.Prefix, epoch uint64) error {
	return l.do(func(c *change) error {
		ps, i, b, err := l.heldClusterBlock(network, prefix)
		if err != nil {
			return err
		}
		if b.rec.State == BlockLost || b.rec.Epoch != epoch {
			return fmt.Errorf("%w: block %s of %q is %s at epoch %d; not resumed at epoch %d", ErrBlockEpoch, prefix, network, b.rec.State, b.rec.Epoch, epoch)
		}
		if b.rec.State == BlockDraining {
			return nil // still the node's, and still draining
		}
		c.setBlockState(ps.sets[i], b, BlockActive)
		return nil
	})
}

// LoseBlock records that another node owns the block now: nothing is handed out from
// it again, its free addresses are forgotten, and the leases still in it are released
// locally only when their DEL comes (their addresses are not kept free here). The
// block leaves the ledger with its last lease (at once when it holds none).
func (l *Ledger) LoseBlock(network string, prefix netip.Prefix) error {
	return l.do(func(c *change) error {
		ps, i, b, err := l.clusterBlock(network, prefix)
		if err != nil || b == nil {
			return err
		}
		s := ps.sets[i]
		w := b.withheld
		b.withheld = nil // another node's block now: nothing of it to withhold here
		c.onUndo(func() { b.withheld = w })
		if b.held == 0 {
			c.dropBlock(s, b)
		} else {
			c.setBlockState(s, b, BlockLost)
			c.forgetFrees(s, b)
		}
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelWarn, "block lost to another node", "network", network, "block", prefix.String())
		})
		return nil
	})
}

// DrainBlock makes a block the ledger holds draining (BlockDraining): its range
// left the pool. Nothing is handed out from it again and its free addresses are
// forgotten (their history stays); its leases keep their addresses, and a release
// there keeps nothing free. The block stays until RemoveBlock takes it out once it
// holds no lease. Draining a draining or lost block does nothing.
func (l *Ledger) DrainBlock(network string, prefix netip.Prefix) error {
	return l.do(func(c *change) error {
		ps, i, b, err := l.heldClusterBlock(network, prefix)
		if err != nil {
			return err
		}
		if b.rec.State == BlockDraining || b.rec.State == BlockLost {
			return nil
		}
		c.touchBlock(b)
		b.rec.State = BlockDraining
		c.forgetFrees(ps.sets[i], b)
		held := b.held // read under the ledger's lock: the log line is written after it
		c.onCommit(func(at time.Time) {
			l.logAt(at, slog.LevelInfo, "block draining: its range left the pool", "network", network, "block", prefix.String(), "leases", held)
		})
		return nil
	})
}

// BlockStatus is one block of the node as the ledger holds it.
type BlockStatus struct {
	BlockRecord
	Usable uint64 `json:"usable"` // addresses of the block that can be handed out
	Used   int    `json:"used"`   // addresses held by leases
	Free   int    `json:"free"`   // released addresses kept for reuse
	// Withheld counts addresses not handed out (SetWithheld): borrowed by another
	// node or kept for a StatefulSet pod.
	Withheld int `json:"withheld,omitempty"`
	// Allocations counts the addresses handed out from the block since the ledger
	// was opened (not persisted): two observations of an empty block with the same
	// count saw it empty all along.
	Allocations uint64 `json:"-"`
}

// Blocks returns the blocks the node holds, of one network or (network "") all, by
// network and address.
func (l *Ledger) Blocks(network string) []BlockStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []BlockStatus
	for n, ps := range l.pools {
		if network != "" && n != network {
			continue
		}
		for _, s := range ps.sets {
			for _, b := range s.order {
				out = append(out, BlockStatus{BlockRecord: b.rec, Usable: b.usable, Used: b.held, Free: len(b.items), Withheld: len(b.withheld), Allocations: b.gen})
			}
		}
	}
	slices.SortFunc(out, func(a, b BlockStatus) int {
		if a.Network != b.Network {
			if a.Network < b.Network {
				return -1
			}
			return 1
		}
		return a.Prefix.Addr().Compare(b.Prefix.Addr())
	})
	return out
}

// pickBlock takes one address of cluster-scoped range set i: the pod's own last
// address when it is free in an active block, else one never used here from the
// first active block that has one, else the least recently released one of the active
// blocks past the reuse delay.
func (c *change) pickBlock(ps *poolState, i int, uid string, mono time.Duration, ex []netip.Prefix) (netip.Addr, error) {
	s := ps.sets[i]
	if uid != "" {
		var best *freeItem
		for _, it := range s.byUID[uid] {
			if !it.parked && !excluded(ex, it.f.IP) && (best == nil || it.f.Seq > best.f.Seq) {
				best = it
			}
		}
		if best != nil {
			return c.takeFree(s, best), nil
		}
	}
	// The node owns a few blocks; a linear scan over them finds the first with a
	// never-used address. The cursor moves in memory only: the block record is not
	// rewritten per allocation (a node-mode allocation writes no more than the pool
	// record either). Open derives it again from the held and free addresses, which
	// are exactly the ones handed out below it.
	active := 0
	for _, b := range s.order {
		if b.rec.State != BlockActive {
			continue
		}
		active++
		if b.rec.NextFresh < b.size {
			c.saveBlock(b)
			if a, ok := c.fresh(ps, i, b.clip, b.size, &b.rec.NextFresh, ex); ok {
				return a, nil
			}
		}
	}
	if top := c.topEligible(s, mono, ex); top != nil {
		return c.takeFree(s, top), nil
	}
	return netip.Addr{}, &BlockCapacityError{Network: ps.rec.Network, Set: i, Blocks: active, Waiting: s.free.Len()}
}
