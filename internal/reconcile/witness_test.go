package reconcile

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
)

// fakeAPI is a PodWitness whose answers the test sets: the pods by UID (with their
// name), as a synced watch's cache holds them, and what the API server itself
// answers a GET with (live; the cache's pods when nil, an error when liveErr).
type fakeAPI struct {
	mu      sync.Mutex
	synced  bool
	pods    map[string]fakePod // by UID
	live    map[string]fakePod // by UID; nil: as pods
	liveErr error
	gets    int      // Deleted calls
	ready   []string // the UIDs ReadySandbox was told of
}

type fakePod struct{ namespace, name, phase string }

var _ PodWitness = (*fakeAPI)(nil)

func newFakeAPI() *fakeAPI { return &fakeAPI{synced: true, pods: map[string]fakePod{}} }

func (a *fakeAPI) PodSince(namespace, name, uid string, _ time.Time) (string, bool, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.synced {
		return "", false, false
	}
	if uid != "" {
		p, ok := a.pods[uid]
		return p.phase, ok, true
	}
	for _, p := range a.pods {
		if p.namespace == namespace && p.name == name {
			return p.phase, true, true
		}
	}
	return "", false, true
}

func (a *fakeAPI) ReadySandbox(_ context.Context, _, _, uid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ready = append(a.ready, uid)
}

func (a *fakeAPI) Deleted(_ context.Context, namespace, name, uid string) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gets++
	if a.liveErr != nil {
		return false, a.liveErr
	}
	src := a.live
	if src == nil {
		src = a.pods
	}
	if uid != "" {
		_, ok := src[uid]
		return !ok, nil
	}
	for _, p := range src {
		if p.namespace == namespace && p.name == name {
			return false, nil
		}
	}
	return true, nil
}

func (a *fakeAPI) set(uid, phase string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[uid] = fakePod{namespace: "ns", name: "p-" + uid, phase: phase}
}

func (a *fakeAPI) del(uid string) { a.mu.Lock(); delete(a.pods, uid); a.mu.Unlock() }

var errTest = errors.New("test: the runtime failed")

func withAPI(a *fakeAPI) func(*Options) { return func(o *Options) { o.API = a } }

// TestWitnessFinishedStrandedReclaimed: a NOTREADY sandbox still holding its
// address is kept by the runtime's evidence alone; once the API says its pod
// Succeeded, Failed or was deleted, the interface is removed and the lease released
// after Grace, with the API's evidence in the release record.
func TestWitnessFinishedStrandedReclaimed(t *testing.T) {
	for _, c := range []struct {
		name string
		pod  func(a *fakeAPI, uid string)
		why  string
	}{
		{"succeeded", func(a *fakeAPI, uid string) { a.set(uid, "Succeeded") }, "pod Succeeded in the API"},
		{"failed", func(a *fakeAPI, uid string) { a.set(uid, "Failed") }, "pod Failed in the API"},
		{"deleted", func(a *fakeAPI, uid string) { a.del(uid) }, "pod deleted from the API"},
	} {
		t.Run(c.name, func(t *testing.T) {
			api := newFakeAPI()
			f := newFixture(t, withAPI(api))
			api.set("u1", "Running")
			ls := f.add("a", "u1")
			f.clk.Advance(time.Hour)
			f.rt.set("a", cri.StateNotReady)
			f.ns.set("/ns/a", NSAddrPresent)
			if n := f.rounds(20); n != 0 || !f.held("a") || len(f.ns.reclaimed) != 0 {
				t.Fatal("stranded lease of a Running pod reclaimed")
			}
			c.pod(api, "u1")
			took := f.untilReleased("a", 20)
			if took < grace || took > grace+interval {
				t.Fatalf("released %v after the pod finished, want within grace %v + one interval", took, grace)
			}
			if len(f.ns.reclaimed) != 1 {
				t.Fatalf("reclaimed %v", f.ns.reclaimed)
			}
			h, err := f.l.History("net", ls.IPs[0].Addr())
			if err != nil || len(h) != 1 {
				t.Fatalf("history %v %v", h, err)
			}
			if h[0].Reason != ledger.ReasonReconcileNotReady || !strings.Contains(h[0].Detail, c.why) || !strings.Contains(h[0].Detail, "removed eth0") {
				t.Fatalf("release %s %q", h[0].Reason, h[0].Detail)
			}
		})
	}
}

// TestWitnessNotReadyUnrecordedNetns: a NOTREADY sandbox whose namespace was not
// recorded is kept as unverifiable without the API, and released once the API says
// its pod is finished.
func TestWitnessNotReadyUnrecordedNetns(t *testing.T) {
	api := newFakeAPI()
	f := newFixture(t, withAPI(api))
	api.set("u1", "Running")
	ls, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("a"), Pod: ledger.Pod{Namespace: "ns", Name: "p-u1", UID: "u1"}, Ranges: ranges})
	if err != nil {
		t.Fatal(err)
	}
	f.rt.set("a", cri.StateNotReady)
	f.clk.Advance(time.Hour)
	if f.rounds(20); !f.held("a") {
		t.Fatal("released while the pod runs")
	}
	api.set("u1", "Succeeded")
	if took := f.untilReleased("a", 20); took > grace+interval {
		t.Fatalf("released after %v", took)
	}
	if r := lastReason(t, f.l, ls); r != ledger.ReasonReconcileNotReady {
		t.Fatalf("reason %s", r)
	}
}

