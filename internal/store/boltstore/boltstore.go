// Package boltstore is the ledger's durable store: one bbolt file, every Update one
// transaction fsync'd before it returns, the schema version recorded in the file.
package boltstore

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store"
)

// SchemaVersion is the layout of the file this code reads and writes.
const SchemaVersion = 1

var (
	bucketMeta    = []byte("meta")
	bucketPools   = []byte("pools")
	bucketLeases  = []byte("leases")
	bucketFree    = []byte("free")
	bucketHistory = []byte("history")
	// bucketBlocks holds the node's blocks of cluster-scoped pools. It is not part
	// of the schema version: a schema 1 file may lack it (written by an ipledgerd
	// without cluster-scoped pools) and gets it at its next writable Open.
	bucketBlocks = []byte("blocks")
	keySchema    = []byte("schema")
)

// ErrLocked is returned by Open (wrapped, with ledger.ErrStore) when another process
// holds the state file: another ipledgerd on the same state directory.
var ErrLocked = errors.New("state file locked")

// Store is a ledger.Store on a bbolt file.
type Store struct {
	db   *bolt.DB
	path string
}

var _ ledger.Store = (*Store)(nil)

// Option changes how a store is opened.
type Option func(*bolt.Options)

// WithoutSync skips fsync on commit. It is for filling a ledger in benchmarks only:
// a store opened with it is not durable and breaks invariant 10.
func WithoutSync() Option { return func(o *bolt.Options) { o.NoSync = true } }

// WithLockTimeout sets how long Open waits for another process to release the file's
// lock before it fails with ErrLocked (default 2s).
func WithLockTimeout(d time.Duration) Option { return func(o *bolt.Options) { o.Timeout = d } }

// Open opens (creating when missing) the state file at path. A file that is not a
// ledger, is damaged, or has another schema version gives an error wrapping
// ledger.ErrCorrupt that names the file and what to do.
func Open(path string, opts ...Option) (s *Store, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("%w: state directory %s: %v", ledger.ErrStore, filepath.Dir(path), err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(path, fmt.Errorf("%v", r))
		}
	}()
	// bbolt would take an empty file for a new one and start an empty ledger over
	// it: every lease it held forgotten, its addresses handed out again.
	if fi, err := os.Stat(path); err == nil && fi.Size() == 0 {
		return nil, corrupt(path, errors.New("the file is empty"))
	}
	bo := &bolt.Options{Timeout: 2 * time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType}
	for _, o := range opts {
		o(bo)
	}
	db, err := bolt.Open(path, 0o600, bo)
	if err != nil {
		switch {
		case errors.Is(err, bolterrors.ErrTimeout):
			return nil, fmt.Errorf("%w: %w: state file %s is locked by another process; is another ipledgerd running with --state-dir %s?", ledger.ErrStore, ErrLocked, path, filepath.Dir(path))
		case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EROFS):
			return nil, fmt.Errorf("%w: state file %s: %v", ledger.ErrStore, path, err)
		}
		return nil, corrupt(path, err)
	}
	s = &Store{db: db, path: path}
	if err := s.init(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func corrupt(path string, err error) error {
	return fmt.Errorf("%w: state file %s cannot be read as an ipledger ledger (%v); stop ipledgerd, move the file aside (mv %s %s.corrupt) and start it again: it starts with an empty ledger, and with --cri-endpoint the reconciler reports the addresses that live pods still use", ledger.ErrCorrupt, path, err, path, path)
}

func (s *Store) init() error {
	return s.Update(func(ledger.Tx) error { return nil })
}

func (s *Store) ensureSchema(btx *bolt.Tx) error {
	meta := btx.Bucket(bucketMeta)
	if meta == nil {
		if !btx.Writable() {
			return corrupt(s.path, errors.New("no meta bucket"))
		}
		// A new file has no buckets at all; a bbolt file of something else has some.
		var other []string
		if err := btx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			other = append(other, strconv.Quote(string(name)))
			return nil
		}); err != nil {
			return err
		}
		if len(other) > 0 {
			return corrupt(s.path, fmt.Errorf("a bbolt file of something else: buckets %s and no ipledger meta bucket", strings.Join(other, ", ")))
		}
		var err error
		if meta, err = btx.CreateBucket(bucketMeta); err != nil {
			return err
		}
		if err := meta.Put(keySchema, []byte(strconv.Itoa(SchemaVersion))); err != nil {
			return err
		}
		for _, b := range [][]byte{bucketPools, bucketLeases, bucketFree, bucketHistory, bucketBlocks} {
			if _, err := btx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}
	v := string(meta.Get(keySchema))
	if v != strconv.Itoa(SchemaVersion) {
		return fmt.Errorf("%w: state file %s has schema version %q; this ipledgerd reads version %d: run the ipledgerd that wrote it, or move the file aside", ledger.ErrCorrupt, s.path, v, SchemaVersion)
	}
	for _, b := range [][]byte{bucketPools, bucketLeases, bucketFree, bucketHistory} {
		if btx.Bucket(b) == nil {
			return corrupt(s.path, fmt.Errorf("bucket %s missing", b))
		}
	}
	if btx.Bucket(bucketBlocks) == nil && btx.Writable() {
		if _, err := btx.CreateBucket(bucketBlocks); err != nil {
			return err
		}
	}
	return nil
}

