package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/nodenet"
)

// Status is the node's cluster-mode health for one network (CNI STATUS).
type Status struct {
	Network   string `json:"network"`
	Provable  bool   `json:"provable"`  // the node lease is provable: its blocks hand out addresses
	Reachable bool   `json:"reachable"` // the last datastore call succeeded
	Available bool   `json:"available"` // an ADD can be served from the node's blocks without a new one
	// Degraded: no address can be handed out without claiming a new block, and no
	// block can be claimed now (datastore unreachable or lease not provable).
	Degraded bool   `json:"degraded"`
	Blocks   int    `json:"blocks"` // active blocks
	Reason   string `json:"reason,omitempty"`
}

// Status reports the network's state for the agent's STATUS.
func (m *Manager) Status(network string) Status {
	st := Status{Network: network, Provable: m.Provable()}
	m.mu.Lock()
	st.Reachable = m.reachable
	lastErr := m.lastErr
	_, known := m.nets[network]
	m.mu.Unlock()
	for _, b := range m.l.Blocks(network) {
		if b.State == ledger.BlockActive {
			st.Blocks++
		}
	}
	if p, err := m.l.Pool(network); err == nil {
		st.Available = p.Available && st.Blocks > 0 && st.Provable
	}
	switch {
	case !known:
		st.Degraded, st.Reason = true, "network not set up for cluster mode yet"
	case st.Available:
	case !st.Provable:
		st.Degraded, st.Reason = true, "node lease not provable: no allocation until the datastore answers"
	case !st.Reachable:
		st.Degraded, st.Reason = true, fmt.Sprintf("no free address in the node's blocks and the datastore is unreachable (%v)", lastErr)
	}
	return st
}

// BlockView is one block of the cluster as `ipledgerctl blocks` shows it.
type BlockView struct {
	Network string       `json:"network"`
	CIDR    netip.Prefix `json:"cidr"`
	Owner   string       `json:"owner"`
	Epoch   uint64       `json:"epoch"`
	// Borrows: the block's addresses kept for StatefulSet pods, and their borrowers.
	Borrows []Borrow `json:"borrows,omitempty"`
	// Local: the block is this node's; State, Used, Free and Usable come from its ledger.
	Local  bool              `json:"local"`
	State  ledger.BlockState `json:"state,omitempty"`
	Used   int               `json:"used"`
	Free   int               `json:"free"`
	Usable uint64            `json:"usable"`
}

// Blocks lists every block in the datastore, the node's own with their ledger
// counts, and blocks the ledger holds that the datastore does not give the node
// (lost ones still holding leases), by network and address.
func (m *Manager) Blocks(ctx context.Context) ([]BlockView, error) {
	kvs, _, err := m.listBlocks(ctx, BlocksPrefix(""))
	if err != nil {
		return nil, fmt.Errorf("listing blocks: %w", err)
	}
	type k struct {
		n string
		p netip.Prefix
	}
	local := map[k]ledger.BlockStatus{}
	for _, b := range m.l.Blocks("") {
		local[k{b.Network, b.Prefix}] = b
	}
	m.mu.Lock()
	nets := make(map[string]PoolRecord, len(m.nets))
	for n, p := range m.nets {
		nets[n] = p
	}
	m.mu.Unlock()
	var out []BlockView
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			continue
		}
		v := BlockView{Network: rec.Network, CIDR: rec.CIDR, Owner: rec.Owner, Epoch: rec.Epoch, Borrows: rec.Borrows}
		if b, ok := local[k{rec.Network, rec.CIDR}]; ok && rec.Owner == m.opts.Node {
			v.Local, v.State, v.Used, v.Free, v.Usable = true, b.State, b.Used, b.Free, b.Usable
			delete(local, k{rec.Network, rec.CIDR})
		} else if p := nets[rec.Network]; rec.Set >= 0 && rec.Set < len(p.Ranges) {
			v.Usable = p.Ranges[rec.Set].Clip(rec.CIDR).Usable()
		}
		out = append(out, v)
	}
	for _, b := range local {
		out = append(out, BlockView{Network: b.Network, CIDR: b.Prefix, Owner: m.opts.Node + " (ledger only)", Epoch: b.Epoch, Local: true, State: b.State, Used: b.Used, Free: b.Free, Usable: b.Usable})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Network != out[j].Network {
			return out[i].Network < out[j].Network
		}
		if c := out[i].CIDR.Addr().Compare(out[j].CIDR.Addr()); c != 0 {
			return c < 0
		}
		return out[i].Owner < out[j].Owner
	})
	return out, nil
}

