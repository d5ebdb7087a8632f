package walstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/storetest"
	"github.com/ipledger/ipledger/internal/testenv"
)

// crashSegment is the segment size of the crash children: a checkpoint every few
// operations, so that kills land in checkpoints too.
const crashSegment = 2048

// openCrash opens the crash children's store (and reopens it after each kill).
func openCrash(path string) (ledger.Store, error) { return Open(path, WithSegmentBytes(crashSegment)) }

// TestCrashConsistency: a child allocates and releases in a loop on this store
// (checkpointing every few operations), printing an acknowledgement after each
// success; the test SIGKILLs it at random moments, reopens the ledger and checks that
// every acknowledged change is there and the books balance.
func TestCrashConsistency(t *testing.T) { storetest.CrashConsistency(t, openCrash) }

// TestCrashConsistencySlowStart: the same with each child's start slower than the
// longest pause before its kill, as under a machine's load: the kills still land
// in the child's loop, a quarter of them or more inside an operation.
func TestCrashConsistencySlowStart(t *testing.T) {
	storetest.CrashConsistencySlowStart(t, openCrash)
}

// TestCrashAtEachStep kills the child at each step of a commit and of a checkpoint
// (five runs a step, two under -short)
// where a crash leaves the files in a different state: before the record is written,
// between its write and its fdatasync, after the fdatasync but before the caller is
// answered, inside the checkpoint's bbolt transaction, between the checkpoint's
// commit and the reuse of its log file, and at start between the replay's commit and
// the emptying of the log files.
func TestCrashAtEachStep(t *testing.T) {
	steps := []struct {
		step     string
		maxAfter int
	}{
		{"append", 40},
		{"written", 40},
		{"synced", 40},
		{"checkpoint-applied", 4},
		{"checkpoint-committed", 4},
		{"open-replayed", 1},
	}
	rng := rand.New(rand.NewPCG(2, uint64(time.Now().UnixNano())))
	for _, s := range steps {
		t.Run(s.step, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "ledger.db")
			live := map[string]string{}
			// a run killed at a random moment first, so that the log holds records
			// for the next start to replay
			r := storetest.RunCrashChild(t, p, 0, "", 0, rng, live)
			live = storetest.CheckAfterCrash(t, openCrash, p, "the first kill", live, r.Pending)
			acks := 0
			for run := 1; run <= testenv.Size(5, 2); run++ {
				if s.step == "open-replayed" {
					// a kill after a record's fdatasync (the 2nd to 41st) leaves
					// records in the log, whatever the machine's speed (a kill at a
					// random moment could land before the first); the next child is
					// killed in its Open, after replaying them into ledger.db and
					// before emptying the log
					r := storetest.RunCrashChild(t, p, 100+run, "synced", 2+rng.IntN(40), rng, live)
					if r.Acks == 0 {
						live = storetest.CheckAfterCrash(t, openCrash, p, "a random kill", live, r.Pending)
						continue
					}
					r2 := storetest.RunCrashChild(t, p, run, s.step, 1, rng, live)
					if r2.Acks != 0 {
						t.Fatalf("run %d: the child answered %d operations before its start was done", run, r2.Acks)
					}
					// the killed child's replay is kept or redone: nothing is lost
					live = storetest.CheckAfterCrash(t, openCrash, p, fmt.Sprintf("a kill at %s", s.step), live, r.Pending)
					acks += r.Acks
					continue
				}
				r := storetest.RunCrashChild(t, p, run, s.step, 1+rng.IntN(s.maxAfter), rng, live)
				acks += r.Acks
				live = storetest.CheckAfterCrash(t, openCrash, p, fmt.Sprintf("a kill at %s (run %d)", s.step, run), live, r.Pending)
			}
			if acks == 0 {
				t.Fatalf("no run acknowledged anything before its kill at %s", s.step)
			}
			t.Logf("killed at %s: %d acknowledged operations, %d live leases at the end", s.step, acks, len(live))
		})
	}
}

// TestCrashChild is the child of the crash tests; it does nothing when run alone.
func TestCrashChild(t *testing.T) {
	if step, after := storetest.CrashStep(); step != "" {
		n := 0
		crashPoint = func(s string) {
			if s == step {
				if n++; n >= after {
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
					select {}
				}
			}
		}
	}
	storetest.CrashChild(t, openCrash)
}

