package boltstore_test

import (
	"path/filepath"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// TestFaultSoak: 10,000 random operations (1,000 under -short) from 8 concurrent
// callers over a real bbolt file whose commits fail at random steps (one in five:
// nothing written, a write failing, written but not durable, durable yet reported
// failed); the audit, the no-double-assignment check and a fresh open of the same
// file agree with the ledger's memory after every operation. Figures are logged
// (go test -v -run TestFaultSoak ./internal/store/boltstore).
func TestFaultSoak(t *testing.T) {
	st := open(t, filepath.Join(t.TempDir(), "ledger.db"))
	t.Cleanup(func() { st.Close() })
	ledgertest.Soak(t, st, ledgertest.SoakConfig{Ops: 10000, Workers: 8, FaultRate: 0.2, Seed: 1})
}
