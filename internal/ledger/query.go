package ledger

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/ipledger/ipledger/internal/pool"
)

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
	ls, ok := ps.held[ip]
	if !ok {
		return Key{}, false
	}
	return ls.Key, true
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
	// Retired are range sets the pool's ranges no longer include that still hold
	// live leases (PoolRecord.Retired), each with how many.
	Retired []RetiredSet `json:"retired,omitempty"`
	// Replaced is the pool's last replacement (PoolRecord.Replaced), or nil.
	Replaced *PoolReplacement `json:"replaced,omitempty"`
	// BlockBits are the block sizes of a cluster-scoped pool, nil in node mode.
	BlockBits []int `json:"blockBits,omitempty"`
}

// RetiredSet is a retired range set of a pool and the live leases holding an
// address in it (one address each: a lease has one per range set).
type RetiredSet struct {
	Ranges pool.RangeSet `json:"ranges"`
	Leases int           `json:"leases"`
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
	st := PoolStatus{Network: ps.rec.Network, Ranges: ps.rec.Ranges, InUse: len(ps.held), Available: true, Allocs: ps.rec.Allocations, Releases: ps.rec.Releases, BlockBits: slices.Clone(ps.rec.BlockBits)}
	if r := ps.rec.Replaced; r != nil {
		cp := *r
		st.Replaced = &cp
	}
	for i, set := range ps.rec.Retired {
		st.Retired = append(st.Retired, RetiredSet{Ranges: set, Leases: ps.retiredHeld[i]})
	}
	mono := l.opts.Clock.Mono()
	for i, s := range ps.sets {
		if s.bits != 0 {
			// the node's share: its blocks that are not lost
			var usable uint64
			ok := false
			for _, b := range s.order {
				if b.rec.State != BlockLost {
					usable += b.usable
				}
				ok = ok || b.rec.State == BlockActive && b.rec.NextFresh < b.size
			}
			st.Usable = append(st.Usable, usable)
			st.Free += len(s.index)
			if top := s.free.top(); top != nil && mono-top.mono >= l.opts.ReuseDelay {
				ok = true
			}
			st.Available = st.Available && ok
			continue
		}
		st.Usable = append(st.Usable, s.usable)
		st.Free += s.free.Len()
		ok := ps.rec.NextFresh[i] < s.size
		if top := s.free.top(); top != nil && mono-top.mono >= l.opts.ReuseDelay {
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

// FreeAddresses returns the released addresses of network waiting to be reused (each
// with its release time), in no particular order; nil for an unknown network. It reads
// the in-memory index only (operator views: metrics, the pool page).
func (l *Ledger) FreeAddresses(network string) []Free {
	l.mu.Lock()
	defer l.mu.Unlock()
	ps := l.pools[network]
	if ps == nil {
		return nil
	}
	var out []Free
	for _, s := range ps.sets {
		for _, it := range s.index {
			out = append(out, it.f)
		}
	}
	return out
}

// ReuseDelay is the least time between an address's release and its allocation to
// another pod.
func (l *Ledger) ReuseDelay() time.Duration { return l.opts.ReuseDelay }
