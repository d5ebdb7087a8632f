// Package walstore is the ledger's durable store with one fdatasync per commit: a
// write-ahead log in front of the bbolt file of boltstore.
//
// A bbolt commit costs two fdatasyncs (data pages, then the meta page), and it cannot
// safely do with one: bbolt has no page checksums, so a power loss could keep a meta
// page whose data pages never reached the disk. Here an Update appends the
// transaction's changes as one checksummed record to a log file and fdatasyncs that
// file once; the changes are then visible in memory (an overlay over ledger.db) and
// reach ledger.db at a checkpoint: one bbolt transaction, off the request path, that
// applies a segment's records and records the index of the last one (meta key
// walApplied). A record torn by a crash fails its checksum and is dropped at the next
// start; it was never acknowledged, since its fdatasync had not returned.
//
// Files, beside the state file ledger.db: ledger.db-wal.0 and ledger.db-wal.1, used in
// turn. When the file taking appends reaches DefaultSegmentBytes it is sealed and
// checkpointed in the background while the other one, whose records ledger.db already
// holds, takes the appends, written over from its start (in place: no metadata for
// fdatasync to flush). Open replays the records ledger.db lacks, checkpoints them and
// empties both files (on a full disk it serves them from the log instead, and
// checkpoints later); Close checkpoints everything and empties them, so a cleanly
// stopped agent leaves ledger.db complete (an older ipledgerd that ignores the log can
// read it). After a crash, ledger.db alone lacks the newest changes: keep the -wal
// files beside it. A View reads a snapshot of the overlay with a bbolt read that holds
// no record after it.
package walstore

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"syscall"

	bolt "go.etcd.io/bbolt"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

var (
	bucketMeta = []byte("meta")
	keyApplied = []byte("walApplied") // big-endian index of the last record in ledger.db
	keyLogID   = []byte("walID")      // the identity written into every record
)

// DefaultSegmentBytes is how large the file taking appends grows before its records
// are checkpointed into ledger.db (it grows further while a checkpoint runs or fails).
const DefaultSegmentBytes = 1 << 20

// checkpointRetryRecords is how often, in records, a full log asks the checkpointer
// again while a segment is still sealed, its checkpoint running or failed (a full
// disk) and to be tried again. Asking after every record would retry a failing
// checkpoint (a bbolt transaction: page writes and up to two fdatasyncs) once per
// commit for as long as the disk stays full, competing with the commits' own
// fdatasyncs; every 64th record keeps retries to one per 64 commits, while a segment
// that filled during a checkpoint is sealed within 64 records of that checkpoint.
const checkpointRetryRecords = 64

// Store is a ledger.Store: a write-ahead log in front of a boltstore file.
type Store struct {
	bs       *boltstore.Store
	db       *bolt.DB
	path     string
	logID    uint64
	segSize  int64
	boltOpts []boltstore.Option
	log      *slog.Logger

	// wmu serializes writers: Update, and a checkpoint's swap and prune. Under it the
	// fields below and the overlay are stable.
	wmu        sync.Mutex
	segs       [2]*segment
	active     int    // the segment taking appends
	sealed     int    // the segment being checkpointed, or -1
	sealedUpTo uint64 // its last record
	pending    []record
	buf        []byte

	// mu guards what a View reads: the overlay, the last index and the state. They
	// are changed with wmu and mu held.
	mu     sync.Mutex
	ov     overlay
	last   uint64
	broken error // set when an fdatasync of the log failed
	closed bool

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	ckpt sync.Mutex // one checkpoint at a time
}

// record is a log record not yet in ledger.db.
type record struct {
	index uint64
	ops   []op
}

var _ ledger.Store = (*Store)(nil)

// Option changes how a store is opened.
type Option func(*Store)

// WithSegmentBytes sets the size at which the file taking appends is checkpointed
// (tests use a small one to checkpoint often).
func WithSegmentBytes(n int64) Option { return func(s *Store) { s.segSize = n } }