// TestWitnessNeverAlone: the API's evidence alone releases nothing. For each way
// the API can be wrong about a live pod (a stale cache missing it, an API server
// down or restored from an old backup, the pod re-created under its name with a new
// UID), a lease whose sandbox is READY, or whose sandbox the runtime cannot judge,
// or in a round whose listing failed, is kept and its namespace untouched.
func TestWitnessNeverAlone(t *testing.T) {
	cases := []struct {
		name string
		api  func(a *fakeAPI) // what the API says of pod u1 (the lease's holder)
	}{
		{"stale cache misses the pod", func(a *fakeAPI) { a.del("u1") }},
		{"API down, cache says Succeeded", func(a *fakeAPI) { a.set("u1", "Succeeded") }},
		{"restored from a backup without the pod", func(a *fakeAPI) { a.pods = map[string]fakePod{} }},
		{"same name, new UID", func(a *fakeAPI) { a.del("u1"); a.pods["u2"] = fakePod{"ns", "p-u1", "Running"} }},
		{"pod Failed", func(a *fakeAPI) { a.set("u1", "Failed") }},
	}
	runtimes := []struct {
		name string
		set  func(f *fixture)
	}{
		{"sandbox READY", func(f *fixture) { f.rt.set("a", cri.StateReady) }},
		{"sandbox READY, address absent", func(f *fixture) { f.rt.set("a", cri.StateReady); f.ns.set("/ns/a", NSAddrAbsent) }},
		{"status fails", func(f *fixture) { f.rt.hide["a"] = true; f.rt.statusErr = errTest }},
		{"listing fails", func(f *fixture) { f.rt.set("a", cri.StateNotReady); f.rt.listErr = errTest }},
		{"netns unknown", func(f *fixture) { f.rt.set("a", cri.StateNotReady); f.ns.set("/ns/a", NSUnknown) }},
	}
	for _, c := range cases {
		for _, rc := range runtimes {
			t.Run(c.name+"/"+rc.name, func(t *testing.T) {
				api := newFakeAPI()
				f := newFixture(t, withAPI(api))
				api.set("u1", "Running")
				f.add("a", "u1")
				f.clk.Advance(time.Hour)
				rc.set(f)
				c.api(api)
				if n := f.rounds(40); n != 0 || !f.held("a") {
					t.Fatal("released on the API's word")
				}
				if len(f.ns.reclaimed) != 0 {
					t.Fatalf("reclaimed %v on the API's word", f.ns.reclaimed)
				}
			})
		}
	}
}

// TestWitnessSameNameNewUID: a pod re-created under its name is another pod. The
// old sandbox's stranded lease (UID u1) is reclaimed when u1 is gone from the API;
// the new pod's lease (UID u2, READY) is kept; a lease that names no UID is matched
// by name, finds the new pod, and is kept.
func TestWitnessSameNameNewUID(t *testing.T) {
	api := newFakeAPI()
	f := newFixture(t, withAPI(api))
	f.add("old", "u1")
	f.add("new", "u2")
	if _, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("nouid"), Pod: ledger.Pod{Namespace: "ns", Name: "p-u1"}, NetNS: ledger.NetNS{Path: "/ns/nouid", Dev: 4, Ino: 9}, Ranges: ranges}); err != nil {
		t.Fatal(err)
	}
	api.pods["u2"] = fakePod{"ns", "p-u1", "Running"} // u1 deleted, u2 created under its name
	f.clk.Advance(time.Hour)
	for _, id := range []string{"old", "nouid"} {
		f.rt.set(id, cri.StateNotReady)
		f.ns.set("/ns/"+id, NSAddrPresent)
	}
	f.rt.set("new", cri.StateReady)
	f.untilReleased("old", 20)
	if f.rounds(20); !f.held("new") || !f.held("nouid") {
		t.Fatalf("new pod's lease held %v, no-UID lease held %v", f.held("new"), f.held("nouid"))
	}
	if len(f.ns.reclaimed) != 1 || f.ns.reclaimed[0] != "/ns/old" {
		t.Fatalf("reclaimed %v", f.ns.reclaimed)
	}
}

