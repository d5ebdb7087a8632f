package ledger_test

import (
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// TestLedgerSuite runs the shared ledger suite (ledgertest) on the in-memory store, so
// that go test ./internal/ledger exercises the ledger itself; each store package runs
// the same suite on its own store. An external test package: memstore imports ledger.
func TestLedgerSuite(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T) (ledger.Store, func() ledger.Store) {
		st := memstore.New()
		return st, func() ledger.Store { return st }
	})
}