// WithBolt passes options to the bbolt state file's Open (boltstore.WithLockTimeout:
// how long to wait for another agent to let go of the file).
func WithBolt(opts ...boltstore.Option) Option {
	return func(s *Store) { s.boltOpts = append(s.boltOpts, opts...) }
}

// WithLogger sets where Open reports what it repaired (an empty state file that held
// nothing, replaced); by default nowhere.
func WithLogger(l *slog.Logger) Option { return func(s *Store) { s.log = l } }

// crashPoint, when set (by tests), is called at the steps of a commit and of a
// checkpoint that a crash could interrupt.
var crashPoint func(step string)

func at(step string) {
	if crashPoint != nil {
		crashPoint(step)
	}
}

// LogPaths are the log files of the state file at path.
func LogPaths(path string) [2]string { return [2]string{path + "-wal.0", path + "-wal.1"} }

// Open opens the state file at path and its log, and replays into the state file the
// records it lacks. A missing state file is created whole (see create.go); an empty
// one whose log holds no record is replaced by a new one. Errors are those of
// boltstore.Open, or wrap ledger.ErrCorrupt naming the file and what to do, or
// ledger.ErrStore.
func Open(path string, opts ...Option) (s *Store, err error) {
	s = &Store{path: path, segSize: DefaultSegmentBytes, sealed: -1, ov: newOverlay(),
		kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o(s)
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if err := s.prepare(); err != nil {
		return nil, err
	}
	bs, err := boltstore.Open(path, s.boltOpts...)
	if err != nil {
		return nil, err
	}
	s.bs, s.db = bs, bs.DB()
	st := s
	defer func() {
		if err != nil {
			for _, sg := range st.segs {
				if sg != nil {
					sg.f.Close()
				}
			}
			bs.Close()
		}
	}()
	applied, err := s.readMeta()
	if err != nil {
		return nil, err
	}
	var data [2][]byte
	for i, p := range LogPaths(path) {
		if s.segs[i], data[i], err = openSegment(p); err != nil {
			return nil, err
		}
	}
	if err := syncDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%w: state directory %s: %v", ledger.ErrStore, filepath.Dir(path), err)
	}
	replay, ends, lasts, err := s.recover(data, applied)
	if err != nil {
		return nil, err
	}
	s.last = applied
	if len(replay) > 0 {
		upTo := replay[len(replay)-1].index
		err := s.applyToBolt(replay, upTo)
		if errors.Is(err, ledger.ErrStore) {
			// ledger.db cannot take them now (a full disk): serve from the log, as
			// before the crash, and checkpoint later.
			s.resume(replay, ends, lasts)
			go s.checkpointer()
			return s, nil
		}
		if err != nil {
			return nil, err
		}
		s.last = upTo
		at("open-replayed")
	}
	for _, sg := range s.segs {
		if sg.size > 0 {
			if err := sg.truncate(); err != nil {
				return nil, fmt.Errorf("%w: write-ahead log %s: %v", ledger.ErrStore, sg.path, err)
			}
		}
	}
	go s.checkpointer()
	return s, nil
}

// resume takes up the log where it stopped: recs (above ledger.db's index) in the
// overlay, appends after the newest file's last record, the older file (if it holds
// any of recs) sealed for the next checkpoint.
func (s *Store) resume(recs []record, ends [2]int64, lasts [2]uint64) {
	for _, r := range recs {
		s.ov.apply(r.ops, r.index)
	}
	s.pending = recs
	s.last = recs[len(recs)-1].index
	newest := 0
	if lasts[1] > lasts[0] {
		newest = 1
	}
	s.active = newest
	s.segs[newest].off = ends[newest]
	if other := 1 - newest; lasts[other] != 0 {
		s.sealed, s.sealedUpTo = other, lasts[other]
	}
}

