// Package memstore is an in-memory ledger.Store for unit tests. Update works on a copy
// and swaps it in on success, so a failing transaction leaves nothing behind, like the
// on-disk store.
package memstore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store"
)

// Store keeps the ledger in maps of JSON records (so it round-trips exactly as the
// on-disk store does).
type Store struct {
	mu     sync.RWMutex
	data   map[string]map[string][]byte
	closed bool
	// FailCommit, when set, makes the next commits fail with its error (tests).
	FailCommit error
}

var _ ledger.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store { return &Store{data: newData()} }

func newData() map[string]map[string][]byte {
	return map[string]map[string][]byte{"pools": {}, "leases": {}, "free": {}, "history": {}, "blocks": {}}
}

var errClosed = errors.New("memstore: closed")

// Update implements ledger.Store.
func (s *Store) Update(fn func(ledger.Tx) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errClosed
	}
	cp := newData()
	for b, m := range s.data {
		for k, v := range m {
			cp[b][k] = v
		}
	}
	if err := fn(&tx{data: cp, writable: true}); err != nil {
		return err
	}
	if s.FailCommit != nil {
		return fmt.Errorf("%w: %w", ledger.ErrStore, s.FailCommit)
	}
	s.data = cp
	return nil
}

// View implements ledger.Store.
func (s *Store) View(fn func(ledger.ReadTx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errClosed
	}
	return fn(&tx{data: s.data})
}

// Close implements ledger.Store.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

type tx struct {
	data     map[string]map[string][]byte
	writable bool
}

func (t *tx) get(bucket string, key []byte, v any) (bool, error) {
	b, ok := t.data[bucket][string(key)]
	if !ok {
		return false, nil
	}
	return true, json.Unmarshal(b, v)
}

func (t *tx) put(bucket string, key []byte, v any) error {
	if !t.writable {
		return errors.New("memstore: write in read-only transaction")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// the on-disk store's limit, so that tests over memstore meet it too
	if err := store.CheckSize(bucket, len(b), store.MaxRecord); err != nil {
		return err
	}
	t.data[bucket][string(key)] = b
	return nil
}

func (t *tx) del(bucket string, key []byte) error {
	if !t.writable {
		return errors.New("memstore: write in read-only transaction")
	}
	delete(t.data[bucket], string(key))
	return nil
}

func (t *tx) sortedKeys(bucket string, prefix []byte) []string {
	var keys []string
	for k := range t.data[bucket] {
		if bytes.HasPrefix([]byte(k), prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

func forEach[T any](t *tx, bucket string, prefix []byte, fn func(T) error) error {
	for _, k := range t.sortedKeys(bucket, prefix) {
		var v T
		if err := json.Unmarshal(t.data[bucket][k], &v); err != nil {
			return err
		}
		if err := fn(v); err != nil {
			return err
		}
	}
	return nil
}

func (t *tx) Pool(network string) (ledger.PoolRecord, bool, error) {
	var p ledger.PoolRecord
	ok, err := t.get("pools", []byte(network), &p)
	return p, ok, err
}
func (t *tx) ForEachPool(fn func(ledger.PoolRecord) error) error {
	return forEach(t, "pools", nil, fn)
}
func (t *tx) Lease(k ledger.Key) (ledger.Lease, bool, error) {
	var l ledger.Lease
	ok, err := t.get("leases", store.LeaseKey(k), &l)
	return l, ok, err
}
func (t *tx) ForEachLease(fn func(ledger.Lease) error) error {
	return forEach(t, "leases", nil, fn)
}
func (t *tx) ForEachFree(fn func(ledger.Free) error) error { return forEach(t, "free", nil, fn) }
func (t *tx) History(network string, ip netip.Addr) ([]ledger.Release, error) {
	var out []ledger.Release
	err := forEach(t, "history", store.AddrKey(network, ip), func(r ledger.Release) error { out = append(out, r); return nil })
	return out, err
}
func (t *tx) ForEachHistory(fn func(ledger.Release) error) error {
	return forEach(t, "history", nil, fn)
}
func (t *tx) PutPool(p ledger.PoolRecord) error { return t.put("pools", []byte(p.Network), p) }
func (t *tx) PutLease(l ledger.Lease) error     { return t.put("leases", store.LeaseKey(l.Key), l) }
func (t *tx) DeleteLease(k ledger.Key) error    { return t.del("leases", store.LeaseKey(k)) }
func (t *tx) PutFree(f ledger.Free) error       { return t.put("free", store.AddrKey(f.Network, f.IP), f) }
func (t *tx) DeleteFree(network string, ip netip.Addr) error {
	return t.del("free", store.AddrKey(network, ip))
}
func (t *tx) AppendHistory(r ledger.Release, keep int) error {
	if err := t.put("history", store.HistoryKey(r.Network, r.IP, r.Seq), r); err != nil {
		return err
	}
	keys := t.sortedKeys("history", store.AddrKey(r.Network, r.IP))
	for len(keys) > keep {
		delete(t.data["history"], keys[0])
		keys = keys[1:]
	}
	return nil
}
func (t *tx) ForEachBlock(fn func(ledger.BlockRecord) error) error {
	return forEach(t, "blocks", nil, fn)
}
func (t *tx) PutBlock(b ledger.BlockRecord) error {
	return t.put("blocks", store.BlockKey(b.Network, b.Prefix), b)
}
func (t *tx) DeleteBlock(network string, prefix netip.Prefix) error {
	return t.del("blocks", store.BlockKey(network, prefix))
}
