package ledgerview_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/jsonlite/fieldtest"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledgerview"
)

func sameJSON(t *testing.T, what string, ledgerValue, apiValue any) {
	t.Helper()
	want, werr := json.Marshal(ledgerValue)
	got, gerr := json.Marshal(apiValue)
	if werr != nil || gerr != nil || string(got) != string(want) {
		t.Errorf("%s: the protocol shows\n %s (%v)\nthe ledger's JSON is\n %s (%v)", what, got, gerr, want, werr)
	}
}

// Every field of a ledger record reaches its view, under the JSON the ledger type
// has: what the wire and `ipledgerctl -o json|yaml` carried when they carried the
// ledger's types. A field added to one of these ledger types fails this test until the
// protocol decides whether to show it.
func TestViewsKeepEveryField(t *testing.T) {
	var r ledger.Release
	fieldtest.Fill(t, reflect.ValueOf(&r))
	sameJSON(t, "Release", r, ledgerview.Release(r))
	var ps ledger.PoolStatus
	fieldtest.Fill(t, reflect.ValueOf(&ps))
	sameJSON(t, "PoolStatus", ps, ledgerview.Pool(ps))
	var ds []ledger.DoubleAssigned
	fieldtest.Fill(t, reflect.ValueOf(&ds))
	sameJSON(t, "DoubleAssigned", ds, ledgerview.Doubles(ds))
	var pa []ledger.PoolAudit
	fieldtest.Fill(t, reflect.ValueOf(&pa))
	sameJSON(t, "PoolAudit", pa, ledgerview.Pools(pa))

	// nil and empty stay apart: "pools" and "holders" are written as null or []
	for _, tc := range []struct {
		name      string
		ledger, v any
	}{
		{"nil history", []ledger.Release(nil), ledgerview.Releases(nil)},
		{"empty history", []ledger.Release{}, ledgerview.Releases([]ledger.Release{})},
		{"nil doubles", []ledger.DoubleAssigned(nil), ledgerview.Doubles(nil)},
		{"no holders", []ledger.DoubleAssigned{{}}, ledgerview.Doubles([]ledger.DoubleAssigned{{}})},
		{"nil pools", []ledger.PoolAudit(nil), ledgerview.Pools(nil)},
		{"empty pools", []ledger.PoolAudit{}, ledgerview.Pools([]ledger.PoolAudit{})},
	} {
		sameJSON(t, tc.name, tc.ledger, tc.v)
	}
}

// The plugin checks a key with api.Key.Validate before it sends it or names a spool
// file after it, the agent with the ledger's: both must take and refuse the same keys
// with the same words.
func TestKeyValidateAgreesWithLedger(t *testing.T) {
	names := []string{"", "a", "net-1", "net_1.x", "-a", ".a", "_a", "a/b", "a b", "a:b", "ü", "a\x00",
		strings.Repeat("n", ledger.MaxNetworkLen), strings.Repeat("n", ledger.MaxNetworkLen+1),
		strings.Repeat("c", ledger.MaxContainerIDLen), strings.Repeat("c", ledger.MaxContainerIDLen+1)}
	ifnames := []string{"", "eth0", ".", "..", "...", "a/b", "a:b", "a b", "a\tb", "a\x7f", "ü",
		strings.Repeat("i", ledger.MaxIfNameLen), strings.Repeat("i", ledger.MaxIfNameLen+1)}
	for _, n := range names {
		for _, c := range names {
			for _, i := range ifnames {
				lk := ledger.Key{Network: n, ContainerID: c, IfName: i}
				lerr, aerr := lk.Validate(), ledgerview.Key(lk).Validate()
				if (lerr == nil) != (aerr == nil) || lerr != nil && lerr.Error() != aerr.Error() {
					t.Fatalf("key %q/%q/%q: the ledger says %v, the protocol %v", clip(n), clip(c), i, lerr, aerr)
				}
			}
		}
	}
}

func clip(s string) string {
	if len(s) > 8 {
		return s[:8] + "..."
	}
	return s
}