// readMeta reads the log identity (creating it in a file that has none) and the
// index of the last record ledger.db holds.
func (s *Store) readMeta() (applied uint64, err error) {
	err = s.db.View(func(btx *bolt.Tx) error {
		m := btx.Bucket(bucketMeta)
		if m == nil {
			return s.corrupt(errors.New("no meta bucket"))
		}
		if v := m.Get(keyLogID); len(v) == 8 {
			s.logID = binary.BigEndian.Uint64(v)
		}
		if v := m.Get(keyApplied); v != nil {
			if len(v) != 8 {
				return s.corrupt(fmt.Errorf("meta %s is %d bytes, not 8", keyApplied, len(v)))
			}
			applied = binary.BigEndian.Uint64(v)
		}
		return nil
	})
	if err != nil || s.logID != 0 {
		return applied, err
	}
	var b [8]byte
	for s.logID == 0 {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		s.logID = binary.BigEndian.Uint64(b[:])
	}
	err = s.db.Update(func(btx *bolt.Tx) error { return btx.Bucket(bucketMeta).Put(keyLogID, b[:]) })
	if err != nil {
		return 0, s.storeErr(s.path, "writing the log identity", err)
	}
	return applied, nil
}

// recover returns the records of the two files that ledger.db lacks (index above
// applied), in order, checking that none is missing.
// For each file it also returns where its run of records ends and the last index
// above applied it holds (0: none).
func (s *Store) recover(data [2][]byte, applied uint64) (recs []record, ends [2]int64, lasts [2]uint64, err error) {
	from := map[uint64]string{}
	for i, d := range data {
		run, end, err := scanSegment(s.segs[i].path, d, s.logID, applied)
		if err != nil {
			return nil, ends, lasts, err
		}
		ends[i] = int64(end)
		for _, r := range run {
			if r.index <= applied {
				continue
			}
			if other, dup := from[r.index]; dup {
				return nil, ends, lasts, corruptLog(s.segs[i].path, fmt.Errorf("record %d is also in %s", r.index, other))
			}
			ops, err := decodeOps(r.payload)
			if err != nil {
				return nil, ends, lasts, corruptLog(s.segs[i].path, fmt.Errorf("record %d: %v", r.index, err))
			}
			from[r.index] = s.segs[i].path
			recs = append(recs, record{r.index, ops})
			lasts[i] = max(lasts[i], r.index)
		}
	}
	sortRecords(recs)
	next := applied + 1
	for _, r := range recs {
		if r.index != next {
			return nil, ends, lasts, corruptLog(from[r.index], fmt.Errorf("records %d to %d are missing (ledger.db holds up to %d)", next, r.index-1, applied))
		}
		next++
	}
	return recs, ends, lasts, nil
}

func sortRecords(r []record) {
	for i := 1; i < len(r); i++ {
		for j := i; j > 0 && r[j].index < r[j-1].index; j-- {
			r[j], r[j-1] = r[j-1], r[j]
		}
	}
}

func (s *Store) corrupt(err error) error {
	return fmt.Errorf("%w: state file %s cannot be read as an ipledger ledger (%v); stop ipledgerd, move the file aside with its log (mv %s %s.corrupt; mv %s-wal.0 %s-wal.0.corrupt; mv %s-wal.1 %s-wal.1.corrupt) and start it again: it starts with an empty ledger, and with --cri-endpoint the reconciler reports the addresses that live pods still use",
		ledger.ErrCorrupt, s.path, err, s.path, s.path, s.path, s.path, s.path, s.path)
}

func corruptLog(path string, err error) error {
	return fmt.Errorf("%w: write-ahead log %s is damaged (%v); stop ipledgerd and move the file aside (mv %s %s.corrupt): ipledgerd then starts from the state file as of its last checkpoint, without the changes logged after it, and with --cri-endpoint the reconciler reports the addresses that live pods still use",
		ledger.ErrCorrupt, path, err, path, path)
}

