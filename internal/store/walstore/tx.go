package walstore

import (
	"bytes"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	bolt "go.etcd.io/bbolt"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store"
)

// entry is the newest value of a key in the log's records not yet in ledger.db.
type entry struct {
	val []byte
	del bool
	idx uint64 // the record that wrote it (0: this transaction's own write)
}

// overlay holds, per bucket, the keys changed by records not yet checkpointed, and
// the history keys by address, so that AppendHistory and History do not scan every
// logged history key (a DEL's trim of its address's history runs on the request path).
type overlay struct {
	m    [numBuckets]map[string]entry
	hist map[string][]string // history keys by their address prefix; may repeat a key
}

func newOverlay() overlay {
	o := overlay{hist: map[string][]string{}}
	for i := range o.m {
		o.m[i] = map[string]entry{}
	}
	return o
}

func (o *overlay) clone() overlay {
	c := overlay{hist: make(map[string][]string, len(o.hist))}
	for i := range o.m {
		c.m[i] = make(map[string]entry, len(o.m[i]))
		for k, e := range o.m[i] {
			c.m[i][k] = e
		}
	}
	for p, keys := range o.hist {
		c.hist[p] = keys[:len(keys):len(keys)]
	}
	return c
}

func (o *overlay) set(b uint8, key string, e entry) {
	if _, ok := o.m[b][key]; !ok && b == bHistory && len(key) > store.HistorySeqLen {
		p := key[:len(key)-store.HistorySeqLen]
		o.hist[p] = append(o.hist[p], key)
	}
	o.m[b][key] = e
}

func (o *overlay) apply(ops []op, idx uint64) {
	for _, x := range ops {
		o.set(x.bucket, x.key, entry{val: x.val, del: x.del, idx: idx})
	}
}

// prune drops the entries of records up to upTo (they are in ledger.db now).
func (o *overlay) prune(upTo uint64) {
	for b := range o.m {
		for k, e := range o.m[b] {
			if e.idx <= upTo {
				delete(o.m[b], k)
			}
		}
	}
	o.hist = map[string][]string{}
	for k := range o.m[bHistory] {
		if len(k) > store.HistorySeqLen {
			o.hist[k[:len(k)-store.HistorySeqLen]] = append(o.hist[k[:len(k)-store.HistorySeqLen]], k)
		}
	}
}

// withPrefix calls fn for the entries of bucket b whose key starts with prefix. A
// history prefix is an address (store.AddrKey: network NUL address; network names
// hold no NUL), and the history keys starting with it are exactly those indexed under
// it; other prefixes are found by a scan.
func (o *overlay) withPrefix(b uint8, prefix []byte, fn func(k string, e entry)) {
	if b == bHistory && len(prefix) > 0 {
		for _, k := range o.hist[string(prefix)] {
			fn(k, o.m[b][k])
		}
		return
	}
	for k, e := range o.m[b] {
		if strings.HasPrefix(k, string(prefix)) {
			fn(k, e)
		}
	}
}

// tx reads ledger.db as changed by the overlay (and, in an Update, by its own writes),
// and in an Update records its writes as ops.
type tx struct {
	s     *Store
	btx   *bolt.Tx
	begin func() (*bolt.Tx, error) // lazily begins btx (Update)
	ov    *overlay
	own   *overlay // this transaction's writes; nil in a View
	ops   []op
}

func (t *tx) bolt() (*bolt.Tx, error) {
	if t.btx == nil {
		b, err := t.begin()
		if err != nil {
			return nil, err
		}
		t.btx = b
	}
	return t.btx, nil
}

func (t *tx) bucket(b uint8) (*bolt.Bucket, error) {
	btx, err := t.bolt()
	if err != nil {
		return nil, err
	}
	bk := btx.Bucket(bucketNames[b])
	if bk == nil {
		return nil, t.s.corrupt(fmt.Errorf("bucket %s missing", bucketNames[b]))
	}
	return bk, nil
}

func (t *tx) lookup(b uint8, key []byte) ([]byte, bool, error) {
	for _, o := range []*overlay{t.own, t.ov} {
		if o == nil {
			continue
		}
		if e, ok := o.m[b][string(key)]; ok {
			return e.val, !e.del, nil
		}
	}
	bk, err := t.bucket(b)
	if err != nil {
		return nil, false, err
	}
	v := bk.Get(key)
	return v, v != nil, nil
}

