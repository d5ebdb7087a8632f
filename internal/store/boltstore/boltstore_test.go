package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/store/storetest"
)

func open(t testing.TB, path string) *boltstore.Store {
	t.Helper()
	st, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// openStore is open as a storetest.Opener.
func openStore(path string) (ledger.Store, error) { return boltstore.Open(path) }

func TestLedgerSuite(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) (ledger.Store, func() ledger.Store) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		st := open(t, path)
		cur := st
		t.Cleanup(func() { cur.Close() })
		return st, func() ledger.Store {
			cur.Close()
			cur = open(t, path)
			return cur
		}
	})
}

func TestCorruptFile(t *testing.T) { storetest.CorruptFile(t, openStore, false) }

func TestLockedByAnotherAgent(t *testing.T) { storetest.LockedByAnotherAgent(t, openStore) }

// A full disk fails the operation cleanly and loses nothing already committed: the
// state file lives on a tiny tmpfs that the test fills up.
func TestDiskFull(t *testing.T) {
	dir := storetest.Tmpfs(t, "256k")
	p := filepath.Join(dir, "ledger.db")
	st := open(t, p)
	l, err := ledger.Open(st, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := ledgertest.Ranges(t, `[[{"subnet":"10.0.0.0/16"}]]`)
	acked, _ := storetest.FillDisk(t, l, p, r)
	ledgertest.Audit(t, l)
	// further operations keep failing cleanly or succeed; never half-done
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("more"), Ranges: r}); err == nil {
		acked[ledgertest.Key("more")] = "?"
	}
	l.Close()
	l2 := ledgertest.Open(t, open(t, p), ledger.Options{})
	for k, ip := range acked {
		ls, ok := l2.Lease(k)
		if !ok || (ip != "?" && ls.IPs[0].String() != ip) {
			t.Fatalf("acknowledged lease %s (%s) lost after disk full: %v %v", k, ip, ls, ok)
		}
	}
}

// The crash test: a child process allocates and releases in a loop, printing an
// acknowledgement after each success; the test SIGKILLs it at random moments, reopens
// the ledger and checks that every acknowledged change is there and the books balance.
func TestCrashConsistency(t *testing.T) { storetest.CrashConsistency(t, openStore) }

// TestCrashChild is the child of TestCrashConsistency; it does nothing when run alone.
func TestCrashChild(t *testing.T) { storetest.CrashChild(t, openStore) }
