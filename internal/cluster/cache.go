package cluster

import (
	"context"
	"fmt"
	"sort"

	"github.com/ipledger/ipledger/internal/datastore"
)

// blockCache is the manager's copy of one network's block records, kept current by
// a datastore Watch from the revision of a List. A claim picks its candidates (free
// blocks, never-claimed prefixes) from it instead of listing every block of the
// network (on Kubernetes an unpaged LIST reads every custom resource from etcd: with
// hundreds of blocks, too slow for an ADD that claims one). Correctness does not
// rest on it: every claim is still a compare-and-swap (Update on the cached
// revision, Create of a block the cache does not know), so a stale copy costs a
// failed write and a retry, never a second owner. When the watch ends (compaction,
// a restarted apiserver, ctx) the copy is marked dead and the next claim lists
// again, as the datastore contract says.
type blockCache struct {
	kvs  map[string]cachedBlock // by key
	live bool                   // a watch started from the last List feeds kvs
	gen  uint64                 // bumped at every List: a watch of an older one changes nothing
	stop context.CancelFunc     // ends the watch of generation gen
	done chan struct{}          // closed when that watch's goroutine returns
}

type cachedBlock struct {
	kv  datastore.KV
	rec BlockRecord
	err error // the record did not decode
}

func newCachedBlock(kv datastore.KV) cachedBlock {
	rec, err := decodeBlock(kv)
	return cachedBlock{kv: kv, rec: rec, err: err}
}

// cachedBlocks returns the network's cached records in key order, and whether the
// cache is live (else the caller lists).
func (m *Manager) cachedBlocks(network string) ([]cachedBlock, bool) {
	m.cacheMu.Lock()
	defer m.cacheMu.Unlock()
	c := m.caches[network]
	if c == nil || !c.live {
		return nil, false
	}
	out := make([]cachedBlock, 0, len(c.kvs))
	for _, b := range c.kvs {
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].kv.Key < out[j].kv.Key })
	return out, true
}

// relist lists the network's blocks, replaces the cache with them and starts a watch
// from the list's revision (a failed Watch leaves the cache dead: the next claim
// lists again). It returns the records in key order.
func (m *Manager) relist(ctx context.Context, network string) ([]cachedBlock, error) {
	kvs, rev, err := m.listBlocks(ctx, BlocksPrefix(network))
	if err != nil {
		return nil, fmt.Errorf("listing blocks of %q: %w", network, err)
	}
	out := make([]cachedBlock, len(kvs))
	fresh := make(map[string]cachedBlock, len(kvs))
	for i, kv := range kvs {
		out[i] = newCachedBlock(kv)
		fresh[kv.Key] = out[i]
	}
	m.cacheMu.Lock()
	c := m.caches[network]
	if c == nil {
		c = &blockCache{}
		m.caches[network] = c
	}
	if c.stop != nil {
		// ends the old watch; its goroutine changes nothing any more (gen), so
		// the claim does not wait for it
		c.stop()
	}
	c.gen++
	c.kvs, c.live, c.stop, c.done = fresh, false, nil, nil
	gen := c.gen
	m.cacheMu.Unlock()
	// The watch outlives this claim: its context is the manager's, ended by Stop or
	// by the next relist.
	wctx, wcancel := context.WithCancel(context.Background())
	w, err := m.ds.Watch(wctx, BlocksPrefix(network), rev)
	if err != nil {
		wcancel()
		m.log.Warn("watching blocks failed; claims list them until a watch runs", "network", network, "err", err)
		return out, nil
	}
	done := make(chan struct{})
	m.cacheMu.Lock()
	if c.gen != gen { // a concurrent relist won (claimMu makes this rare)
		m.cacheMu.Unlock()
		wcancel()
		return out, nil
	}
	c.live, c.stop, c.done = true, wcancel, done
	m.cacheMu.Unlock()
	go m.follow(network, c, gen, w, done)
	return out, nil
}

// follow applies a watch's events to the cache until the watch ends, then marks the
// cache dead (unless a newer list replaced it).
func (m *Manager) follow(network string, c *blockCache, gen uint64, w datastore.Watch, done chan struct{}) {
	defer close(done)
	for ev := range w.Events() {
		m.cacheMu.Lock()
		if c.gen == gen {
			have, ok := c.kvs[ev.KV.Key]
			switch {
			case ok && have.kv.Revision >= ev.KV.Revision:
				// already newer (the manager's own write, recorded by cacheWrite)
			case ev.Type == datastore.Deleted:
				delete(c.kvs, ev.KV.Key)
			default:
				c.kvs[ev.KV.Key] = newCachedBlock(ev.KV)
			}
		}
		m.cacheMu.Unlock()
		m.blocksChanged()
	}
	m.cacheMu.Lock()
	if c.gen == gen {
		c.live = false
	}
	m.cacheMu.Unlock()
	if err := w.Err(); err != nil {
		m.log.Info("block watch ended; the next claim lists again", "network", network, "err", err)
	}
}

// cacheWrite records the manager's own successful write of one of network's blocks
// so that the next claim does not wait for the watch to bring it.
func (m *Manager) cacheWrite(network, key string, val []byte, rev int64) {
	m.cacheMu.Lock()
	defer m.cacheMu.Unlock()
	c := m.caches[network]
	if c == nil || !c.live {
		return
	}
	if have, ok := c.kvs[key]; !ok || have.kv.Revision < rev {
		c.kvs[key] = newCachedBlock(datastore.KV{Key: key, Value: val, Revision: rev})
	}
	m.blocksChanged()
}

// cacheDelete records the manager's own deletion of one of network's blocks.
func (m *Manager) cacheDelete(network, key string) {
	m.cacheMu.Lock()
	if c := m.caches[network]; c != nil && c.live {
		delete(c.kvs, key)
	}
	m.cacheMu.Unlock()
	m.blocksChanged()
}

func (m *Manager) blocksChanged() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// BlocksChanged receives a value after a block record of a network this node has
// set up changed (another node claimed, reclaimed or gave one back; this node
// wrote one), coalesced. Blocks of networks this node has not set up are seen by
// the caller's periodic Owners.
func (m *Manager) BlocksChanged() <-chan struct{} { return m.changed }

// stopWatches ends every block watch and waits for them (Stop).
func (m *Manager) stopWatches() {
	m.cacheMu.Lock()
	var dones []chan struct{}
	for _, c := range m.caches {
		if c.stop != nil {
			c.stop()
			dones = append(dones, c.done)
		}
		c.gen++
		c.live, c.stop, c.done = false, nil, nil
	}
	m.cacheMu.Unlock()
	for _, d := range dones {
		<-d
	}
}
