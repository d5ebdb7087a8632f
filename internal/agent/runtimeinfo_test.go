package agent_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// setRuntime answers with the sandboxes it holds; an ID missing from them is
// NotFound, one in errs fails.
type setRuntime struct {
	sbs  []cri.Sandbox
	errs map[string]error
}

var _ agent.RuntimeInfo = (*setRuntime)(nil)

func (r *setRuntime) Version(context.Context) (cri.RuntimeVersion, error) {
	return cri.RuntimeVersion{Name: "fake", Version: "1.0", APIVersion: "v1"}, nil
}

func (r *setRuntime) SandboxStatus(_ context.Context, id string) (cri.Sandbox, error) {
	if err := r.errs[id]; err != nil {
		return cri.Sandbox{}, err
	}
	for _, sb := range r.sbs {
		if sb.ID == id {
			return sb, nil
		}
	}
	return cri.Sandbox{}, fmt.Errorf("status %s: %w", id, cri.ErrNotFound)
}

func (r *setRuntime) ListSandboxes(context.Context) ([]cri.Sandbox, error) { return r.sbs, nil }

// TestRuntimeInfoAnswers: an operator's release is refused for a sandbox the
// runtime reports READY, in a state it does not name, or cannot tell about, and
// allowed for one NOTREADY or unknown to it; doctor names the runtime and lists
// the NOTREADY sandboxes, a creation time before 1970 read as unknown.
func TestRuntimeInfoAnswers(t *testing.T) {
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	l := ledgertest.Open(t, st, ledger.Options{})
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rt := &setRuntime{
		sbs: []cri.Sandbox{
			{ID: "ready", State: cri.StateReady},
			{ID: "notready", State: cri.StateNotReady, Namespace: "ns", Name: "p", CreatedAt: created},
			{ID: "odd", State: cri.StateUnknown},
			{ID: "failed", State: cri.StateNotReady, CreatedAt: time.Unix(0, -6795364578871345152)},
		},
		errs: map[string]error{"broken": errors.New("rpc error: code = Unavailable")},
	}
	s, err := agent.New(agent.Config{Ledger: l, Socket: filepath.Join(dir, "s.sock"), Runtime: rt, Logger: ledgertest.TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		cid  string
		kept string // "" when released
	}{
		{"ready", "READY"},
		{"odd", "could not say"},
		{"broken", "could not say"},
		{"notready", ""},
		{"gone", ""},
	} {
		mustAdd(t, s, c.cid)
		resp := s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpRelease, Network: "net", ContainerID: c.cid, IfName: "eth0"})
		switch {
		case c.kept == "" && resp.Error != nil:
			t.Errorf("release of %s refused: %v", c.cid, resp.Error)
		case c.kept != "" && (resp.Error == nil || resp.Error.Code != api.CodeConflict || !strings.Contains(resp.Error.Msg, c.kept)):
			t.Errorf("release of %s: %+v, want a conflict saying %q", c.cid, resp.Error, c.kept)
		}
	}

	d := s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpDoctor}).Doctor
	if d == nil || d.Runtime != "ok" || d.RuntimeVersion != "fake 1.0" {
		t.Fatalf("doctor %+v, want runtime ok, fake 1.0", d)
	}
	want := []api.SandboxAge{{ID: "notready", Namespace: "ns", Name: "p", Created: created}, {ID: "failed"}}
	if len(d.NotReady) != len(want) {
		t.Fatalf("doctor NOTREADY %+v, want %+v", d.NotReady, want)
	}
	for i, sb := range d.NotReady {
		if sb.ID != want[i].ID || sb.Namespace != want[i].Namespace || sb.Name != want[i].Name || !sb.Created.Equal(want[i].Created) {
			t.Errorf("doctor NOTREADY[%d] = %+v, want %+v", i, sb, want[i])
		}
	}
}

// TestDoctorNetnsNotVisible: doctor warns of a directory of recorded namespaces
// the agent cannot see, naming it and the mount that fixes it, and says nothing
// of one it can.
func TestDoctorNetnsNotVisible(t *testing.T) {
	s, _ := podServer(t, agent.Config{Runtime: &setRuntime{}})
	seen := t.TempDir()
	for i, p := range []string{"/run/iplrec-no-such-dir/cni-1", "/run/iplrec-no-such-dir/cni-2", filepath.Join(seen, "cni-3")} {
		r := addReq(t, fmt.Sprint("c", i))
		r.NetNS = api.NetNS{Path: p}
		if resp := s.Handle(context.Background(), r); resp.Error != nil {
			t.Fatal(resp.Error)
		}
	}
	d := s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpDoctor}).Doctor
	var warns []string
	for _, c := range d.NetworkChecks {
		if c.Level == api.CheckWarn {
			warns = append(warns, c.Text)
		}
	}
	if len(warns) != 1 || !strings.Contains(warns[0], "2 leases") || !strings.Contains(warns[0], "/run/iplrec-no-such-dir") || !strings.Contains(warns[0], "fix: mount") {
		t.Fatalf("doctor warnings %q, want one for /run/iplrec-no-such-dir's 2 leases with the fix", warns)
	}
}