// TestTornTailEveryLength: the log file of five commits, cut at every byte length
// within its last three records (its last one under -short), and the same with the bytes after the cut garbled
// (a torn write): reopening keeps exactly the commits whose records are whole (every
// acknowledged one) and no part of the others, and the books balance. (A real power
// loss cannot be staged here; this is the state such a loss leaves in the log: a
// synced prefix and a damaged rest.)
func TestTornTailEveryLength(t *testing.T) {
	dir := storetest.Tmpfs(t, "64m") // thousands of opens: without real fsyncs
	src := filepath.Join(dir, "src", "ledger.db")
	st := open(t, src)
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)
	var ends []int64 // where each commit's record ends in the log
	var keys []string
	for i := range 5 {
		cid := fmt.Sprint("c", i)
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key(cid), Ranges: r}); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, cid)
		ends = append(ends, st.segs[st.active].off)
	}
	st.abandon()
	db, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	wal, err := os.ReadFile(LogPaths(src)[0])
	if err != nil {
		t.Fatal(err)
	}
	wal = wal[:ends[len(ends)-1]]
	// A record is whole once its payload is; the zero padding after it is not needed.
	whole := make([]int64, len(ends))
	for i := range ends {
		start := int64(0)
		if i > 0 {
			start = ends[i-1]
		}
		whole[i] = start + headerSize + int64(binary.LittleEndian.Uint32(wal[start+4:]))
	}
	rng := rand.New(rand.NewPCG(3, 3))
	cases := 0
	for cut := ends[testenv.Size(1, 3)]; cut <= ends[4]; cut++ {
		n := 0
		for _, e := range whole {
			if e <= cut {
				n++
			}
		}
		for _, garble := range []bool{false, true} {
			if garble && cut == ends[4] {
				continue
			}
			p := filepath.Join(dir, fmt.Sprintf("cut%d-%v", cut, garble), "ledger.db")
			os.MkdirAll(filepath.Dir(p), 0o700)
			if err := os.WriteFile(p, db, 0o600); err != nil {
				t.Fatal(err)
			}
			w := append([]byte(nil), wal[:cut]...)
			if garble {
				for range int(ends[4]-cut) + 64 {
					w = append(w, byte(rng.IntN(256)))
				}
			}
			if err := os.WriteFile(LogPaths(p)[0], w, 0o600); err != nil {
				t.Fatal(err)
			}
			st, err := Open(p)
			if err != nil {
				t.Fatalf("log cut at %d (garbled %v): %v", cut, garble, err)
			}
			l, err := ledger.Open(st, ledger.Options{})
			if err != nil {
				t.Fatalf("log cut at %d (garbled %v): %v", cut, garble, err)
			}
			if rep, err := l.Audit(); err != nil || !rep.OK {
				t.Fatalf("log cut at %d (garbled %v): audit %+v %v", cut, garble, rep, err)
			}
			got := l.Leases("")
			if len(got) != n {
				t.Fatalf("log cut at %d (garbled %v): %d leases, want the %d whole commits (records end at %v)", cut, garble, len(got), n, whole)
			}
			for i := range n {
				if _, ok := l.Lease(ledgertest.Key(keys[i])); !ok {
					t.Fatalf("log cut at %d (garbled %v): lease %s of a whole record missing", cut, garble, keys[i])
				}
			}
			if err := l.Close(); err != nil {
				t.Fatal(err)
			}
			os.RemoveAll(filepath.Dir(p))
			cases++
		}
	}
	t.Logf("%d cuts of the log reopened (records end at %v)", cases, whole)
}

