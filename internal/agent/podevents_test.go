package agent_test

import (
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/store/boltstore"
)

// podEvent is one call of PodEvent.
type podEvent struct{ namespace, name, uid, typ, reason, action, note string }

// recordedEvents records the Events the agent asks for.
type recordedEvents struct {
	mu  sync.Mutex
	got []podEvent
}

var _ agent.Events = (*recordedEvents)(nil)

func (r *recordedEvents) PodEvent(namespace, name, uid, typ, reason, action, note string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, podEvent{namespace, name, uid, typ, reason, action, note})
}

func (r *recordedEvents) take() []podEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.got
	r.got = nil
	return out
}

// fixedPods answers from a map of pod UID to phase; listed false: not synced.
type fixedPods struct {
	listed bool
	phases map[string]string
}

var _ agent.Pods = (*fixedPods)(nil)

func (f *fixedPods) Pod(_, _, uid string) (string, bool, bool) {
	p, ok := f.phases[uid]
	return p, ok, f.listed
}

func podServer(t *testing.T, cfg agent.Config) (*agent.Server, *ledger.Ledger) {
	t.Helper()
	dir := t.TempDir()
	st, err := boltstore.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	l := ledgertest.Open(t, st, ledger.Options{})
	cfg.Ledger, cfg.Socket, cfg.Logger = l, filepath.Join(dir, "s.sock"), ledgertest.TestLogger(t)
	s, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, l
}

func addForPod(t *testing.T, s *agent.Server, cid string, pod api.Pod) *api.LeaseView {
	t.Helper()
	r := addReq(t, cid)
	r.Pod = pod
	resp := s.Handle(t.Context(), r)
	if resp.Error != nil || resp.Lease == nil {
		t.Fatalf("ADD %s: %+v", cid, resp.Error)
	}
	return resp.Lease
}

// TestLeaseViewPodPhase: each lease shows its pod's phase and whether the pod is in
// the API, as the pod source says; nothing when the source cannot tell or the
// lease names no pod.
func TestLeaseViewPodPhase(t *testing.T) {
	pods := &fixedPods{phases: map[string]string{"uid-run": "Running"}}
	s, _ := podServer(t, agent.Config{Pods: pods})
	addForPod(t, s, "run", api.Pod{Namespace: "ns", Name: "run", UID: "uid-run"})
	addForPod(t, s, "gone", api.Pod{Namespace: "ns", Name: "gone", UID: "uid-gone"})
	addForPod(t, s, "bare", api.Pod{})
	leases := func() map[string][2]string {
		resp := s.Handle(t.Context(), api.Request{Version: api.Version, Op: api.OpLeases})
		if resp.Error != nil {
			t.Fatal(resp.Error)
		}
		out := map[string][2]string{}
		for _, v := range resp.Leases {
			out[v.ContainerID] = [2]string{v.PodPhase, v.PodInAPI}
		}
		return out
	}
	unknown := map[string][2]string{"run": {}, "gone": {}, "bare": {}}
	if got := leases(); !equalViews(got, unknown) {
		t.Errorf("before the pods are listed: %v, want %v", got, unknown)
	}
	pods.listed = true
	want := map[string][2]string{"run": {"Running", api.PodInAPIYes}, "gone": {"", api.PodInAPINo}, "bare": {}}
	if got := leases(); !equalViews(got, want) {
		t.Errorf("leases: %v, want %v", got, want)
	}
	// the pool page: the address's detail and its cell's hover text
	resp := s.Handle(t.Context(), api.Request{Version: api.Version, Op: api.OpLeases})
	h := s.HTTPHandler()
	for _, v := range resp.Leases {
		ip := strings.Split(v.IPs[0], "/")[0]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/?network="+v.Network+"&ip="+ip, nil))
		page := rec.Body.String()
		var wantText string
		switch v.ContainerID {
		case "run":
			wantText = "pod Running in the API"
		case "gone":
			wantText = "pod deleted from the API"
		}
		i, j := strings.Index(page, `<div id="detail"`), strings.Index(page, "<h3>history")
		if i < 0 || j < i {
			t.Fatalf("pool page for %s has no detail", v.ContainerID)
		}
		detail := page[i:j]
		switch {
		case wantText == "" && strings.Contains(detail, "in the API"):
			t.Errorf("pool page for %s claims what the API says of a lease without a pod: %s", v.ContainerID, detail)
		case wantText != "" && !strings.Contains(detail, wantText):
			t.Errorf("pool page's detail for %s (%s) lacks %q: %s", v.ContainerID, ip, wantText, detail)
		case wantText != "" && strings.Count(page, wantText) < 2:
			t.Errorf("pool page's hover text for %s lacks %q", ip, wantText)
		}
	}
}