// each visits the keys of bucket b starting with prefix, in key order: ledger.db's
// merged with the overlay's (which win, and hide deleted keys).
func (t *tx) each(b uint8, prefix []byte, fn func(k, v []byte) error) error {
	var upper map[string]entry
	for _, o := range []*overlay{t.ov, t.own} {
		if o == nil {
			continue
		}
		o.withPrefix(b, prefix, func(k string, e entry) {
			if upper == nil {
				upper = map[string]entry{}
			}
			upper[k] = e
		})
	}
	keys := make([]string, 0, len(upper))
	for k := range upper {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	bk, err := t.bucket(b)
	if err != nil {
		return err
	}
	c := bk.Cursor()
	k, v := c.Seek(prefix)
	i := 0
	for {
		if k != nil && !bytes.HasPrefix(k, prefix) {
			k = nil
		}
		if k == nil && i == len(keys) {
			return nil
		}
		if i < len(keys) && (k == nil || keys[i] <= string(k)) {
			if k != nil && keys[i] == string(k) {
				k, v = c.Next()
			}
			e := upper[keys[i]]
			i++
			if !e.del {
				if err := fn([]byte(keys[i-1]), e.val); err != nil {
					return err
				}
			}
			continue
		}
		if err := fn(k, v); err != nil {
			return err
		}
		k, v = c.Next()
	}
}

func (t *tx) decode(b uint8, key, v []byte, into any) error {
	if err := store.UnmarshalRecord(v, into); err != nil {
		return t.s.corrupt(fmt.Errorf("record %q in bucket %s: %v", key, bucketNames[b], err))
	}
	return nil
}

func (t *tx) get(b uint8, key []byte, into any) (bool, error) {
	v, ok, err := t.lookup(b, key)
	if err != nil || !ok {
		return false, err
	}
	return true, t.decode(b, key, v, into)
}

func forEach[T any](t *tx, b uint8, prefix []byte, fn func(T) error) error {
	return t.each(b, prefix, func(k, v []byte) error {
		var rec T
		if err := t.decode(b, k, v, &rec); err != nil {
			return err
		}
		return fn(rec)
	})
}

func (t *tx) put(b uint8, key []byte, v any) error {
	if t.own == nil {
		return fmt.Errorf("walstore: write in a read-only transaction")
	}
	val, err := store.MarshalRecord(v)
	if err != nil {
		return err
	}
	if err := store.CheckSize(string(bucketNames[b]), len(val), store.MaxRecord); err != nil {
		return err
	}
	t.write(op{bucket: b, key: string(key), val: val})
	return nil
}

func (t *tx) del(b uint8, key []byte) error {
	if t.own == nil {
		return fmt.Errorf("walstore: write in a read-only transaction")
	}
	t.write(op{bucket: b, key: string(key), del: true})
	return nil
}

func (t *tx) write(o op) {
	t.own.set(o.bucket, o.key, entry{val: o.val, del: o.del})
	t.ops = append(t.ops, o)
}

func (t *tx) Pool(network string) (ledger.PoolRecord, bool, error) {
	var p ledger.PoolRecord
	ok, err := t.get(bPools, []byte(network), &p)
	return p, ok, err
}
func (t *tx) ForEachPool(fn func(ledger.PoolRecord) error) error {
	return forEach(t, bPools, nil, fn)
}
func (t *tx) Lease(k ledger.Key) (ledger.Lease, bool, error) {
	var l ledger.Lease
	ok, err := t.get(bLeases, store.LeaseKey(k), &l)
	return l, ok, err
}

// ForEachLease and ForEachFree decode with the store's record decoders and one
// Interner per walk, as boltstore does: they are most of ledger.Open's work at 64k
// leases, and the shared strings are most of the books' memory.
func (t *tx) ForEachLease(fn func(ledger.Lease) error) error {
	var in store.Interner
	return t.each(bLeases, nil, func(k, v []byte) error {
		var rec ledger.Lease
		if err := store.UnmarshalLease(v, &rec, &in); err != nil {
			return t.s.corrupt(fmt.Errorf("record %q in bucket %s: %v", k, bucketNames[bLeases], err))
		}
		return fn(rec)
	})
}
func (t *tx) ForEachFree(fn func(ledger.Free) error) error {
	var in store.Interner
	return t.each(bFree, nil, func(k, v []byte) error {
		var rec ledger.Free
		if err := store.UnmarshalFree(v, &rec, &in); err != nil {
			return t.s.corrupt(fmt.Errorf("record %q in bucket %s: %v", k, bucketNames[bFree], err))
		}
		return fn(rec)
	})
}
func (t *tx) History(network string, ip netip.Addr) ([]ledger.Release, error) {
	var out []ledger.Release
	err := forEach(t, bHistory, store.AddrKey(network, ip), func(r ledger.Release) error { out = append(out, r); return nil })
	return out, err
}
func (t *tx) ForEachHistory(fn func(ledger.Release) error) error {
	return forEach(t, bHistory, nil, fn)
}
func (t *tx) PutPool(p ledger.PoolRecord) error {
	return t.put(bPools, []byte(p.Network), p)
}
func (t *tx) PutLease(l ledger.Lease) error {
	return t.put(bLeases, store.LeaseKey(l.Key), l)
}
func (t *tx) DeleteLease(k ledger.Key) error {
	return t.del(bLeases, store.LeaseKey(k))
}
func (t *tx) PutFree(f ledger.Free) error {
	return t.put(bFree, store.AddrKey(f.Network, f.IP), f)
}
func (t *tx) DeleteFree(network string, ip netip.Addr) error {
	return t.del(bFree, store.AddrKey(network, ip))
}

// AppendHistory adds r and deletes the oldest entries of its address beyond keep,
// as boltstore does; the deletes are ops of the record like any other.
func (t *tx) AppendHistory(r ledger.Release, keep int) error {
	if err := t.put(bHistory, store.HistoryKey(r.Network, r.IP, r.Seq), r); err != nil {
		return err
	}
	var keys []string
	if err := t.each(bHistory, store.AddrKey(r.Network, r.IP), func(k, _ []byte) error {
		keys = append(keys, string(k))
		return nil
	}); err != nil {
		return err
	}
	for len(keys) > keep {
		if err := t.del(bHistory, []byte(keys[0])); err != nil {
			return err
		}
		keys = keys[1:]
	}
	return nil
}

func (t *tx) ForEachBlock(fn func(ledger.BlockRecord) error) error {
	return forEach(t, bBlocks, nil, fn)
}
func (t *tx) PutBlock(b ledger.BlockRecord) error {
	return t.put(bBlocks, store.BlockKey(b.Network, b.Prefix), b)
}
func (t *tx) DeleteBlock(network string, prefix netip.Prefix) error {
	return t.del(bBlocks, store.BlockKey(network, prefix))
}

var _ ledger.Tx = (*tx)(nil)