// A full disk fails the operation cleanly and loses nothing already committed: the
// state file and its log live on a tiny tmpfs that the test fills up (the log grows
// until its chunk cannot be written, and checkpoints fail in bbolt).
func TestDiskFull(t *testing.T) {
	dir := storetest.Tmpfs(t, "1m")
	p := filepath.Join(dir, "ledger.db")
	ballast := filepath.Join(dir, "ballast") // removed later to free space
	if err := os.WriteFile(ballast, make([]byte, 800<<10), 0o600); err != nil {
		t.Fatal(err)
	}
	st := open(t, p, WithSegmentBytes(16<<10))
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/16"}]]`)
	// No background checkpoint while the disk fills: one that ran would move records
	// into ledger.db and prune the log, and whether one did depends on the scheduler
	// (on a loaded machine Close then checkpointed all and the start had nothing to
	// serve from the log). Held, the log alone fills the disk, every time.
	st.ckpt.Lock()
	acked, fullErr := storetest.FillDisk(t, l, p, r)
	st.ckpt.Unlock()
	if !strings.Contains(fullErr.Error(), "disk full") {
		t.Fatalf("err = %v, want ErrStore naming %s and the full disk", fullErr, p)
	}
	if l.Broken() != nil {
		t.Fatalf("a full disk broke the ledger: %v", l.Broken())
	}
	ledgertest.Audit(t, l)
	// further operations keep failing cleanly or succeed; never half-done
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("more"), Ranges: r}); err == nil {
		acked[ledgertest.Key("more")] = "?"
	}
	// a release needs no more room in the log than it frees: it may still fail, but
	// cleanly
	for k := range acked {
		if _, _, err := l.Release(k, ledger.ReasonDEL, ""); err == nil {
			delete(acked, k)
		}
		break
	}
	t.Logf("close on a full disk: %v", l.Close())
	// the start on a full disk cannot checkpoint: it serves from the log
	check := func(when string, l *ledger.Ledger) {
		t.Helper()
		for k, ip := range acked {
			ls, ok := l.Lease(k)
			if !ok || (ip != "?" && ls.IPs[0].String() != ip) {
				t.Fatalf("%s: acknowledged lease %s (%s) lost: %v %v", when, k, ip, ls, ok)
			}
		}
	}
	st2 := open(t, p, WithSegmentBytes(16<<10))
	if len(st2.pending) == 0 {
		t.Fatal("the start on a full disk checkpointed everything: the test did not reach serving from the log")
	}
	t.Logf("start on a full disk: %d records served from the log", len(st2.pending))
	l2, err := ledger.Open(st2, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	check("start on a full disk", l2)
	ledgertest.Audit(t, l2)
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		k := ledgertest.Key(fmt.Sprint("after", i))
		ls, _, err := l2.Allocate(ledger.AllocateRequest{Key: k, Ranges: r})
		if err != nil {
			t.Fatalf("allocate once space was freed: %v", err)
		}
		acked[k] = ls.IPs[0].String()
	}
	ledgertest.Audit(t, l2)
	if err := l2.Close(); err != nil {
		t.Fatalf("close once space was freed: %v", err)
	}
	l3 := ledgertest.Open(t, open(t, p), ledger.Options{})
	check("reopen once space was freed", l3)
}

// A failed fdatasync of the log leaves what reached the disk unknown: the store then
// refuses reads and writes, the ledger refuses changes (ErrStateUnknown, so that the
// agent exits), and a fresh open reads back a consistent ledger holding every
// acknowledged lease.
func TestSyncFailureStopsTheStore(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	st := open(t, p)
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/24"}]]`)
	a, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("a"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	syncHook = func(*os.File) error { return syscall.EIO }
	t.Cleanup(func() { syncHook = nil })
	_, _, err = l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("b"), Ranges: r})
	if !errors.Is(err, ledger.ErrStore) || !strings.Contains(err.Error(), "restart ipledgerd") {
		t.Fatalf("allocate with a failing fdatasync: %v", err)
	}
	if !errors.Is(l.Broken(), ledger.ErrStateUnknown) {
		t.Fatalf("ledger after a failed fdatasync: Broken() = %v, want ErrStateUnknown", l.Broken())
	}
	if err := st.View(func(ledger.ReadTx) error { return nil }); !errors.Is(err, ledger.ErrStore) {
		t.Fatalf("view after a failed fdatasync: %v", err)
	}
	syncHook = nil
	st.abandon()
	l2, err := ledger.Open(open(t, p), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	ledgertest.Audit(t, l2)
	if ls, ok := l2.Lease(ledgertest.Key("a")); !ok || ls.IPs[0] != a.IPs[0] {
		t.Fatalf("acknowledged lease a after the failure: %v %v", ls, ok)
	}
	// b's record was written (the page cache has it) but never acknowledged: it may
	// be there, whole
	_, ok := l2.Lease(ledgertest.Key("b"))
	t.Logf("the unacknowledged lease is there after the restart: %v", ok)
}
