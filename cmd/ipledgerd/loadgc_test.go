package main

import (
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// TestOpenLedgerRestoresGC: the collector setting held back during the load is set
// back afterwards, and a GOGC the operator chose higher (or off) is never lowered;
// the ledger opens on a real state file either way.
func TestOpenLedgerRestoresGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	for _, gogc := range []int{50, 100, loadGCPercent, 1000, -1} {
		debug.SetGCPercent(gogc)
		st, err := boltstore.Open(filepath.Join(t.TempDir(), "ledger.db"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := openLedger(st, ledger.Options{})
		if err != nil {
			t.Fatalf("GOGC=%d: %v", gogc, err)
		}
		l.Close()
		if got := debug.SetGCPercent(100); got != gogc {
			t.Errorf("GOGC=%d: after the load it is %d", gogc, got)
		}
	}
}

// TestSteadyGC: without GOGC in the environment the agent runs with
// steadyGCPercent; a GOGC the operator set (applied by the runtime) is left alone.
func TestSteadyGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	for _, tc := range []struct {
		env     string
		runtime int // what the runtime applied from the environment
		want    int
	}{
		{env: "", runtime: 100, want: steadyGCPercent},
		{env: "200", runtime: 200, want: 200},
		{env: "off", runtime: -1, want: -1},
		{env: "100", runtime: 100, want: 100},
	} {
		debug.SetGCPercent(tc.runtime)
		steadyGC(func(k string) string {
			if k == "GOGC" {
				return tc.env
			}
			return ""
		})
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC=%q: the collector's target is %d, want %d", tc.env, got, tc.want)
		}
	}
}