// Path is the state file.
func (s *Store) Path() string { return s.path }

// DB is the open bbolt file, for a store layered on this one (walstore applies its
// log to it at checkpoints). Its buckets are those this package creates; writes
// through it must keep the record encoding of internal/store.
func (s *Store) DB() *bolt.DB { return s.db }

// Update implements ledger.Store: one bbolt read-write transaction, fsync'd on commit.
func (s *Store) Update(fn func(ledger.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(s.path, fmt.Errorf("%v", r))
		}
	}()
	var fnErr error
	err = s.db.Update(func(btx *bolt.Tx) error {
		if err := s.ensureSchema(btx); err != nil {
			return err
		}
		fnErr = fn(&tx{btx: btx, path: s.path})
		return fnErr
	})
	if err != nil && fnErr == nil && !errors.Is(err, ledger.ErrCorrupt) {
		if errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("%w: state file %s: disk full; free space on its filesystem (nothing was changed): %w", ledger.ErrStore, s.path, err)
		}
		return fmt.Errorf("%w: state file %s: commit failed, nothing was changed: %w", ledger.ErrStore, s.path, err)
	}
	return err
}

// View implements ledger.Store.
func (s *Store) View(fn func(ledger.ReadTx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(s.path, fmt.Errorf("%v", r))
		}
	}()
	return s.db.View(func(btx *bolt.Tx) error {
		if err := s.ensureSchema(btx); err != nil {
			return err
		}
		return fn(&tx{btx: btx, path: s.path})
	})
}

// Close implements ledger.Store.
func (s *Store) Close() error { return s.db.Close() }

const maxRecord = store.MaxRecord

type tx struct {
	btx  *bolt.Tx
	path string
}

func (t *tx) decode(bucket, key, v []byte, into any) error {
	if err := store.UnmarshalRecord(v, into); err != nil { // json.Unmarshal, by hand for leases
		return corrupt(t.path, fmt.Errorf("record %q in bucket %s: %v", key, bucket, err))
	}
	return nil
}

func (t *tx) get(bucket, key []byte, into any) (bool, error) {
	v := t.btx.Bucket(bucket).Get(key)
	if v == nil {
		return false, nil
	}
	return true, t.decode(bucket, key, v, into)
}

func (t *tx) put(bucket, key []byte, v any) error {
	b, err := store.MarshalRecord(v) // json.Marshal, by hand for leases
	if err != nil {
		return err
	}
	if err := store.CheckSize(string(bucket), len(b), maxRecord); err != nil {
		return err
	}
	return t.btx.Bucket(bucket).Put(key, b)
}

