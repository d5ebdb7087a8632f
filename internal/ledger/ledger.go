// Package ledger is ipledger's address ledger: for every network's pool it knows which
// attachment holds each address, since when, and why every earlier holder let it go.
//
// The ledger keeps indexes in memory for O(log n) allocation and release and persists
// every change to a Store in one transaction that is durable before the call returns.
// Allocation hands out the least recently released address first (never-used addresses
// count as released at the beginning of time) and never one released less than the
// reuse delay ago, except back to the pod UID that held it.
package ledger

import (
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/pool"
)

// Options tune a Ledger. Zero values take the defaults.
type Options struct {
	// Clock returns the current time; default time.Now.
	Clock func() time.Time
	// ReuseDelay is the least time between the release of an address and its
	// allocation to another pod (invariant 9).
	ReuseDelay time.Duration
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
}

type poolState struct {
	rec  PoolRecord
	sets []*setState
	held map[netip.Addr]Key
}

type setState struct {
	set    pool.RangeSet
	size   uint64 // addresses, gateways included
	usable uint64
	free   freeHeap
	index  map[netip.Addr]*freeItem
	byUID  map[string][]*freeItem // free addresses by the UID that last held them
}

// Open loads the ledger kept in st.
func Open(st Store, opts Options) (*Ledger, error) {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.HistoryKeep <= 0 {
		opts.HistoryKeep = 32
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	l := &Ledger{st: st, opts: opts, log: log, pools: map[string]*poolState{}, leases: map[Key]*Lease{}, byUID: map[string][]Key{}}
	err := st.View(func(tx ReadTx) error {
		if err := tx.ForEachPool(func(p PoolRecord) error {
			ps, err := newPoolState(p)
			if err != nil {
				return fmt.Errorf("%w: pool %q: %v", ErrCorrupt, p.Network, err)
			}
			l.pools[p.Network] = ps
			return nil
		}); err != nil {
			return err
		}
		if err := tx.ForEachLease(func(ls Lease) error {
			ps := l.pools[ls.Key.Network]
			if ps == nil {
				return fmt.Errorf("%w: lease %s has no pool", ErrCorrupt, ls.Key)
			}
			c := ls
			l.leases[ls.Key] = &c
			l.indexUID(&c)
			for _, p := range ls.IPs {
				if other, dup := ps.held[p.Addr()]; dup {
					return fmt.Errorf("%w: %s is held by both %s and %s", ErrCorrupt, p.Addr(), other, ls.Key)
				}
				ps.held[p.Addr()] = ls.Key
			}
			return nil
		}); err != nil {
			return err
		}
		return tx.ForEachFree(func(f Free) error {
			ps := l.pools[f.Network]
			if ps == nil || f.Set < 0 || f.Set >= len(ps.sets) {
				return fmt.Errorf("%w: free address %s of %q has no pool", ErrCorrupt, f.IP, f.Network)
			}
			ps.sets[f.Set].addFree(f)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

func newPoolState(p PoolRecord) (*poolState, error) {
	if err := pool.Validate(p.Ranges); err != nil {
		return nil, err
	}
	if len(p.NextFresh) != len(p.Ranges) {
		return nil, fmt.Errorf("nextFresh has %d entries for %d range sets", len(p.NextFresh), len(p.Ranges))
	}
	ps := &poolState{rec: p, held: map[netip.Addr]Key{}}
	for _, set := range p.Ranges {
		size := set.Size()
		usable := size
		for _, r := range set {
			if r.Gateway.IsValid() && set.Contains(r.Gateway) && usable > 0 && usable != math.MaxUint64 {
				usable--
			}
		}
		ps.sets = append(ps.sets, &setState{set: set, size: size, usable: usable, index: map[netip.Addr]*freeItem{}, byUID: map[string][]*freeItem{}})
	}
	return ps, nil
}

func (s *setState) addFree(f Free) *freeItem {
	it := &freeItem{f: f}
	s.free.add(it)
	s.index[f.IP] = it
	if f.LastUID != "" {
		s.byUID[f.LastUID] = append(s.byUID[f.LastUID], it)
	}
	return it
}

func (s *setState) removeFree(it *freeItem) {
	s.free.remove(it)
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

// change collects the writes of one transaction and the in-memory steps to undo if
// the commit fails. Several operations share one change when their requests arrive
// together (group commit); each operation's part can be undone on its own.
type change struct {
	l       *Ledger
	writes  []func(Tx) error
	undo    []func()
	after   []func() // run once the change is durable (log lines)
	pools   map[*poolState]bool
	opPools map[*poolState]bool // pools whose record the current operation saved
}

func (l *Ledger) begin() *change {
	return &change{l: l, pools: map[*poolState]bool{}, opPools: map[*poolState]bool{}}
}

func (c *change) write(fn func(Tx) error) { c.writes = append(c.writes, fn) }
func (c *change) onUndo(fn func())        { c.undo = append(c.undo, fn) }
func (c *change) onCommit(fn func())      { c.after = append(c.after, fn) }

type mark struct{ w, u, a int }

// mark starts an operation within the change.
func (c *change) mark() mark {
	c.opPools = map[*poolState]bool{}
	return mark{len(c.writes), len(c.undo), len(c.after)}
}

// rollbackTo undoes the operation begun at m, leaving earlier ones in place.
func (c *change) rollbackTo(m mark) {
	for i := len(c.undo) - 1; i >= m.u; i-- {
		c.undo[i]()
	}
	c.undo, c.writes, c.after = c.undo[:m.u], c.writes[:m.w], c.after[:m.a]
}

// touchPool marks a pool record to be written at commit, remembering its value
// before the current operation.
func (c *change) touchPool(ps *poolState) {
	if c.opPools[ps] {
		return
	}
	c.opPools[ps] = true
	old := ps.rec
	old.NextFresh = append([]uint64(nil), ps.rec.NextFresh...)
	c.onUndo(func() { ps.rec = old })
	if !c.pools[ps] {
		c.pools[ps] = true
		c.onUndo(func() { delete(c.pools, ps) })
	}
}

// commit writes the change in one durable transaction, or undoes all of it in memory.
func (c *change) commit() error {
	if len(c.writes) == 0 && len(c.pools) == 0 {
		return nil
	}
	err := c.l.st.Update(func(tx Tx) error {
		for ps := range c.pools {
			if err := tx.PutPool(ps.rec); err != nil {
				return err
			}
		}
		for _, w := range c.writes {
			if err := w(tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		c.rollbackTo(mark{})
		return err
	}
	for _, fn := range c.after {
		fn()
	}
	return nil
}

// opReq is one state change waiting for its commit.
type opReq struct {
	op   func(c *change) error
	err  error
	lead bool
	done chan struct{}
}

// do applies op to the ledger and returns once its change is durable (or has failed
// and been undone). Concurrent calls are committed together: the first caller leads,
// applies every operation queued so far in one transaction with one fsync, answers
// them all, and hands the lead to the next waiting caller. Each operation sees the
// effects of those before it; one that fails is undone alone.
func (l *Ledger) do(op func(c *change) error) error {
	r := &opReq{op: op, done: make(chan struct{})}
	l.qmu.Lock()
	l.queue = append(l.queue, r)
	lead := !l.leading
	l.leading = true
	l.qmu.Unlock()
	if !lead {
		<-r.done
		if !r.lead {
			return r.err
		}
	}
	l.qmu.Lock()
	batch := l.queue
	l.queue = nil
	l.qmu.Unlock()

	l.mu.Lock()
	c := l.begin()
	for _, q := range batch {
		m := c.mark()
		if err := q.op(c); err != nil {
			c.rollbackTo(m)
			q.err = err
		}
	}
	err := c.commit()
	l.mu.Unlock()

	for _, q := range batch {
		if err != nil && q.err == nil {
			q.err = err
		}
		if q != r {
			close(q.done)
		}
	}
	l.qmu.Lock()
	if len(l.queue) > 0 {
		next := l.queue[0]
		next.lead = true
		close(next.done)
	} else {
		l.leading = false
	}
	l.qmu.Unlock()
	return r.err
}

// ensurePool returns the pool of network, creating it (within c) from ranges when it
// does not exist. ranges may be nil to require an existing pool.
func (c *change) ensurePool(network string, ranges []pool.RangeSet) (*poolState, error) {
	l := c.l
	if ps := l.pools[network]; ps != nil {
		if ranges != nil && !pool.Equal(ps.rec.Ranges, ranges) {
			return nil, fmt.Errorf("%w: network %q already has ranges %v; a config for the same network name must use the same ranges (use another network name for a new pool, or release every lease of %q first)", ErrPoolConflict, network, setsString(ps.rec.Ranges), network)
		}
		return ps, nil
	}
	if ranges == nil {
		return nil, fmt.Errorf("%w: %q has no pool; an ADD with its ranges creates it", ErrUnknownNetwork, network)
	}
	if err := pool.Validate(ranges); err != nil {
		return nil, err
	}
	rec := PoolRecord{Network: network, Ranges: ranges, Created: l.opts.Clock().UTC(), NextFresh: make([]uint64, len(ranges))}
	ps, err := newPoolState(rec)
	if err != nil {
		return nil, err
	}
	l.pools[network] = ps
	c.onUndo(func() { delete(l.pools, network) })
	c.touchPool(ps)
	return ps, nil
}

func setsString(sets []pool.RangeSet) string {
	s := "["
	for i, set := range sets {
		if i > 0 {
			s += " "
		}
		s += "[" + set.String() + "]"
	}
	return s + "]"
}

// AllocateRequest asks for the addresses of one attachment.
type AllocateRequest struct {
	Key   Key
	Pod   Pod
	NetNS NetNS
	// Ranges of the network's pool; the pool is created on first use and a later
	// request with other ranges fails with ErrPoolConflict. Nil uses the existing pool.
	Ranges []pool.RangeSet
	// Supersede names leases (of the same pod) to release, reason superseded, in the
	// same transaction before allocating, so the pod may keep its address.
	Supersede []Key
}

// Allocate gives the attachment one address from every range set of its network's
// pool. It is idempotent: an attachment that already holds a lease gets that lease
// back (existed is true) and nothing changes.
func (l *Ledger) Allocate(req AllocateRequest) (lease Lease, existed bool, err error) {
	if err := req.Key.Validate(); err != nil {
		return Lease{}, false, err
	}
	err = l.do(func(c *change) error {
		if ls, ok := l.leases[req.Key]; ok {
			if req.Ranges != nil && !pool.Equal(l.pools[req.Key.Network].rec.Ranges, req.Ranges) {
				return fmt.Errorf("%w: network %q already has ranges %v; a config for the same network name must use the same ranges", ErrPoolConflict, req.Key.Network, setsString(l.pools[req.Key.Network].rec.Ranges))
			}
			lease, existed = cloneLease(ls), true
			return nil
		}
		ps, err := c.ensurePool(req.Key.Network, req.Ranges)
		if err != nil {
			return err
		}
		now := l.opts.Clock().UTC()
		for _, k := range req.Supersede {
			if k == req.Key {
				continue
			}
			if _, ok := l.leases[k]; ok {
				if err := c.release(k, ReasonSuperseded, "superseded by "+req.Key.ContainerID, now); err != nil {
					return err
				}
			}
		}
		ls := &Lease{Key: req.Key, Pod: req.Pod, NetNS: req.NetNS, Created: now, State: StateActive}
		for i := range ps.sets {
			a, err := c.pick(ps, i, req.Pod.UID, now)
			if err != nil {
				return err
			}
			r, _ := ps.sets[i].set.RangeOf(a)
			ls.IPs = append(ls.IPs, netip.PrefixFrom(a, r.Subnet.Bits()))
			ps.held[a] = req.Key
			c.onUndo(func() { delete(ps.held, a) })
		}
		c.touchPool(ps)
		ps.rec.Allocations += uint64(len(ls.IPs))
		l.leases[req.Key] = ls
		l.indexUID(ls)
		c.onUndo(func() { delete(l.leases, req.Key); l.unindexUID(ls) })
		lease = cloneLease(ls)
		snapshot := lease
		c.write(func(tx Tx) error { return tx.PutLease(snapshot) })
		c.onCommit(func() {
			l.log.Info("allocated", "attachment", req.Key.String(), "ips", fmt.Sprint(snapshot.IPs), "podUID", req.Pod.UID)
		})
		return nil
	})
	if err != nil {
		return Lease{}, false, err
	}
	return lease, existed, nil
}

// pick takes one address of range set i: the pod's own last address when it is free,
// else a never-used one, else the least recently released one past the reuse delay.
func (c *change) pick(ps *poolState, i int, uid string, now time.Time) (netip.Addr, error) {
	s := ps.sets[i]
	take := func(it *freeItem) netip.Addr {
		s.removeFree(it)
		f := it.f
		c.onUndo(func() { s.addFree(f) })
		c.write(func(tx Tx) error { return tx.DeleteFree(f.Network, f.IP) })
		return f.IP
	}
	if uid != "" {
		var best *freeItem
		for _, it := range s.byUID[uid] {
			if best == nil || it.f.Seq > best.f.Seq {
				best = it
			}
		}
		if best != nil {
			return take(best), nil
		}
	}
	c.touchPool(ps)
	for ps.rec.NextFresh[i] < s.size {
		off := ps.rec.NextFresh[i]
		ps.rec.NextFresh[i]++
		a, ok := s.set.Addr(off)
		if !ok {
			break
		}
		if s.set.Reserved(a) {
			continue
		}
		if _, held := ps.held[a]; held {
			continue
		}
		if _, free := s.index[a]; free {
			continue
		}
		return a, nil
	}
	if top := s.free.top(); top != nil && !now.Before(top.f.ReleasedAt.Add(c.l.opts.ReuseDelay)) {
		return take(top), nil
	}
	return netip.Addr{}, fmt.Errorf("%w: network %q range set %d (%s): all %d usable addresses are in use (%d more released less than the reuse delay of %s ago)",
		ErrPoolExhausted, ps.rec.Network, i, s.set.String(), s.usable, s.free.Len(), c.l.opts.ReuseDelay)
}

// release frees every address of the lease k within c.
func (c *change) release(k Key, reason Reason, detail string, now time.Time) error {
	l := c.l
	ls := l.leases[k]
	ps := l.pools[k.Network]
	if ps == nil {
		return fmt.Errorf("%w: lease %s has no pool", ErrCorrupt, k)
	}
	c.touchPool(ps)
	for _, p := range ls.IPs {
		a := p.Addr()
		set := -1
		for i, s := range ps.sets {
			if s.set.Contains(a) {
				set = i
				break
			}
		}
		if set < 0 {
			return fmt.Errorf("%w: lease %s holds %s outside its pool", ErrCorrupt, k, a)
		}
		ps.rec.Seq++
		f := Free{Network: k.Network, IP: a, Set: set, ReleasedAt: now, Seq: ps.rec.Seq, LastUID: ls.Pod.UID}
		s := ps.sets[set]
		it := s.addFree(f)
		c.onUndo(func() { s.removeFree(it) })
		delete(ps.held, a)
		c.onUndo(func() { ps.held[a] = k })
		ps.rec.Releases++
		r := Release{Network: k.Network, IP: a, Key: k, Pod: ls.Pod, From: ls.Created, To: now, Reason: reason, Detail: detail, Seq: f.Seq}
		keep := l.opts.HistoryKeep
		c.write(func(tx Tx) error {
			if err := tx.PutFree(f); err != nil {
				return err
			}
			return tx.AppendHistory(r, keep)
		})
	}
	delete(l.leases, k)
	l.unindexUID(ls)
	c.onUndo(func() { l.leases[k] = ls; l.indexUID(ls) })
	c.write(func(tx Tx) error { return tx.DeleteLease(k) })
	return nil
}

// Release frees the lease of attachment k, recording reason. Releasing an attachment
// that holds nothing succeeds with released false (a DEL is idempotent).
func (l *Ledger) Release(k Key, reason Reason, detail string) (released Lease, ok bool, err error) {
	return l.releaseIf(k, reason, detail, func(*Lease) bool { return true })
}

// releaseIf releases the lease of k when cond holds for it.
func (l *Ledger) releaseIf(k Key, reason Reason, detail string, cond func(*Lease) bool) (released Lease, ok bool, err error) {
	if !reason.Valid() {
		return Lease{}, false, fmt.Errorf("release reason %q is not one of DEL, GC, reconcile-gone, reconcile-notready, superseded, manual", reason)
	}
	err = l.do(func(c *change) error {
		ls, held := l.leases[k]
		if !held || !cond(ls) {
			return nil
		}
		released, ok = cloneLease(ls), true
		if err := c.release(k, reason, detail, l.opts.Clock().UTC()); err != nil {
			return err
		}
		snapshot := released
		c.onCommit(func() {
			l.log.Info("released", "attachment", k.String(), "ips", fmt.Sprint(snapshot.IPs), "reason", string(reason), "detail", detail)
		})
		return nil
	})
	if err != nil {
		return Lease{}, false, err
	}
	return released, ok, nil
}

func cloneLease(ls *Lease) Lease {
	c := *ls
	c.IPs = append([]netip.Prefix(nil), ls.IPs...)
	return c
}

// Lease returns the lease of attachment k.
func (l *Ledger) Lease(k Key) (Lease, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ls, ok := l.leases[k]
	if !ok {
		return Lease{}, false
	}
	return cloneLease(ls), true
}

// Leases returns every live lease, of one network or (network "") all, sorted by key.
func (l *Ledger) Leases(network string) []Lease {
	l.mu.Lock()
	out := make([]Lease, 0, len(l.leases))
	for _, ls := range l.leases {
		if network == "" || ls.Key.Network == network {
			out = append(out, cloneLease(ls))
		}
	}
	l.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return keyLess(out[i].Key, out[j].Key) })
	return out
}

func keyLess(a, b Key) bool {
	if a.Network != b.Network {
		return a.Network < b.Network
	}
	if a.ContainerID != b.ContainerID {
		return a.ContainerID < b.ContainerID
	}
	return a.IfName < b.IfName
}

// LeasesOfPod returns the live leases of pod uid in network.
func (l *Ledger) LeasesOfPod(network, uid string) []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Lease
	for _, k := range l.byUID[uid] {
		if k.Network == network {
			out = append(out, cloneLease(l.leases[k]))
		}
	}
	sort.Slice(out, func(i, j int) bool { return keyLess(out[i].Key, out[j].Key) })
	return out
}

// Holder returns the attachment holding ip in network.
func (l *Ledger) Holder(network string, ip netip.Addr) (Key, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.pools[network]
	if ps == nil {
		return Key{}, false
	}
	k, ok := ps.held[ip]
	return k, ok
}

// PoolStatus describes a network's pool.
type PoolStatus struct {
	Network   string          `json:"network"`
	Ranges    []pool.RangeSet `json:"ranges"`
	Usable    []uint64        `json:"usable"`    // per range set, gateways excluded
	InUse     int             `json:"inUse"`     // addresses held
	Free      int             `json:"free"`      // released addresses
	Available bool            `json:"available"` // an ADD could be served now
	Allocs    uint64          `json:"allocations"`
	Releases  uint64          `json:"releases"`
}

// Pool returns the status of network's pool.
func (l *Ledger) Pool(network string) (PoolStatus, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.pools[network]
	if ps == nil {
		return PoolStatus{}, fmt.Errorf("%w: %q", ErrUnknownNetwork, network)
	}
	return l.poolStatus(ps), nil
}

// Pools returns the status of every pool, sorted by network.
func (l *Ledger) Pools() []PoolStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]PoolStatus, 0, len(l.pools))
	for _, ps := range l.pools {
		out = append(out, l.poolStatus(ps))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Network < out[j].Network })
	return out
}

func (l *Ledger) poolStatus(ps *poolState) PoolStatus {
	st := PoolStatus{Network: ps.rec.Network, Ranges: ps.rec.Ranges, InUse: len(ps.held), Available: true, Allocs: ps.rec.Allocations, Releases: ps.rec.Releases}
	now := l.opts.Clock()
	for i, s := range ps.sets {
		st.Usable = append(st.Usable, s.usable)
		st.Free += s.free.Len()
		ok := ps.rec.NextFresh[i] < s.size
		if top := s.free.top(); top != nil && !now.Before(top.f.ReleasedAt.Add(l.opts.ReuseDelay)) {
			ok = true
		}
		st.Available = st.Available && ok
	}
	return st
}

// History returns the releases of ip in network, oldest first.
func (l *Ledger) History(network string, ip netip.Addr) ([]Release, error) {
	var out []Release
	err := l.st.View(func(tx ReadTx) error {
		var err error
		out, err = tx.History(network, ip)
		return err
	})
	return out, err
}

// Close closes the store.
func (l *Ledger) Close() error { return l.st.Close() }