func equalViews(a, b map[string][2]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestReconciledEvents: a round's release becomes one AddressReleased Event on the
// lease's pod naming the address, network and evidence; a stranded lease one
// AddressStranded Warning however many rounds keep it stranded; a superseded lease
// one AddressSuperseded Event.
func TestReconciledEvents(t *testing.T) {
	ev := &recordedEvents{}
	vs := &fixedVerdicts{}
	s, l := podServer(t, agent.Config{Events: ev, Verdicts: vs, Guard: confirmAll{}})
	pod := api.Pod{Namespace: "ns", Name: "web", UID: "uid-web"}
	gone := addForPod(t, s, "gone", pod)
	k := ledger.Key{Network: "net", ContainerID: "gone", IfName: "eth0"}
	ls, _ := l.Lease(k)
	rel, ok, err := l.ReleaseIfCreated(k, ls.Created, ledger.ReasonReconcileGone, "sandbox gone for 1m over 2 observations")
	if err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	s.Reconciled(reconcile.Round{Released: []ledger.Lease{rel}, Reasons: []ledger.Reason{ledger.ReasonReconcileGone}, Details: []string{"sandbox gone for 1m over 2 observations"}})
	got := ev.take()
	if len(got) != 1 {
		t.Fatalf("%d Events for one release, want 1: %+v", len(got), got)
	}
	e := got[0]
	if e.namespace != "ns" || e.name != "web" || e.uid != "uid-web" || e.typ != "Normal" || e.reason != agent.ReasonAddressReleased ||
		!strings.Contains(e.note, gone.IPs[0]) || !strings.Contains(e.note, "network net") || !strings.Contains(e.note, "sandbox gone for 1m") {
		t.Fatalf("Event %+v, want Normal AddressReleased on ns/web naming %s, net and the evidence", e, gone.IPs[0])
	}
	t.Logf("release Event: %s", e.note)

	stranded := addForPod(t, s, "stranded", api.Pod{Namespace: "ns", Name: "db", UID: "uid-db"})
	sl, _ := l.Lease(ledger.Key{Network: "net", ContainerID: "stranded", IfName: "eth0"})
	vs.sum = reconcile.Summary{Stranded: 1, Suspects: []reconcile.Suspected{{Lease: sl,
		View: reconcile.View{Sandbox: reconcile.SandboxNotReady, Suspect: "stranded: sandbox NOTREADY and address present for 1s, 2 observations", Class: reconcile.ClassStranded}}}}
	for range 3 {
		s.Reconciled(reconcile.Round{})
	}
	got = ev.take()
	if len(got) != 1 || got[0].typ != "Warning" || got[0].reason != agent.ReasonAddressStranded || got[0].name != "db" || !strings.Contains(got[0].note, stranded.IPs[0]) {
		t.Fatalf("Events over three rounds of one stranded lease: %+v, want one Warning AddressStranded on ns/db", got)
	}
	t.Logf("stranded Event: %s", got[0].note)

	first := addForPod(t, s, "web2-a", api.Pod{Namespace: "ns", Name: "web3", UID: "uid-web3"})
	addForPod(t, s, "web2-b", api.Pod{Namespace: "ns", Name: "web3", UID: "uid-web3"})
	got = ev.take()
	if len(got) != 1 || got[0].reason != agent.ReasonAddressSuperseded || got[0].name != "web3" || !strings.Contains(got[0].note, first.IPs[0]) || !strings.Contains(got[0].note, "web2-b") {
		t.Fatalf("Events of a superseding ADD: %+v, want one AddressSuperseded on ns/web3", got)
	}
	t.Logf("superseded Event: %s", got[0].note)
}

// watchedPods is fixedPods whose watch reports problems.
type watchedPods struct {
	fixedPods
	problems []string
}

var _ agent.PodWatch = (*watchedPods)(nil)

func (w *watchedPods) Problems() []string { return w.problems }

// TestDoctorPodWatch: doctor WARNs of each problem of the pod watch (broken,
// blind), with what it means for releases, and says nothing when there is none.
func TestDoctorPodWatch(t *testing.T) {
	blind := "pod watch blind: READY sandbox ns/p (u1) not in the cache listed with spec.nodeName=n1; is --node-name the kubelet's Node name?"
	pods := &watchedPods{fixedPods: fixedPods{listed: true}, problems: []string{blind}}
	s, _ := podServer(t, agent.Config{Pods: pods})
	warns := func() []string {
		d := s.Handle(t.Context(), api.Request{Version: api.Version, Op: api.OpDoctor}).Doctor
		var out []string
		for _, c := range d.NetworkChecks {
			if c.Level == api.CheckWarn {
				out = append(out, c.Text)
			}
		}
		return out
	}
	if w := warns(); len(w) != 1 || !strings.HasPrefix(w[0], blind) || !strings.Contains(w[0], "takes no pod as deleted") {
		t.Fatalf("doctor warnings %q, want the blind watch", w)
	}
	pods.problems = nil
	if w := warns(); len(w) != 0 {
		t.Fatalf("doctor warnings %q, want none", w)
	}
}
