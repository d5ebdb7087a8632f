package memstore_test

import (
	"testing"

	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// TestFaultSoak: the fault-injection soak of the shared suite over the in-memory
// store (beside the bbolt run, with another seed).
func TestFaultSoak(t *testing.T) {
	ledgertest.Soak(t, memstore.New(), ledgertest.SoakConfig{Ops: 10000, Workers: 8, FaultRate: 0.2, Seed: 2})
}
