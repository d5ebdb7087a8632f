package ledger

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/ipledger/ipledger/internal/pool"
)

// AuditReport is the result of checking the ledger's books.
type AuditReport struct {
	OK             bool             `json:"ok"`
	Live           int              `json:"live"`      // live leases
	Addresses      int              `json:"addresses"` // live addresses
	DoubleAssigned []DoubleAssigned `json:"doubleAssigned"`
	Problems       []string         `json:"problems"`
	Pools          []PoolAudit      `json:"pools"`
}

// DoubleAssigned is an address held by more than one live attachment.
type DoubleAssigned struct {
	Network string     `json:"network"`
	IP      netip.Addr `json:"ip"`
	Holders []Key      `json:"holders"`
}

// PoolAudit is the balance of one pool: Allocations = Releases + Live.
type PoolAudit struct {
	Network     string `json:"network"`
	Allocations uint64 `json:"allocations"`
	Releases    uint64 `json:"releases"`
	Live        uint64 `json:"live"`
	Free        uint64 `json:"free"`
}

type addrKey struct {
	network string
	ip      netip.Addr
}

// Audit reads the whole stored ledger and checks its invariants: no address held by
// two attachments or both held and free, every address inside its pool, the counts
// balance (allocations = releases + live, per pool), every address's history is a
// sequence of holdings in release order, and
// the in-memory indexes agree with what is stored.
//
// Audit never holds the ledger's lock while it reads the store, so allocations and
// releases proceed during an audit of any size: under the lock it copies the in-memory
// indexes and opens the store's read snapshot (every commit happens under that lock,
// so both show the same state), then releases the lock and checks the snapshot.
func (l *Ledger) Audit() (AuditReport, error) {
	rep := AuditReport{DoubleAssigned: []DoubleAssigned{}, Problems: []string{}}
	bad := func(format string, a ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...)) }
	holders := map[addrKey][]Key{}
	free := map[addrKey]Free{}
	pools := map[string]PoolRecord{}
	liveByPool := map[string]uint64{}
	storedLeases := map[Key]bool{}
	// addresses below the fresh cursor, held or free; and at set -1-i the held
	// addresses of retired set i
	accounted := map[poolSet]uint64{}
	lastRel := map[addrKey]Release{}
	blocks := map[blockKey]*blockAudit{}
	snapshot := make(chan struct{})
	viewed := make(chan error, 1)
	l.mu.Lock()
	mem := l.memIndex()
	go func() {
		viewed <- l.st.View(func(tx ReadTx) error {
			close(snapshot) // the read transaction is open: the lock may go
			return l.auditScan(tx, &rep, bad, holders, free, pools, liveByPool, storedLeases, accounted, lastRel, blocks)
		})
	}()
	var err error
	select {
	case <-snapshot:
		l.mu.Unlock()
		err = <-viewed
	case err = <-viewed: // the view failed before it began
		l.mu.Unlock()
	}
	if err != nil {
		return rep, err
	}
	auditCheck(&rep, bad, mem, holders, free, pools, liveByPool, storedLeases, accounted, lastRel, blocks)
	return rep, nil
}

// memIndex is a copy of the in-memory indexes, for Audit; l.mu must be held.
type memIndex struct {
	leases map[Key]bool
	held   map[string]map[netip.Addr]Key
	free   map[string][]netip.Addr
	blocks map[blockKey]BlockRecord
	// withheld: addresses of a block withheld (SetWithheld), in memory only
	withheld map[blockKey][]netip.Addr
}

func (l *Ledger) memIndex() memIndex {
	m := memIndex{leases: make(map[Key]bool, len(l.leases)), held: map[string]map[netip.Addr]Key{}, free: map[string][]netip.Addr{}, blocks: map[blockKey]BlockRecord{}}
	for k := range l.leases {
		m.leases[k] = true
	}
	for n, ps := range l.pools {
		h := make(map[netip.Addr]Key, len(ps.held))
		for ip, ls := range ps.held {
			h[ip] = ls.Key
		}
		m.held[n] = h
		for _, s := range ps.sets {
			for ip := range s.index {
				m.free[n] = append(m.free[n], ip)
			}
			for _, b := range s.order {
				m.blocks[blockKey{n, b.rec.Prefix}] = b.rec
				if len(b.withheld) > 0 {
					if m.withheld == nil {
						m.withheld = map[blockKey][]netip.Addr{}
					}
					m.withheld[blockKey{n, b.rec.Prefix}] = sortedAddrs(b.withheld)
				}
			}
		}
	}
	return m
}

type poolSet struct {
	network string
	set     int
}