// TestWitnessEvidenceMustHold: the API's evidence restarts the suspicion's clock
// and must itself hold for Grace: a pod that looks finished for less (a restored
// backup, then the real API again) has nothing released, and the watch not yet
// synced says nothing.
func TestWitnessEvidenceMustHold(t *testing.T) {
	api := newFakeAPI()
	f := newFixture(t, withAPI(api))
	api.set("u1", "Running")
	f.add("a", "u1")
	f.clk.Advance(time.Hour)
	f.rt.set("a", cri.StateNotReady)
	f.ns.set("/ns/a", NSAddrPresent)
	f.rounds(30) // stranded for 15 s: well past grace on the runtime's evidence alone
	for i := 0; i < 10; i++ {
		api.del("u1")
		f.rounds(1) // finished for one interval: less than grace
		api.set("u1", "Running")
		f.rounds(1)
	}
	if !f.held("a") || len(f.ns.reclaimed) != 0 {
		t.Fatal("released on API evidence that did not hold for grace")
	}
	api.synced = false
	api.del("u1")
	if f.rounds(20); !f.held("a") {
		t.Fatal("released on an unsynced watch")
	}
	api.synced = true
	f.untilReleased("a", 20)
}

// TestNetnsNotVisible: a lease whose namespace directory the agent cannot see is
// judged as one whose namespace was not recorded, except that the API cannot make
// a NOTREADY one go: its namespace may still hold the address. A GONE sandbox's
// lease is released on the runtime's NotFound (a runtime's state wiped with its
// netns directory); a NOTREADY one is kept, its pod finished or not.
func TestNetnsNotVisible(t *testing.T) {
	api := newFakeAPI()
	f := newFixture(t, withAPI(api))
	gone := f.add("gone", "u1")
	f.add("nr", "u2")
	api.set("u2", "Succeeded")
	f.clk.Advance(time.Hour)
	f.rt.set("nr", cri.StateNotReady)
	f.ns.set("/ns/gone", NSNotVisible)
	f.ns.set("/ns/nr", NSNotVisible)
	f.untilReleased("gone", 10)
	if r := lastReason(t, f.l, gone); r != ledger.ReasonReconcileGone {
		t.Fatalf("reason %s", r)
	}
	if f.rounds(30); !f.held("nr") || len(f.ns.reclaimed) != 0 {
		t.Fatal("a NOTREADY sandbox's lease with its namespace out of sight released on the API's word")
	}
	if s := f.r.Summary(); s.Suspect != 1 || s.Leaked != 0 {
		t.Fatalf("summary %+v, want one suspect, none leaked", s)
	}
}

// TestWitnessDeletionConfirmedLive: a pod absent from the watch's cache is only
// taken as deleted once the API server itself says so. While its GET finds the pod
// (the cache is stale: a broken watch, a field selector that misses it) or fails
// (the API server is unreachable), a NOTREADY sandbox whose namespace was not
// recorded is kept and a stranded interface is not removed; once the GET answers
// NotFound, both go. A READY sandbox's pod is reported to the witness.
func TestWitnessDeletionConfirmedLive(t *testing.T) {
	for _, c := range []struct {
		name  string
		stale func(a *fakeAPI)
	}{
		{"API server has the pod", func(a *fakeAPI) {
			a.live = map[string]fakePod{"u1": {"ns", "p-u1", "Running"}, "u2": {"ns", "p-u2", "Running"}}
		}},
		{"API server unreachable", func(a *fakeAPI) { a.liveErr = errTest }},
	} {
		t.Run(c.name, func(t *testing.T) {
			api := newFakeAPI()
			f := newFixture(t, withAPI(api))
			api.set("u1", "Running")
			api.set("u2", "Running")
			api.set("u3", "Running")
			unrec, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("unrec"), Pod: ledger.Pod{Namespace: "ns", Name: "p-u1", UID: "u1"}, Ranges: ranges})
			if err != nil {
				t.Fatal(err)
			}
			f.add("strand", "u2")
			f.add("ready", "u3")
			f.clk.Advance(time.Hour)
			f.rt.set("unrec", cri.StateNotReady)
			f.rt.set("strand", cri.StateNotReady)
			f.ns.set("/ns/strand", NSAddrPresent)
			f.rt.set("ready", cri.StateReady)
			c.stale(api)
			api.del("u1") // the cache lacks both pods
			api.del("u2")
			if n := f.rounds(40); n != 0 || !f.held("unrec") || !f.held("strand") || len(f.ns.reclaimed) != 0 {
				t.Fatalf("released %d, reclaimed %v on the cache's word alone", n, f.ns.reclaimed)
			}
			if api.gets == 0 {
				t.Fatal("the API server was never asked")
			}
			if len(api.ready) == 0 || api.ready[0] != "u3" {
				t.Fatalf("READY sandboxes' pods reported: %v, want u3", api.ready)
			}
			api.mu.Lock()
			api.live, api.liveErr = nil, nil // the API server confirms
			api.mu.Unlock()
			f.untilReleased("unrec", 5)
			f.untilReleased("strand", 5)
			if len(f.ns.reclaimed) != 1 {
				t.Fatalf("reclaimed %v", f.ns.reclaimed)
			}
			h, err := f.l.History("net", unrec.IPs[0].Addr())
			if err != nil || len(h) != 1 || !strings.Contains(h[0].Detail, "pod deleted from the API") || !strings.Contains(h[0].Detail, "(confirmed by the API server)") {
				t.Fatalf("history %+v %v", h, err)
			}
		})
	}
}