func (s *Store) storeErr(path, what string, err error) error {
	if errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("%w: %s: %s: disk full; free space on its filesystem (nothing was changed): %w", ledger.ErrStore, path, what, err)
	}
	return fmt.Errorf("%w: %s: %s failed, nothing was changed: %w", ledger.ErrStore, path, what, err)
}

// applyToBolt writes recs into ledger.db in one bbolt transaction, with upTo as the
// last applied index.
func (s *Store) applyToBolt(recs []record, upTo uint64) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.corrupt(fmt.Errorf("%v", r))
		}
	}()
	err = s.db.Update(func(btx *bolt.Tx) error {
		var bks [numBuckets]*bolt.Bucket
		for i, n := range bucketNames {
			if bks[i] = btx.Bucket(n); bks[i] == nil {
				return s.corrupt(fmt.Errorf("bucket %s missing", n))
			}
		}
		for _, r := range recs {
			for _, o := range r.ops {
				var err error
				if o.del {
					err = bks[o.bucket].Delete([]byte(o.key))
				} else {
					err = bks[o.bucket].Put([]byte(o.key), o.val)
				}
				if err != nil {
					return err
				}
			}
		}
		at("checkpoint-applied")
		var b [8]byte
		binary.BigEndian.PutUint64(b[:], upTo)
		return btx.Bucket(bucketMeta).Put(keyApplied, b[:])
	})
	if err != nil && !errors.Is(err, ledger.ErrCorrupt) {
		return s.storeErr(s.path, "checkpoint of the write-ahead log", err)
	}
	return err
}

// Update implements ledger.Store: fn's writes become one log record, fdatasync'd
// once, then visible.
func (s *Store) Update(fn func(ledger.Tx) error) (err error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: %s: store closed", ledger.ErrStore, s.path)
	}
	if s.broken != nil {
		return s.broken
	}
	own := newOverlay()
	t := &tx{s: s, ov: &s.ov, own: &own, begin: func() (*bolt.Tx, error) { return s.db.Begin(false) }}
	err = s.run(t, func() error { return fn(t) })
	if err != nil || len(t.ops) == 0 {
		return err
	}
	idx := s.last + 1
	s.buf = encodeRecord(s.buf[:0], idx, s.logID, encodeOps(nil, t.ops))
	seg := s.segs[s.active]
	at("append")
	if err := seg.append(s.buf); err != nil {
		if errors.Is(err, errSyncFailed) {
			// What reached the disk is unknown (and Linux may have dropped the dirty
			// pages): refuse everything, reads included, so that the ledger stops
			// and its restart reads back what the disk holds.
			s.mu.Lock()
			s.broken = fmt.Errorf("%w: write-ahead log %s: %v; restart ipledgerd to read back what the disk holds", ledger.ErrStore, seg.path, err)
			s.mu.Unlock()
			return s.broken
		}
		return s.storeErr(seg.path, "append to the write-ahead log", err)
	}
	at("synced")
	s.mu.Lock()
	s.ov.apply(t.ops, idx)
	s.last = idx
	s.mu.Unlock()
	s.pending = append(s.pending, record{idx, t.ops})
	if seg.off >= s.segSize && (s.sealed < 0 || idx%checkpointRetryRecords == 0) {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// run calls fn, turning a bbolt panic (a damaged page) into ErrCorrupt, and ends the
// transaction's bbolt read.
func (s *Store) run(t *tx, fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = s.corrupt(fmt.Errorf("%v", r))
		}
		if t.btx != nil {
			t.btx.Rollback()
			t.btx = nil
		}
	}()
	return fn()
}