func forEach[T any](t *tx, bucket, prefix []byte, fn func(T) error) error {
	c := t.btx.Bucket(bucket).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var rec T
		if err := t.decode(bucket, k, v, &rec); err != nil {
			return err
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	return nil
}

func (t *tx) Pool(network string) (ledger.PoolRecord, bool, error) {
	var p ledger.PoolRecord
	ok, err := t.get(bucketPools, []byte(network), &p)
	return p, ok, err
}
func (t *tx) ForEachPool(fn func(ledger.PoolRecord) error) error {
	return forEach(t, bucketPools, nil, fn)
}
func (t *tx) Lease(k ledger.Key) (ledger.Lease, bool, error) {
	var l ledger.Lease
	ok, err := t.get(bucketLeases, store.LeaseKey(k), &l)
	return l, ok, err
}

// ForEachLease and ForEachFree decode without forEach's interface conversion (which
// puts every record on the heap) and share repeated strings: they read every record
// at agent start (64k leases: see BenchmarkOpen64k).
func (t *tx) ForEachLease(fn func(ledger.Lease) error) error {
	var in store.Interner
	c := t.btx.Bucket(bucketLeases).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		var rec ledger.Lease
		if err := store.UnmarshalLease(v, &rec, &in); err != nil {
			return corrupt(t.path, fmt.Errorf("record %q in bucket %s: %v", k, bucketLeases, err))
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	return nil
}
func (t *tx) ForEachFree(fn func(ledger.Free) error) error {
	var in store.Interner
	c := t.btx.Bucket(bucketFree).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		var rec ledger.Free
		if err := store.UnmarshalFree(v, &rec, &in); err != nil {
			return corrupt(t.path, fmt.Errorf("record %q in bucket %s: %v", k, bucketFree, err))
		}
		if err := fn(rec); err != nil {
			return err
		}
	}
	return nil
}
func (t *tx) History(network string, ip netip.Addr) ([]ledger.Release, error) {
	var out []ledger.Release
	err := forEach(t, bucketHistory, store.AddrKey(network, ip), func(r ledger.Release) error { out = append(out, r); return nil })
	return out, err
}
func (t *tx) ForEachHistory(fn func(ledger.Release) error) error {
	return forEach(t, bucketHistory, nil, fn)
}
func (t *tx) PutPool(p ledger.PoolRecord) error {
	return t.put(bucketPools, []byte(p.Network), p)
}
func (t *tx) PutLease(l ledger.Lease) error {
	return t.put(bucketLeases, store.LeaseKey(l.Key), l)
}
func (t *tx) DeleteLease(k ledger.Key) error {
	return t.btx.Bucket(bucketLeases).Delete(store.LeaseKey(k))
}
func (t *tx) PutFree(f ledger.Free) error {
	return t.put(bucketFree, store.AddrKey(f.Network, f.IP), f)
}
func (t *tx) DeleteFree(network string, ip netip.Addr) error {
	return t.btx.Bucket(bucketFree).Delete(store.AddrKey(network, ip))
}
func (t *tx) AppendHistory(r ledger.Release, keep int) error {
	if err := t.put(bucketHistory, store.HistoryKey(r.Network, r.IP, r.Seq), r); err != nil {
		return err
	}
	// Drop the oldest entries of this address beyond keep: count backwards from the
	// newest, then delete what lies before.
	prefix := store.AddrKey(r.Network, r.IP)
	c := t.btx.Bucket(bucketHistory).Cursor()
	n := 0
	var k []byte
	// position at the last key with this prefix
	seekPast := append(append([]byte(nil), prefix...), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	if k, _ = c.Seek(seekPast); k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	var drop [][]byte
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Prev() {
		n++
		if n > keep {
			drop = append(drop, append([]byte(nil), k...))
		}
	}
	for _, k := range drop {
		if err := t.btx.Bucket(bucketHistory).Delete(k); err != nil {
			return err
		}
	}
	return nil
}
func (t *tx) ForEachBlock(fn func(ledger.BlockRecord) error) error {
	if t.btx.Bucket(bucketBlocks) == nil { // a file without blocks, opened read-only
		return nil
	}
	return forEach(t, bucketBlocks, nil, fn)
}
func (t *tx) PutBlock(b ledger.BlockRecord) error {
	return t.put(bucketBlocks, store.BlockKey(b.Network, b.Prefix), b)
}
func (t *tx) DeleteBlock(network string, prefix netip.Prefix) error {
	return t.btx.Bucket(bucketBlocks).Delete(store.BlockKey(network, prefix))
}
