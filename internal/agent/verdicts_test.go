package agent_test

import (
	"context"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// fixedVerdicts answers the views and the summary it was given.
type fixedVerdicts struct {
	views map[string]reconcile.View // by container ID
	sum   reconcile.Summary
}

var _ agent.Verdicts = (*fixedVerdicts)(nil)

func (f *fixedVerdicts) Verdict(k ledger.Key) reconcile.View { return f.views[k.ContainerID] }
func (f *fixedVerdicts) Summary() reconcile.Summary          { return f.sum }

// TestVerdictsShown: the reconciler's views reach the leases answer (sandbox,
// suspicion and the class named for operators), its counts the audit and the
// metrics, and its suspected leases the audit's list.
func TestVerdictsShown(t *testing.T) {
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	l := ledgertest.Open(t, st, ledger.Options{})
	vs := &fixedVerdicts{views: map[string]reconcile.View{
		"ready":    {Sandbox: reconcile.SandboxReady},
		"stranded": {Sandbox: reconcile.SandboxNotReady, Suspect: "stranded: for 1s", Class: reconcile.ClassStranded},
		"leaked":   {Sandbox: reconcile.SandboxGone, Suspect: "gone for 1s", Class: reconcile.ClassAbandoned},
		"doubt":    {Sandbox: reconcile.SandboxNotReady, Suspect: "cannot verify", Class: reconcile.ClassDoubt},
	}}
	s, err := agent.New(agent.Config{Ledger: l, Socket: filepath.Join(dir, "s.sock"), Verdicts: vs, Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, cid := range []string{"ready", "stranded", "leaked", "doubt", "unseen"} {
		mustAdd(t, s, cid)
	}
	resp := s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpLeases})
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	want := map[string][3]string{
		"ready":    {"READY", "", ""},
		"stranded": {"NOTREADY", "stranded: for 1s", api.VerdictStranded},
		"leaked":   {"GONE", "gone for 1s", api.VerdictLeaked},
		"doubt":    {"NOTREADY", "cannot verify", api.VerdictSuspect},
		"unseen":   {"", "", ""},
	}
	for _, v := range resp.Leases {
		if got := [3]string{v.Sandbox, v.Suspect, v.Verdict}; got != want[v.ContainerID] {
			t.Errorf("lease %s: sandbox, suspect, verdict = %q, want %q", v.ContainerID, got, want[v.ContainerID])
		}
	}

	stranded, _ := l.Lease(ledger.Key{Network: "net", ContainerID: "stranded", IfName: "eth0"})
	vs.sum = reconcile.Summary{RuntimeOK: true, Suspect: 1, Stranded: 1,
		Suspects: []reconcile.Suspected{{Lease: stranded, View: vs.views["stranded"]}}}
	resp = s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAudit})
	if resp.Error != nil {
		t.Fatal(resp.Error)
	}
	a := resp.Audit
	if a.Runtime != "ok" || a.Suspect != 1 || a.Stranded != 1 || a.Leaked != 0 || len(a.SuspectLeases) != 1 || !a.OK {
		t.Fatalf("audit %+v", a)
	}
	if sl := a.SuspectLeases[0]; sl.ContainerID != "stranded" || sl.Sandbox != "NOTREADY" || sl.Suspect != "stranded: for 1s" || len(sl.IPs) != 1 {
		t.Errorf("suspected lease %+v", sl)
	}

	vs.sum = reconcile.Summary{Suspect: 2, Leaked: 2}
	resp = s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAudit})
	if a := resp.Audit; a.Runtime != "unreachable" || a.Leaked != 2 || a.OK {
		t.Fatalf("audit with the runtime unreachable and two leaked %+v", a)
	}
	rec := httptest.NewRecorder()
	s.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{"ipledger_runtime_up 0", "ipledger_leases_suspect 2", "ipledger_leases_leaked 2", "ipledger_leases_stranded 0"} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
