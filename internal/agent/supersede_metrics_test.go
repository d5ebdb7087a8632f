package agent_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// confirmAll is a Guard whose runtime confirms every old sandbox is gone (the real
// reconciler's answers are tested in internal/reconcile and test/runtime).
type confirmAll struct{}

var _ agent.Guard = confirmAll{}

func (confirmAll) Supersedable(_ context.Context, olds []ledger.Lease) []ledger.Key {
	var ks []ledger.Key
	for _, o := range olds {
		ks = append(ks, o.Key)
	}
	return ks
}
func (confirmAll) MayRelease(context.Context, ledger.Lease) bool { return true }

// TestSupersededReleasesCounted: an ADD for a pod's re-created sandbox that supersedes
// the old sandbox's lease counts one release, reason superseded, and the books stay
// balanced.
func TestSupersededReleasesCounted(t *testing.T) {
	dir := t.TempDir()
	st, err := boltstore.Open(dir + "/ledger.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	l := ledgertest.Open(t, st, ledger.Options{})
	s, err := agent.New(agent.Config{Ledger: l, Socket: dir + "/s.sock", Guard: confirmAll{}, Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := s.HTTPHandler()
	pod := api.Pod{Namespace: "default", Name: "web-1", UID: "uid-web-1"}
	for _, cid := range []string{"sandbox-1", "sandbox-2", "sandbox-3"} {
		r := addReq(t, cid)
		r.Pod = pod
		if resp := s.Handle(t.Context(), r); resp.Error != nil {
			t.Fatal(resp.Error)
		}
	}
	if n := len(l.Leases("")); n != 1 {
		t.Fatalf("%d leases after two re-creations, want 1", n)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{`ipledger_releases_total{reason="superseded"} 2`, `ipledger_books_balance{network="net"} 0`, `ipledger_leases_live{network="net"} 1`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