// blockAudit is what the audit reads of one block of a cluster-scoped pool.
type blockAudit struct {
	rec       BlockRecord
	clip      pool.RangeSet
	accounted uint64 // held or free addresses at offsets below its fresh cursor
	held      int
	offsets   []uint64 // of the block's held and free addresses
}

type blockKey struct {
	network string
	prefix  netip.Prefix
}

// auditScan reads one snapshot of the store into Audit's maps.
func (l *Ledger) auditScan(tx ReadTx, rep *AuditReport, bad func(string, ...any), holders map[addrKey][]Key,
	free map[addrKey]Free, pools map[string]PoolRecord, liveByPool map[string]uint64, storedLeases map[Key]bool,
	accounted map[poolSet]uint64, lastRel map[addrKey]Release, blocks map[blockKey]*blockAudit) error {
	{
		if err := tx.ForEachPool(func(p PoolRecord) error { pools[p.Network] = p; return nil }); err != nil {
			return err
		}
		if err := tx.ForEachBlock(func(b BlockRecord) error {
			p, ok := pools[b.Network]
			switch {
			case !ok || p.BlockBits == nil:
				bad("block %s of %q: the network has no cluster-scoped pool", b.Prefix, b.Network)
			case b.Set < 0 || b.Set >= len(p.Ranges) || b.Prefix.Bits() != p.BlockBits[b.Set] || b.Prefix.Masked() != b.Prefix:
				bad("block %s of %q: not an aligned /%v block of range set %d", b.Prefix, b.Network, p.BlockBits, b.Set)
			case !b.State.Valid():
				bad("block %s of %q: state %q", b.Prefix, b.Network, b.State)
			default:
				clip := p.Ranges[b.Set].Clip(b.Prefix)
				if b.NextFresh > clip.Size() {
					bad("block %s of %q: fresh cursor %d past its %d addresses", b.Prefix, b.Network, b.NextFresh, clip.Size())
				}
				blocks[blockKey{b.Network, b.Prefix}] = &blockAudit{rec: b, clip: clip}
			}
			return nil
		}); err != nil {
			return err
		}
		// blockOf finds the block of a cluster-scoped pool holding ip.
		blockOf := func(network string, set int, ip netip.Addr) *blockAudit {
			p := pools[network]
			pf, err := ip.Prefix(p.BlockBits[set])
			if err != nil {
				return nil
			}
			return blocks[blockKey{network, pf}]
		}
		inSet := func(network string, ip netip.Addr) int {
			for i, set := range pools[network].Ranges {
				if set.Contains(ip) {
					return i
				}
			}
			return -1
		}
		inRetired := func(network string, ip netip.Addr) int {
			for i, set := range pools[network].Retired {
				if set.Contains(ip) {
					return i
				}
			}
			return -1
		}
		if err := tx.ForEachLease(func(ls Lease) error {
			storedLeases[ls.Key] = true
			pn := ls.PoolNetwork()
			rep.Live++
			if _, ok := pools[pn]; !ok {
				bad("lease %s: pool %q does not exist", ls.Key, pn)
				return nil
			}
			if err := ls.Key.Validate(); err != nil {
				bad("lease %s: %v", ls.Key, err)
			}
			// a lease made before the ranges changed may have a set more or fewer
			if p := pools[pn]; len(ls.IPs) != len(p.Ranges) && p.RangeChanges == 0 {
				bad("lease %s: %d addresses for %d range sets", ls.Key, len(ls.IPs), len(pools[pn].Ranges))
			}
			seen := map[int]bool{}
			for _, p := range ls.IPs {
				ak := addrKey{pn, p.Addr()}
				holders[ak] = append(holders[ak], ls.Key)
				rep.Addresses++
				liveByPool[pn]++
				set := inSet(pn, p.Addr())
				if r := inRetired(pn, p.Addr()); set < 0 && r >= 0 {
					accounted[poolSet{pn, -1 - r}]++ // retired sets count from -1 down
				} else if set < 0 {
					bad("lease %s: %s is outside the pool of %q", ls.Key, p.Addr(), pn)
				} else if seen[set] {
					bad("lease %s: two addresses from range set %d", ls.Key, set)
				} else if pools[pn].BlockBits != nil && slices.Contains(ls.Borrowed, p.Addr()) {
					seen[set] = true // lent by another node's block: not accounted here
				} else if pools[pn].BlockBits != nil {
					seen[set] = true
					b := blockOf(pn, set, p.Addr())
					if b == nil {
						bad("lease %s: %s is outside the node's blocks", ls.Key, p.Addr())
					} else {
						b.held++
						if off, ok := b.clip.Offset(p.Addr()); ok && b.rec.State != BlockLost {
							b.offsets = append(b.offsets, off)
						}
					}
				} else {
					seen[set] = true
					accounted[poolSet{pn, set}]++
					if off, _ := pools[pn].Ranges[set].Offset(p.Addr()); off >= pools[pn].NextFresh[set] {
						bad("lease %s: %s is past the pool's fresh cursor", ls.Key, p.Addr())
					}
				}
			}
			return nil
		}); err != nil {
			return err
		}
		if err := tx.ForEachFree(func(f Free) error {
			ak := addrKey{f.Network, f.IP}
			free[ak] = f
			if _, ok := holders[ak]; ok {
				bad("%s/%s is both free and held by %v", f.Network, f.IP, holders[ak])
			}
			if s := inSet(f.Network, f.IP); s != f.Set {
				bad("free %s/%s: recorded in range set %d, belongs to %d", f.Network, f.IP, f.Set, s)
			} else if pools[f.Network].BlockBits != nil {
				b := blockOf(f.Network, s, f.IP)
				switch {
				case b == nil:
					bad("free %s/%s is outside the node's blocks", f.Network, f.IP)
				case b.rec.State == BlockLost:
					bad("free %s/%s is in block %s, lost to another node", f.Network, f.IP, b.rec.Prefix)
				case b.rec.State == BlockDraining:
					bad("free %s/%s is in block %s, draining (its range left the pool)", f.Network, f.IP, b.rec.Prefix)
				default:
					if off, ok := b.clip.Offset(f.IP); ok {
						b.offsets = append(b.offsets, off)
					}
				}
			} else if off, _ := pools[f.Network].Ranges[s].Offset(f.IP); off >= pools[f.Network].NextFresh[s] {
				bad("free %s/%s is past the pool's fresh cursor", f.Network, f.IP)
			} else {
				accounted[poolSet{f.Network, s}]++
			}
			return nil
		}); err != nil {
			return err
		}
		var prev *Release
		return tx.ForEachHistory(func(r Release) error {
			lastRel[addrKey{r.Network, r.IP}] = r // releases of an address come oldest first
			if !r.Reason.Valid() {
				bad("history of %s/%s: release without a valid reason (%q)", r.Network, r.IP, r.Reason)
			}
			// Holdings are ordered by release sequence, not by their wall times: the
			// wall clock may step back between two holdings (or within one), and a
			// record's times then run backwards without anything being wrong.
			if prev != nil && prev.Network == r.Network && prev.IP == r.IP {
				if r.Seq <= prev.Seq {
					bad("history of %s/%s: holding by %s from %s overlaps the one by %s until %s", r.Network, r.IP, r.Key, r.From, prev.Key, prev.To)
				}
			}
			rc := r
			prev = &rc
			lastRel[addrKey{r.Network, r.IP}] = r
			return nil
		})
	}
}