// View implements ledger.Store: a snapshot of the overlay with a bbolt read of
// ledger.db that holds none of the records after it.
func (s *Store) View(fn func(ledger.ReadTx) error) error {
	for {
		s.mu.Lock()
		ov, last := s.ov.clone(), s.last
		closed, broken := s.closed, s.broken
		s.mu.Unlock()
		if closed {
			return fmt.Errorf("%w: %s: store closed", ledger.ErrStore, s.path)
		}
		if broken != nil {
			return broken
		}
		btx, err := s.db.Begin(false)
		if err != nil {
			return s.storeErr(s.path, "read", err)
		}
		t := &tx{s: s, btx: btx, ov: &ov}
		retry := false
		err = s.run(t, func() error {
			if v := btx.Bucket(bucketMeta).Get(keyApplied); len(v) == 8 && binary.BigEndian.Uint64(v) > last {
				// a checkpoint of records newer than the snapshot landed in between
				retry = true
				return nil
			}
			return fn(t)
		})
		if !retry {
			return err
		}
	}
}

// checkpointer runs checkpoints when Update asks, until Close.
func (s *Store) checkpointer() {
	defer close(s.done)
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
			s.checkpoint(false)
		}
	}
}

// checkpoint applies the sealed segment's records to ledger.db; when no segment is
// sealed it first seals the active one (if it is full, or if all is true) and makes
// the other active. It reports whether it left records to checkpoint.
func (s *Store) checkpoint(all bool) (more bool, err error) {
	s.ckpt.Lock()
	defer s.ckpt.Unlock()
	s.wmu.Lock()
	if s.broken != nil {
		s.wmu.Unlock()
		return false, s.broken
	}
	if s.sealed < 0 {
		if len(s.pending) == 0 || (!all && s.segs[s.active].off < s.segSize) {
			s.wmu.Unlock()
			return false, nil
		}
		s.sealed, s.sealedUpTo = s.active, s.last
		s.active = 1 - s.active
		s.segs[s.active].off = 0
	}
	upTo := s.sealedUpTo
	n := 0
	for n < len(s.pending) && s.pending[n].index <= upTo {
		n++
	}
	recs := s.pending[:n:n]
	s.wmu.Unlock()

	if err := s.applyToBolt(recs, upTo); err != nil {
		return true, err
	}
	at("checkpoint-committed")
	s.wmu.Lock()
	s.mu.Lock()
	s.ov.prune(upTo)
	s.mu.Unlock()
	s.pending = append([]record(nil), s.pending[n:]...)
	s.sealed = -1
	more = len(s.pending) > 0
	s.wmu.Unlock()
	return more, nil
}

// Checkpoint applies every logged record to ledger.db now.
func (s *Store) Checkpoint() error {
	for {
		more, err := s.checkpoint(true)
		if err != nil || !more {
			return err
		}
	}
}

// Close implements ledger.Store: it checkpoints every record into ledger.db, empties
// the log files and closes them. When the checkpoint fails the records stay in the
// log, to be replayed at the next Open, and the error is returned.
func (s *Store) Close() error {
	s.wmu.Lock()
	if s.closed {
		s.wmu.Unlock()
		return nil
	}
	s.wmu.Unlock()
	close(s.stop)
	<-s.done
	err := s.Checkpoint()
	s.wmu.Lock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	if err == nil && s.broken == nil {
		for _, sg := range s.segs {
			if sg.size > 0 {
				if terr := sg.truncate(); terr != nil {
					err = fmt.Errorf("%w: write-ahead log %s: %v", ledger.ErrStore, sg.path, terr)
				}
			}
		}
	}
	for _, sg := range s.segs {
		sg.f.Close()
	}
	s.wmu.Unlock()
	if cerr := s.bs.Close(); err == nil {
		err = cerr
	}
	return err
}

// Path is the state file.
func (s *Store) Path() string { return s.path }

// abandon closes the files without a checkpoint, as a crash would leave them (tests).
func (s *Store) abandon() {
	close(s.stop)
	<-s.done
	s.wmu.Lock()
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	for _, sg := range s.segs {
		sg.f.Close()
	}
	s.wmu.Unlock()
	s.bs.Close()
}
