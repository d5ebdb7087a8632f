package walstore

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/ipledger/ipledger/internal/jsonlite/fieldtest"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/storetest"
)

func open(t testing.TB, path string, opts ...Option) *Store {
	t.Helper()
	st, err := Open(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// openStore is Open with the default options, as a storetest.Opener.
func openStore(path string) (ledger.Store, error) { return Open(path) }

func TestLedgerSuite(t *testing.T) {
	for _, seg := range []int64{DefaultSegmentBytes, 600} { // 600: a checkpoint every record or two
		t.Run(fmt.Sprintf("segment=%d", seg), func(t *testing.T) {
			ledgertest.Run(t, func(t *testing.T) (ledger.Store, func() ledger.Store) {
				path := filepath.Join(t.TempDir(), "ledger.db")
				st := open(t, path, WithSegmentBytes(seg))
				cur := st
				t.Cleanup(func() { cur.Close() })
				return st, func() ledger.Store {
					cur.Close()
					cur = open(t, path, WithSegmentBytes(seg))
					return cur
				}
			})
		})
	}
}

// TestFaultSoak is boltstore's soak over this store, checkpointing every few commits:
// 10,000 random operations (1,000 under -short) from 8 callers with one commit in
// five failing at a random step; the audit and a fresh open of the same store agree
// with the ledger's memory after every operation.
func TestFaultSoak(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "ledger.db"), WithSegmentBytes(4096))
	t.Cleanup(func() { st.Close() })
	ledgertest.Soak(t, st, ledgertest.SoakConfig{Ops: 10000, Workers: 8, FaultRate: 0.2, Seed: 1})
}

func TestCorruptFile(t *testing.T) { storetest.CorruptFile(t, openStore, true) }

// A damaged record followed by an intact one is corruption, not a torn tail: Open
// refuses, naming the log file and the fix, and changes nothing.
func TestCorruptLogInTheMiddle(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	st := open(t, p)
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)
	for i := range 5 {
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key(fmt.Sprint("c", i)), Ranges: r}); err != nil {
			t.Fatal(err)
		}
	}
	st.abandon()
	wal := LogPaths(p)[0]
	b, err := os.ReadFile(wal)
	if err != nil {
		t.Fatal(err)
	}
	b[headerSize+3] ^= 0x40 // inside the first record's payload
	if err := os.WriteFile(wal, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(p)
	if !errors.Is(err, ledger.ErrCorrupt) || !strings.Contains(err.Error(), wal) || !strings.Contains(err.Error(), "move the file aside") {
		t.Fatalf("err = %v, want ErrCorrupt naming %s and the fix", err, wal)
	}
	t.Log(err)
	if after, _ := os.ReadFile(wal); string(after) != string(b) {
		t.Fatal("opening a damaged log changed it")
	}
}

func TestLockedByAnotherAgent(t *testing.T) { storetest.LockedByAnotherAgent(t, openStore) }