// auditCheck checks what auditScan read against itself and against the copy of the
// in-memory indexes taken at the same point.
func auditCheck(rep *AuditReport, bad func(string, ...any), mem memIndex, holders map[addrKey][]Key,
	free map[addrKey]Free, pools map[string]PoolRecord, liveByPool map[string]uint64, storedLeases map[Key]bool,
	accounted map[poolSet]uint64, lastRel map[addrKey]Release, blocks map[blockKey]*blockAudit) {
	// last history entry per address against its free record
	for ak, r := range lastRel {
		if f, ok := free[ak]; ok && !f.neverUsed() && (f.Seq != r.Seq || !f.ReleasedAt.Equal(r.To)) {
			bad("%s/%s: free since %s (seq %d) but its last release is seq %d at %s", ak.network, ak.ip, f.ReleasedAt, f.Seq, r.Seq, r.To)
		}
	}
	for ak, f := range free {
		if _, ok := lastRel[ak]; !ok && !f.neverUsed() {
			bad("%s/%s is free but has no release in its history", ak.network, ak.ip)
		}
	}
	for ak, ks := range holders {
		if len(ks) > 1 {
			rep.DoubleAssigned = append(rep.DoubleAssigned, DoubleAssigned{Network: ak.network, IP: ak.ip, Holders: ks})
		}
	}
	sort.Slice(rep.DoubleAssigned, func(i, j int) bool { return rep.DoubleAssigned[i].IP.Less(rep.DoubleAssigned[j].IP) })
	freeByPool := map[string]uint64{}
	for ak := range free {
		freeByPool[ak.network]++
	}
	names := make([]string, 0, len(pools))
	for n := range pools {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := pools[n]
		pa := PoolAudit{Network: n, Allocations: p.Allocations, Releases: p.Releases, Live: liveByPool[n], Free: freeByPool[n]}
		rep.Pools = append(rep.Pools, pa)
		if p.Allocations != p.Releases+liveByPool[n] {
			bad("pool %q does not balance: %d allocations != %d releases + %d live", n, p.Allocations, p.Releases, liveByPool[n])
		}
		for i, set := range p.Retired {
			if accounted[poolSet{n, -1 - i}] == 0 {
				bad("pool %q retired range set %s holds no lease, yet is still recorded", n, set.String())
			}
		}
		if p.BlockBits != nil {
			continue // accounted per block below
		}
		// Every address the pool has handed out (offsets below its fresh cursor, but
		// gateways) is now either held or free; one that is neither is leaked for good.
		for i, set := range p.Ranges {
			want := p.NextFresh[i]
			gws := map[netip.Addr]bool{}
			for _, r := range set {
				if off, ok := set.Offset(r.Gateway); r.Gateway.IsValid() && ok && off < p.NextFresh[i] && !gws[r.Gateway] {
					gws[r.Gateway] = true
					want--
				}
			}
			if got := accounted[poolSet{n, i}]; got != want {
				bad("pool %q range set %d: %d addresses handed out, but %d are held or free; %d are neither (leaked)", n, i, want, got, int64(want)-int64(got))
			}
		}
	}
	// Every address a block handed out since it was added (offsets below its cursor,
	// but gateways) is held or free, as in a node-mode pool; a lost block keeps only
	// its leases and goes with the last of them.
	for bk, b := range blocks {
		if b.rec.State == BlockLost {
			if b.held == 0 {
				bad("block %s of %q is lost and holds no lease, yet is still recorded", bk.prefix, bk.network)
			}
			continue
		}
		if b.rec.State == BlockDraining {
			continue // its released addresses left the pool; it waits to be given back
		}
		// the cursor as Open derives it: the stored one, raised past every held or
		// free address
		for _, off := range b.offsets {
			if off >= b.rec.NextFresh {
				b.rec.NextFresh = off + 1
			}
		}
		for _, off := range b.offsets {
			if off < b.rec.NextFresh {
				b.accounted++
			}
		}
		// a withheld address neither held nor free is accounted for: lent to another
		// node or kept for a pod
		for _, a := range mem.withheld[bk] {
			_, h := holders[addrKey{bk.network, a}]
			_, f := free[addrKey{bk.network, a}]
			if off, ok := b.clip.Offset(a); ok && !h && !f && off < b.rec.NextFresh {
				b.accounted++
			}
		}
		want := b.rec.NextFresh
		gws := map[netip.Addr]bool{}
		for _, r := range b.clip {
			if off, ok := b.clip.Offset(r.Gateway); r.Gateway.IsValid() && ok && off < b.rec.NextFresh && !gws[r.Gateway] {
				gws[r.Gateway] = true
				want--
			}
		}
		if b.accounted != want {
			bad("block %s of %q: %d addresses handed out, but %d are held or free; %d are neither (leaked)", bk.prefix, bk.network, want, b.accounted, int64(want)-int64(b.accounted))
		}
		// The running ledger's cursor may be past the derived one (it skipped a
		// gateway, or addresses given back to it), never behind it.
		mb, ok := mem.blocks[bk]
		stored := b.rec
		if ok && mb.NextFresh >= stored.NextFresh {
			mb.NextFresh = stored.NextFresh
		}
		if !ok || mb != stored {
			bad("block %s of %q: memory has %+v, store %+v", bk.prefix, bk.network, mem.blocks[bk], stored)
		}
	}
	for bk := range mem.blocks {
		if blocks[bk] == nil {
			bad("block %s of %q in memory but not stored", bk.prefix, bk.network)
		}
	}
	// memory against store
	if len(storedLeases) != len(mem.leases) {
		bad("memory holds %d leases, store %d", len(mem.leases), len(storedLeases))
	}
	for k := range mem.leases {
		if !storedLeases[k] {
			bad("lease %s in memory but not stored", k)
		}
	}
	for n, held := range mem.held {
		for ip, k := range held {
			hs := holders[addrKey{n, ip}]
			if len(hs) == 0 || hs[0] != k {
				bad("memory says %s/%s is held by %s, store says %v", n, ip, k, hs)
			}
		}
		for _, ip := range mem.free[n] {
			if _, ok := free[addrKey{n, ip}]; !ok {
				bad("memory says %s/%s is free, store does not", n, ip)
			}
		}
	}
	rep.OK = len(rep.Problems) == 0 && len(rep.DoubleAssigned) == 0
}