// Owners lists every block of the cluster with its owner (empty: free), for the
// routes between nodes. While WatchOwners' watch runs, the answer is its watched
// copy and costs no datastore call (the node network asks at every change and every
// resync); otherwise one List of the block records. An error means the owners are
// unknown, never that there are none.
func (m *Manager) Owners(ctx context.Context) ([]nodenet.Block, error) {
	if out, ok := m.owners.blocks(); ok {
		return out, nil
	}
	kvs, _, err := m.listBlocks(ctx, BlocksPrefix(""))
	if err != nil {
		return nil, fmt.Errorf("listing blocks: %w", err)
	}
	out := make([]nodenet.Block, 0, len(kvs))
	for _, kv := range kvs {
		out = appendOwners(out, kv)
	}
	return out, nil
}

// appendOwners appends a block record's prefix and owner, and each of its borrowed
// addresses with its borrower (nodenet.Block.Borrowed); nothing for a record this
// release cannot read (no route rather than a wrong one).
func appendOwners(out []nodenet.Block, kv datastore.KV) []nodenet.Block {
	rec, err := decodeBlock(kv)
	if err != nil {
		return out
	}
	out = append(out, nodenet.Block{Prefix: rec.CIDR, Owner: rec.Owner})
	for _, b := range rec.Borrows {
		if b.Node != "" && b.Node != rec.Owner { // the owner's own hold is the block's route
			out = append(out, nodenet.Block{Prefix: netip.PrefixFrom(b.Addr, b.Addr.BitLen()), Owner: b.Node, Borrowed: true})
		}
	}
	return out
}

// ownersCopy is WatchOwners' copy of every block record of the cluster: filled by
// a List, kept current by a Watch from the List's revision, and trusted (live) only
// while that watch runs.
type ownersCopy struct {
	mu   sync.Mutex
	live bool
	kvs  map[string]datastore.KV // by key
}

// reset replaces the copy with a List's records and marks it live.
func (o *ownersCopy) reset(kvs []datastore.KV) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kvs = make(map[string]datastore.KV, len(kvs))
	for _, kv := range kvs {
		o.kvs[kv.Key] = kv
	}
	o.live = true
}

// apply records a watch event.
func (o *ownersCopy) apply(ev datastore.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if ev.Type == datastore.Deleted {
		delete(o.kvs, ev.KV.Key)
		return
	}
	if have, ok := o.kvs[ev.KV.Key]; !ok || have.Revision < ev.KV.Revision {
		o.kvs[ev.KV.Key] = ev.KV
	}
}

// dead marks the copy untrusted: its watch ended.
func (o *ownersCopy) dead() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.live, o.kvs = false, nil
}

// blocks returns the copy's blocks in key order, and whether it is live.
func (o *ownersCopy) blocks() ([]nodenet.Block, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.live {
		return nil, false
	}
	keys := make([]string, 0, len(o.kvs))
	for k := range o.kvs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]nodenet.Block, 0, len(keys))
	for _, k := range keys {
		out = appendOwners(out, o.kvs[k])
	}
	return out, true
}

// get returns the copy's record of key (ok false when it has none), and whether
// the copy is live.
func (o *ownersCopy) get(key string) (kv datastore.KV, ok, live bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.live {
		return datastore.KV{}, false, false
	}
	kv, ok = o.kvs[key]
	return kv, ok, true
}

// records returns the copy's records, and whether it is live.
func (o *ownersCopy) records() ([]datastore.KV, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.live {
		return nil, false
	}
	out := make([]datastore.KV, 0, len(o.kvs))
	for _, kv := range o.kvs {
		out = append(out, kv)
	}
	return out, true
}

// WatchOwners keeps the copy of every block record of the cluster that Owners
// answers from, and makes BlocksChanged fire on every change of one until ctx ends,
// those of networks this node has not set up included: a node without a pod of a
// network must route the blocks other nodes claim in it as soon as they do, not at
// its next resync. It lists the blocks and watches them from the list's revision,
// and does both again when the watch breaks (Owners lists meanwhile), after a pause
// that doubles up to 30s while the watches keep breaking within a minute. Run it
// once, in a goroutine of its own.
func (m *Manager) WatchOwners(ctx context.Context) {
	pause := time.Second
	for {
		began := time.Now()
		err := m.watchOwnersOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(began) > time.Minute {
			pause = time.Second
		}
		m.log.Info("the watch of every block ended; the node network sees new owners at its resync until it runs again", "err", err, "retry", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}

// watchOwnersOnce lists the blocks and follows their changes until the watch ends.
func (m *Manager) watchOwnersOnce(ctx context.Context) error {
	kvs, rev, err := m.listBlocks(ctx, BlocksPrefix(""))
	if err != nil {
		return err
	}
	w, err := m.ds.Watch(ctx, BlocksPrefix(""), rev)
	if err != nil {
		return err
	}
	m.owners.reset(kvs)
	defer m.owners.dead()
	m.blocksChanged() // whatever changed before the list
	for ev := range w.Events() {
		m.owners.apply(ev)
		m.blocksChanged()
	}
	return w.Err()
}