// A state file written by boltstore (an older ipledgerd) opens and keeps working, and
// after a clean Close an older ipledgerd reads everything from ledger.db alone.
func TestExistingStateFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)
	bs, err := boltstore.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	l, err := ledger.Open(bs, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	old, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("old"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()

	if l, err = ledger.Open(open(t, p), ledger.Options{}); err != nil {
		t.Fatal(err)
	}
	if ls, ok := l.Lease(ledgertest.Key("old")); !ok || ls.IPs[0] != old.IPs[0] {
		t.Fatalf("lease written by boltstore: %v %v", ls, ok)
	}
	added, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("new"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Release(ledgertest.Key("old"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	for _, w := range LogPaths(p) {
		if fi, err := os.Stat(w); err != nil || fi.Size() != 0 {
			t.Fatalf("%s after a clean close: %v, size %d; want it empty", w, err, fi.Size())
		}
	}
	bs, err = boltstore.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if l, err = ledger.Open(bs, ledger.Options{}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if ls, ok := l.Lease(ledgertest.Key("new")); !ok || ls.IPs[0] != added.IPs[0] {
		t.Fatalf("boltstore after a clean close: lease new = %v %v", ls, ok)
	}
	if _, ok := l.Lease(ledgertest.Key("old")); ok {
		t.Fatal("boltstore after a clean close: the released lease is still there")
	}
	if h, err := l.History("net", old.IPs[0].Addr()); err != nil || len(h) != 1 {
		t.Fatalf("history of %s: %v %v", old.IPs[0], h, err)
	}
}

// Every field of every record survives the log, the overlay, a checkpoint and a
// reopen exactly as json.Marshal writes it.
func TestRecordCodecEveryField(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	st := open(t, p)
	var lease ledger.Lease
	fieldtest.Fill(t, reflect.ValueOf(&lease))
	var free ledger.Free
	fieldtest.Fill(t, reflect.ValueOf(&free))
	var rel ledger.Release
	fieldtest.Fill(t, reflect.ValueOf(&rel))
	var pr ledger.PoolRecord
	fieldtest.Fill(t, reflect.ValueOf(&pr))
	pr.Ranges = []pool.RangeSet{{{Subnet: netip.MustParsePrefix("10.1.2.0/24"), Gateway: netip.MustParseAddr("10.1.2.1")}}}
	if err := st.Update(func(tx ledger.Tx) error {
		return errors.Join(tx.PutLease(lease), tx.PutFree(free), tx.AppendHistory(rel, 4), tx.PutPool(pr))
	}); err != nil {
		t.Fatal(err)
	}
	check := func(when string, st ledger.Store) {
		t.Helper()
		err := st.View(func(tx ledger.ReadTx) error {
			gl, ok, err := tx.Lease(lease.Key)
			if err != nil || !ok || !reflect.DeepEqual(gl, lease) {
				return fmt.Errorf("lease %+v %v %v, want %+v", gl, ok, err, lease)
			}
			var frees []ledger.Free
			tx.ForEachFree(func(f ledger.Free) error { frees = append(frees, f); return nil })
			if len(frees) != 1 || !reflect.DeepEqual(frees[0], free) {
				return fmt.Errorf("free %+v, want %+v", frees, free)
			}
			h, err := tx.History(rel.Network, rel.IP)
			if err != nil || len(h) != 1 || !reflect.DeepEqual(h[0], rel) {
				return fmt.Errorf("history %+v %v, want %+v", h, err, rel)
			}
			gp, ok, err := tx.Pool(pr.Network)
			if err != nil || !ok || !reflect.DeepEqual(gp, pr) {
				return fmt.Errorf("pool %+v %v %v, want %+v", gp, ok, err, pr)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
	}
	check("from the log", st)
	if err := st.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	check("after a checkpoint", st)
	st.Close()
	st = open(t, p)
	defer st.Close()
	check("after a reopen", st)
}

// Views see whole transactions only, while commits and checkpoints run: every Update
// writes the same counter into two pool records, and no View sees them differ.
// 2,000 commits (300 under -short, each still a fdatasync with a checkpoint every
// record or two).
func TestViewConsistentDuringCheckpoints(t *testing.T) {
	commits := uint64(2000)
	if testing.Short() {
		commits = 300
	}
	st := open(t, filepath.Join(t.TempDir(), "ledger.db"), WithSegmentBytes(512))
	defer st.Close()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				var a, b uint64
				err := st.View(func(tx ledger.ReadTx) error {
					pa, _, err := tx.Pool("a")
					if err != nil {
						return err
					}
					pb, _, err := tx.Pool("b")
					a, b = pa.Allocations, pb.Allocations
					return err
				})
				if err == nil && a != b {
					err = fmt.Errorf("a view saw half a transaction: %d and %d", a, b)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := uint64(1); i <= commits; i++ {
		err := st.Update(func(tx ledger.Tx) error {
			return errors.Join(tx.PutPool(ledger.PoolRecord{Network: "a", Allocations: i}), tx.PutPool(ledger.PoolRecord{Network: "b", Allocations: i}))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	var applied uint64
	st.db.View(func(btx *bolt.Tx) error {
		applied = readUint(btx.Bucket(bucketMeta).Get(keyApplied))
		return nil
	})
	if applied < commits/2 {
		t.Fatalf("only %d of %d records were checkpointed with 512-byte segments", applied, commits)
	}
}

func readUint(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// A commit costs one fdatasync, of the log, and writes nothing to ledger.db; a
// checkpoint then applies every logged commit in one bbolt transaction.
func TestOneSyncPerCommit(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "ledger.db"))
	defer st.Close()
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	syncs := 0
	syncHook = func(f *os.File) error { syncs++; return fdatasyncFile(f) }
	t.Cleanup(func() { syncHook = nil })
	boltTx := func() int {
		var id int
		st.db.View(func(btx *bolt.Tx) error { id = btx.ID(); return nil })
		return id
	}
	before := boltTx()
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)
	const n = 50
	for i := range n {
		k := ledgertest.Key(fmt.Sprint("c", i))
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: r}); err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 {
			if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	commits := n + n/2
	if syncs != commits {
		t.Fatalf("%d commits made %d fdatasyncs of the log, want one each", commits, syncs)
	}
	if after := boltTx(); after != before {
		t.Fatalf("commits wrote %d bbolt transactions to ledger.db, want none before a checkpoint", after-before)
	}
	if err := st.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if after := boltTx(); after != before+1 {
		t.Fatalf("the checkpoint wrote %d bbolt transactions, want one", after-before)
	}
	ledgertest.Audit(t, l)
}
