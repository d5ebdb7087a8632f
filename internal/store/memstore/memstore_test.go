package memstore_test

import (
	"errors"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

func TestLedgerSuite(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) (ledger.Store, func() ledger.Store) {
		st := memstore.New()
		return st, func() ledger.Store { return st }
	})
}

// A failed commit leaves the ledger's memory as it was: nothing allocated, the same
// address offered again once the store works.
func TestFailedCommitChangesNothing(t *testing.T) {
	st := memstore.New()
	l := ledgertest.Open(t, st, ledger.Options{})
	r := ledgertest.Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	first, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("a"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	st.FailCommit = errors.New("injected")
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("b"), Ranges: r}); !errors.Is(err, ledger.ErrStore) {
		t.Fatalf("err = %v, want ErrStore", err)
	}
	if _, _, err := l.Release(ledgertest.Key("a"), ledger.ReasonDEL, ""); !errors.Is(err, ledger.ErrStore) {
		t.Fatalf("release err = %v, want ErrStore", err)
	}
	st.FailCommit = nil
	if _, ok := l.Lease(ledgertest.Key("a")); !ok {
		t.Fatal("failed release dropped the lease from memory")
	}
	b, _, err := l.Allocate(ledger.AllocateRequest{Key: ledgertest.Key("b"), Ranges: r})
	if err != nil || b.IPs[0] == first.IPs[0] {
		t.Fatalf("b got %v, %v", b.IPs, err)
	}
	if want := "10.9.0.3/24"; b.IPs[0].String() != want {
		t.Fatalf("b got %v, want %s (the failed attempt's address, not a skipped one)", b.IPs, want)
	}
}
