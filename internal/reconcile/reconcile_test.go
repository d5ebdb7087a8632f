package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// fakeRuntime is a Runtime whose answers the test sets.
type fakeRuntime struct {
	mu        sync.Mutex
	state     map[string]cri.State // known sandboxes
	listErr   error
	statusErr error
	hide      map[string]bool // known but omitted from listings (a partial listing)
	empty     bool            // listings are empty (status still answers from state)
	lists     int
	statuses  int
	// statusErrFor fails SandboxStatus for the named sandboxes only.
	statusErrFor map[string]error
	// afterList runs, with f.mu held, after a listing was made and before it is
	// returned: what happens in the runtime while the reconciler works.
	afterList func()
}

func newFakeRuntime() *fakeRuntime {
	return &fakeRuntime{state: map[string]cri.State{}, hide: map[string]bool{}}
}

var _ Runtime = (*fakeRuntime)(nil)

func (f *fakeRuntime) ListSandboxes(ctx context.Context) ([]cri.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lists++
	if f.listErr != nil {
		return nil, f.listErr
	}
	var out []cri.Sandbox
	if f.empty {
		return out, nil
	}
	for id, st := range f.state {
		if !f.hide[id] {
			out = append(out, cri.Sandbox{ID: id, State: st})
		}
	}
	if f.afterList != nil {
		f.afterList()
	}
	return out, nil
}

func (f *fakeRuntime) SandboxStatus(ctx context.Context, id string) (cri.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses++
	if f.statusErr != nil {
		return cri.Sandbox{}, f.statusErr
	}
	if err := f.statusErrFor[id]; err != nil {
		return cri.Sandbox{}, err
	}
	st, ok := f.state[id]
	if !ok {
		return cri.Sandbox{}, fmt.Errorf("fake: %s: %w", id, cri.ErrNotFound)
	}
	return cri.Sandbox{ID: id, State: st}, nil
}

func (f *fakeRuntime) set(id string, st cri.State) { f.mu.Lock(); f.state[id] = st; f.mu.Unlock() }
func (f *fakeRuntime) remove(id string)            { f.mu.Lock(); delete(f.state, id); f.mu.Unlock() }

// fakeNetns answers from a map of netns path -> verdict (default: address present).
type fakeNetns struct {
	mu        sync.Mutex
	st        map[string]NSState
	reclaimed []string
	// reclaimErr, when set, fails Reclaim; reclaimLeaves leaves the address in place
	// (an interface the reclaim did not find, another one holding the address).
	reclaimErr    error
	reclaimLeaves bool
}

var _ Netns = (*fakeNetns)(nil)

func (f *fakeNetns) Probe(ns ledger.NetNS, ips []netip.Prefix) (NSState, string) {
	if ns.Path == "" {
		return NSNotRecorded, ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.st[ns.Path]; ok {
		return s, ""
	}
	return NSAddrPresent, ""
}

func (f *fakeNetns) Reclaim(ns ledger.NetNS, _ string, ips []netip.Prefix) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reclaimed = append(f.reclaimed, ns.Path)
	if f.reclaimErr != nil {
		return "", f.reclaimErr
	}
	if !f.reclaimLeaves {
		f.st[ns.Path] = NSAddrAbsent
	}
	return "removed eth0", nil
}

func (f *fakeNetns) set(path string, s NSState) { f.mu.Lock(); f.st[path] = s; f.mu.Unlock() }

const (
	interval = 500 * time.Millisecond
	grace    = time.Second
)

type fixture struct {
	t   *testing.T
	clk *clocktest.Clock
	l   *ledger.Ledger
	rt  *fakeRuntime
	ns  *fakeNetns
	r   *Reconciler
	ctx context.Context
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) { w.t.Helper(); w.t.Log(string(p)); return len(p), nil }

func newFixture(t *testing.T, mod func(*Options)) *fixture {
	t.Helper()
	clk := clocktest.New()
	l := ledgertest.Open(t, memstore.New(), ledger.Options{Clock: clk}) // audited at the end
	var err error
	f := &fixture{t: t, clk: clk, l: l, rt: newFakeRuntime(), ns: &fakeNetns{st: map[string]NSState{}}, ctx: context.Background()}
	o := Options{Ledger: l, Runtime: f.rt, Netns: f.ns, Interval: interval, Grace: grace, StrandedGrace: 5 * time.Second, Clock: clk, Logger: testLogger(t)}
	if mod != nil {
		mod(&o)
	}
	f.r, err = New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

var ranges = mustRanges(`[[{"subnet":"10.246.0.0/24"}]]`)

func mustRanges(s string) []pool.RangeSet {
	r, err := pool.ParseRangeSets([]byte(s))
	if err != nil {
		panic(err)
	}
	return r
}

func key(id string) ledger.Key { return ledger.Key{Network: "net", ContainerID: id, IfName: "eth0"} }

// add allocates a lease for sandbox id of pod uid, netns path "/ns/"+id, and has the
// reconciler see it at once, as a round right after the ADD would: its in-creation
// window runs from now.
func (f *fixture) add(id, uid string) ledger.Lease {
	f.t.Helper()
	ls, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key(id), Pod: ledger.Pod{Namespace: "ns", Name: "p-" + uid, UID: uid}, NetNS: ledger.NetNS{Path: "/ns/" + id, Dev: 4, Ino: uint64(len(id))}, Ranges: ranges})
	if err != nil {
		f.t.Fatal(err)
	}
	f.r.age(ls)
	return ls
}

func (f *fixture) held(id string) bool { _, ok := f.l.Lease(key(id)); return ok }

// rounds runs n rounds, advancing the clock by interval before each.
func (f *fixture) rounds(n int) (released int) {
	for i := 0; i < n; i++ {
		f.clk.Advance(interval)
		released += len(f.r.Reconcile(f.ctx).Released)
	}
	return released
}

// untilReleased runs rounds until id's lease is released and returns the time
// from start to then; it fails after max rounds.
func (f *fixture) untilReleased(id string, max int) time.Duration {
	f.t.Helper()
	start := f.clk.Now()
	for i := 0; i < max; i++ {
		f.clk.Advance(interval)
		f.r.Reconcile(f.ctx)
		if !f.held(id) {
			return f.clk.Now().Sub(start)
		}
	}
	f.t.Fatalf("lease of %s not released after %d rounds", id, max)
	return 0
}

func lastReason(t *testing.T, l *ledger.Ledger, ls ledger.Lease) ledger.Reason {
	t.Helper()
	h, err := l.History("net", ls.IPs[0].Addr())
	if err != nil || len(h) == 0 {
		t.Fatalf("history of %s: %v %v", ls.IPs[0], h, err)
	}
	return h[len(h)-1].Reason
}

func TestReadyNeverReleased(t *testing.T) {
	for _, ns := range []NSState{NSGone, NSAddrAbsent, NSUnknown, NSAddrPresent} {
		t.Run(ns.String(), func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.ReclaimStranded = true; o.StrandedGrace = time.Second })
			f.add("a", "u1")
			f.clk.Advance(time.Hour)
			f.rt.set("a", cri.StateReady)
			f.ns.set("/ns/a", ns)
			if n := f.rounds(20); n != 0 || !f.held("a") {
				t.Fatalf("READY sandbox's lease released (%d)", n)
			}
			// also when only SandboxStatus sees it (partial listing)
			f.rt.hide["a"] = true
			if n := f.rounds(20); n != 0 || !f.held("a") {
				t.Fatal("READY sandbox's lease released on a partial listing")
			}
			if len(f.ns.reclaimed) != 0 {
				t.Fatal("reclaimed a READY sandbox's interface")
			}
		})
	}
}

func TestAbandonedReleased(t *testing.T) {
	cases := []struct {
		name   string
		state  *cri.State // nil: gone
		ns     NSState
		reason ledger.Reason
	}{
		{"gone, netns gone", nil, NSGone, ledger.ReasonReconcileGone},
		{"gone, address absent", nil, NSAddrAbsent, ledger.ReasonReconcileGone},
		{"notready, netns gone", ptr(cri.StateNotReady), NSGone, ledger.ReasonReconcileNotReady},
		{"notready, address absent", ptr(cri.StateNotReady), NSAddrAbsent, ledger.ReasonReconcileNotReady},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			ls := f.add("a", "u1")
			f.add("b", "u2")
			f.rt.set("b", cri.StateReady)
			f.clk.Advance(time.Hour)
			if c.state != nil {
				f.rt.set("a", *c.state)
			}
			f.ns.set("/ns/a", c.ns)
			// one observation is not enough, whatever the age
			f.r.Reconcile(f.ctx)
			if !f.held("a") {
				t.Fatal("released on one observation")
			}
			took := f.untilReleased("a", 10)
			if took < grace-interval || took > grace {
				t.Fatalf("released %v after the first observation's round; want grace %v (±interval)", took+interval, grace)
			}
			if r := lastReason(t, f.l, ls); r != c.reason {
				t.Fatalf("reason %s, want %s", r, c.reason)
			}
			if !f.held("b") {
				t.Fatal("READY lease b released")
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func TestGoneWithoutNetnsRecorded(t *testing.T) {
	f := newFixture(t, nil)
	ls, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("a"), Pod: ledger.Pod{UID: "u"}, Ranges: ranges})
	if err != nil {
		t.Fatal(err)
	}
	f.clk.Advance(time.Hour)
	f.untilReleased("a", 5)
	if r := lastReason(t, f.l, ls); r != ledger.ReasonReconcileGone {
		t.Fatalf("reason %s", r)
	}
	// NOTREADY with nothing to verify: suspected, never released
	_, _, err = f.l.Allocate(ledger.AllocateRequest{Key: key("b"), Pod: ledger.Pod{UID: "u2"}, Ranges: ranges})
	if err != nil {
		t.Fatal(err)
	}
	f.rt.set("b", cri.StateNotReady)
	f.clk.Advance(time.Hour)
	if f.rounds(20); !f.held("b") {
		t.Fatal("NOTREADY lease without a recorded netns released")
	}
	a := f.r.Summary()
	if a.Suspect != 1 || a.Leaked != 0 {
		t.Fatalf("audit %+v", a)
	}
}

func TestStrandedKeptAndReported(t *testing.T) {
	f := newFixture(t, nil)
	f.add("a", "u1")
	f.clk.Advance(time.Hour)
	f.rt.set("a", cri.StateNotReady)
	f.ns.set("/ns/a", NSAddrPresent)
	if n := f.rounds(100); n != 0 || !f.held("a") {
		t.Fatal("stranded lease released without --reclaim-stranded")
	}
	a := f.r.Summary()
	if a.Stranded != 1 || a.Suspect != 1 || a.Leaked != 0 || len(a.Suspects) != 1 {
		t.Fatalf("audit %+v", a)
	}
	v := f.r.Verdict(ledger.Key{Network: "net", ContainerID: "a", IfName: "eth0"})
	if v.Sandbox != SandboxNotReady || v.Suspect == "" {
		t.Fatalf("view %+v", v)
	}
	// a gone sandbox whose namespace still holds the address is stranded too
	f.rt.remove("a")
	if n := f.rounds(20); n != 0 || !f.held("a") {
		t.Fatal("gone-but-configured lease released")
	}
	if len(f.ns.reclaimed) != 0 {
		t.Fatal("reclaimed without the flag")
	}
	// once the namespace lets the address go, it is released after grace
	f.ns.set("/ns/a", NSGone)
	f.untilReleased("a", 5)
}

func TestStrandedReclaim(t *testing.T) {
	f := newFixture(t, func(o *Options) { o.ReclaimStranded = true; o.StrandedGrace = 5 * time.Second })
	ls := f.add("a", "u1")
	f.clk.Advance(time.Hour)
	f.rt.set("a", cri.StateNotReady)
	f.ns.set("/ns/a", NSAddrPresent)
	took := f.untilReleased("a", 20)
	if took < 5*time.Second || took > 5*time.Second+interval {
		t.Fatalf("reclaimed after %v, want stranded grace 5s", took)
	}
	if len(f.ns.reclaimed) != 1 || f.ns.reclaimed[0] != "/ns/a" {
		t.Fatalf("reclaimed %v", f.ns.reclaimed)
	}
	if r := lastReason(t, f.l, ls); r != ledger.ReasonReconcileNotReady {
		t.Fatalf("reason %s", r)
	}
	// never for a gone sandbox (nothing vouches the namespace is that sandbox's)
	f.add("b", "u2")
	f.clk.Advance(time.Hour)
	f.ns.set("/ns/b", NSAddrPresent)
	if f.rounds(30); !f.held("b") || len(f.ns.reclaimed) != 1 {
		t.Fatal("reclaimed a gone sandbox's namespace")
	}
}

// TestStrandedReclaimVerified: a reclaim that fails, or after which the address is
// still configured in the namespace, releases nothing.
func TestStrandedReclaimVerified(t *testing.T) {
	for _, c := range []struct {
		name   string
		err    error
		leaves bool
	}{{"reclaim fails", errors.New("netns identity changed"), false}, {"address still present", nil, true}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.ReclaimStranded = true; o.StrandedGrace = 5 * time.Second })
			f.ns.reclaimErr, f.ns.reclaimLeaves = c.err, c.leaves
			f.add("a", "u1")
			f.clk.Advance(time.Hour)
			f.rt.set("a", cri.StateNotReady)
			f.ns.set("/ns/a", NSAddrPresent)
			f.rounds(30)
			if len(f.ns.reclaimed) == 0 {
				t.Fatal("reclaim never tried")
			}
			if !f.held("a") {
				t.Fatal("released a stranded lease whose address was not verified gone")
			}
		})
	}
}

func TestListingErrorNoAction(t *testing.T) {
	f := newFixture(t, nil)
	f.add("a", "u1")
	f.clk.Advance(time.Hour)
	f.ns.set("/ns/a", NSGone)
	f.rt.listErr = errors.New("connection refused")
	if n := f.rounds(50); n != 0 || !f.held("a") {
		t.Fatal("released while the runtime errors")
	}
	if f.rt.statuses != 0 {
		t.Fatal("asked for statuses after a failed listing")
	}
	a := f.r.Summary()
	if a.RuntimeOK {
		t.Fatal("runtime ok after failed listings")
	}
	// back: the suspicion starts only now; release needs the full grace again
	f.rt.listErr = nil
	if took := f.untilReleased("a", 10); took < grace {
		t.Fatalf("released %v after the runtime answered, before grace", took)
	}
}

func TestStatusErrorNoAction(t *testing.T) {
	f := newFixture(t, nil)
	f.add("a", "u1")
	f.clk.Advance(time.Hour)
	f.ns.set("/ns/a", NSGone)
	f.rt.statusErr = errors.New("deadline exceeded")
	if n := f.rounds(50); n != 0 || !f.held("a") {
		t.Fatal("released on a status error")
	}
}

func TestEmptyListingContradictsHistory(t *testing.T) {
	f := newFixture(t, nil)
	for _, id := range []string{"a", "b", "c"} {
		f.add(id, "u-"+id)
		f.rt.set(id, cri.StateReady)
	}
	f.clk.Advance(time.Hour)
	f.rounds(2)
	// runtime answers an empty list, but still knows every sandbox: nothing happens
	f.rt.empty = true
	if n := f.rounds(20); n != 0 {
		t.Fatal("released on an empty listing while the sandboxes exist")
	}
	if !f.r.Last().Doubtful {
		t.Fatal("round not doubtful")
	}
	// a reboot: the runtime forgot everything and answers empty forever
	f.rt.empty = false
	f.rounds(1)
	f.rt.mu.Lock()
	f.rt.state = map[string]cri.State{}
	f.rt.mu.Unlock()
	for _, id := range []string{"a", "b", "c"} {
		f.ns.set("/ns/"+id, NSGone)
	}
	f.clk.Advance(interval)
	rd := f.r.Reconcile(f.ctx)
	if !rd.Doubtful || len(rd.Released) != 0 {
		t.Fatalf("first empty round: %+v", rd)
	}
	start := rd.At
	for i := 0; i < 10 && len(f.l.Leases("")) > 0; i++ {
		f.clk.Advance(interval)
		f.r.Reconcile(f.ctx)
	}
	if n := len(f.l.Leases("")); n != 0 {
		t.Fatalf("%d leases left after the reboot", n)
	}
	if took := f.clk.Now().Sub(start); took > grace+interval {
		t.Fatalf("released %v after the runtime answered; want within grace+interval %v", took, grace+interval)
	}
}

// TestPartialListingNoAction: a sandbox listed before that is missing from later
// listings while the runtime still knows it makes those listings untrustworthy
// (invariant 4): nothing is released while it lasts, however long.
func TestPartialListingNoAction(t *testing.T) {
	f := newFixture(t, nil)
	f.add("a", "u1")
	f.add("b", "u2")
	f.add("c", "u3")
	f.rt.set("a", cri.StateReady)
	f.rt.set("c", cri.StateReady) // keeps the listing non-empty
	f.clk.Advance(time.Hour)
	f.rounds(1)           // a is listed
	f.rt.hide["a"] = true // now a is missing from the listing but known
	f.ns.set("/ns/b", NSGone)
	if n := f.rounds(20); n != 0 || !f.held("b") {
		t.Fatal("released during a partial listing")
	}
	if rd := f.r.Last(); !rd.Doubtful || !strings.Contains(rd.Why, "partial listing") {
		t.Fatalf("last round %+v, want doubtful for a partial listing", rd)
	}
	delete(f.rt.hide, "a")
	f.untilReleased("b", 5)
	if !f.held("a") {
		t.Fatal("a released")
	}
}

// TestSandboxCreatedAfterListing: on a busy node a sandbox is created between the
// listing and the status calls of every round (its lease exists, the listing
// missed it, its status says READY). That is no reason to doubt the round: the
// lease of a gone sandbox is still released within grace plus one interval of its
// first observation (invariant 3), and the new sandboxes' leases are kept.
func TestSandboxCreatedAfterListing(t *testing.T) {
	f := newFixture(t, nil)
	f.add("gone", "u0")
	f.clk.Advance(time.Hour)
	f.ns.set("/ns/gone", NSGone)
	n := 0
	f.rt.afterList = func() {
		// a pod starts while the reconciler works: ADD, then the runtime's record
		n++
		id := fmt.Sprintf("new%d", n)
		if _, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key(id), Pod: ledger.Pod{UID: id}, NetNS: ledger.NetNS{Path: "/ns/" + id, Dev: 4, Ino: uint64(100 + n)}, Ranges: ranges}); err != nil {
			t.Error(err)
		}
		f.rt.state[id] = cri.StateReady
	}
	took := f.untilReleased("gone", 10)
	if took > grace+interval {
		t.Fatalf("released %v after the first round; want within grace+interval %v", took, grace+interval)
	}
	for i := 1; i <= n; i++ {
		if !f.held(fmt.Sprintf("new%d", i)) {
			t.Fatalf("lease of READY sandbox new%d released", i)
		}
	}
	if rd := f.r.Last(); rd.Doubtful {
		t.Fatalf("round doubtful: %s", rd.Why)
	}
}

// TestStatusErrorConfined: one sandbox whose status keeps failing makes only its own
// leases doubtful; another gone sandbox's lease is still released on time, and the
// failing one's lease is kept and shown UNKNOWN.
func TestStatusErrorConfined(t *testing.T) {
	f := newFixture(t, nil)
	f.add("broken", "u1")
	f.add("gone", "u2")
	f.add("ready", "u3")
	f.rt.set("ready", cri.StateReady)
	f.rt.statusErrFor = map[string]error{"broken": errors.New("rpc error: code = Unknown desc = failed to get sandbox status")}
	f.clk.Advance(time.Hour)
	f.ns.set("/ns/broken", NSGone)
	f.ns.set("/ns/gone", NSGone)
	took := f.untilReleased("gone", 10)
	if took > grace+interval {
		t.Fatalf("released %v after the first round; want within grace+interval %v", took, grace+interval)
	}
	if n := f.rounds(20); n != 0 || !f.held("broken") || !f.held("ready") {
		t.Fatal("released a lease whose sandbox's status fails, or a READY one")
	}
	v := f.r.Verdict(ledger.Key{Network: "net", ContainerID: "broken", IfName: "eth0"})
	if v.Sandbox != SandboxUnknown || v.Suspect != "" {
		t.Fatalf("view of the failing sandbox's lease %+v, want UNKNOWN and unsuspected", v)
	}
	if rd := f.r.Last(); rd.Doubtful || rd.Unknown != 1 {
		t.Fatalf("last round %+v, want not doubtful with one unknown", rd)
	}
	// status answers again: the lease is judged like any other
	f.rt.statusErrFor = nil
	f.untilReleased("broken", 10)
}

func TestSuspicionResets(t *testing.T) {
	f := newFixture(t, nil)
	f.add("a", "u1")
	f.clk.Advance(time.Hour)
	f.rt.set("a", cri.StateNotReady)
	f.ns.set("/ns/a", NSAddrAbsent)
	f.rounds(1)
	f.rt.set("a", cri.StateReady) // seen READY again
	f.rounds(1)
	f.rt.set("a", cri.StateNotReady)
	f.rounds(2) // 1s since the old first sighting, but only 0.5s since the new one
	if !f.held("a") {
		t.Fatal("released on a suspicion interrupted by READY")
	}
	f.untilReleased("a", 5)
}

func TestYoungLeaseInCreation(t *testing.T) {
	f := newFixture(t, nil)
	f.add("a", "u1") // sandbox not yet known to the runtime
	f.ns.set("/ns/a", NSAddrAbsent)
	f.clk.Advance(grace - interval - time.Millisecond)
	f.rounds(1)
	v := f.r.Verdict(ledger.Key{Network: "net", ContainerID: "a", IfName: "eth0"})
	if v.Suspect != "" {
		t.Fatalf("young lease suspected: %+v", v)
	}
	f.untilReleased("a", 10)
}

// TestLeakedAtAddReclaimTime: a lease whose sandbox never came (the ADD's result was
// lost) is released within Grace plus one Interval of its creation (invariant 3),
// and not on the first trustworthy observation even when Grace has passed (the
// two-observation rule).
func TestLeakedAtAddReclaimTime(t *testing.T) {
	for _, ns := range []NSState{NSGone, NSAddrAbsent} {
		t.Run(ns.String(), func(t *testing.T) {
			f := newFixture(t, nil)
			f.add("a", "u1")
			f.ns.set("/ns/a", ns)
			start := f.clk.Now()
			f.r.Reconcile(f.ctx) // the round right after ADD
			for f.clk.Now().Sub(start) < grace {
				f.rounds(1)
			}
			// now Grace has passed, but this is the first observation that counts
			if !f.held("a") {
				t.Fatalf("released after %v on one counted observation", f.clk.Now().Sub(start))
			}
			took := f.clk.Now().Sub(start) + f.untilReleased("a", 10)
			if took > grace+interval {
				t.Fatalf("leak reclaimed %v after ADD, want within grace+interval = %v", took, grace+interval)
			}
			t.Logf("leaked at ADD: released %v after it (grace %v, interval %v)", took, grace, interval)
		})
	}
}

func TestReleaseOnlySameHolder(t *testing.T) {
	f := newFixture(t, nil)
	ls := f.add("a", "u1")
	if _, ok, _ := f.l.ReleaseIfCreated(ls.Key, ls.Created.Add(time.Nanosecond), ledger.ReasonReconcileGone, "x"); ok {
		t.Fatal("released another holder")
	}
	if _, ok, _ := f.l.ReleaseIfCreated(ls.Key, ls.Created, ledger.ReasonReconcileGone, "x"); !ok {
		t.Fatal("not released")
	}
}

func TestSupersedable(t *testing.T) {
	cases := []struct {
		name      string
		state     *cri.State
		statusErr bool
		ns        NSState
		want      bool
	}{
		{"gone, netns gone", nil, false, NSGone, true},
		{"notready, netns gone", ptr(cri.StateNotReady), false, NSGone, true},
		{"notready, address absent", ptr(cri.StateNotReady), false, NSAddrAbsent, true},
		{"notready, address present", ptr(cri.StateNotReady), false, NSAddrPresent, false},
		{"notready, netns unknown", ptr(cri.StateNotReady), false, NSUnknown, false},
		{"ready", ptr(cri.StateReady), false, NSGone, false},
		{"runtime does not answer", nil, true, NSGone, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			old := f.add("old", "u1")
			f.clk.Advance(time.Hour)
			if c.state != nil {
				f.rt.set("old", *c.state)
			}
			if c.statusErr {
				f.rt.statusErr = errors.New("unavailable")
			}
			f.ns.set("/ns/old", c.ns)
			got := f.r.Supersedable(f.ctx, []ledger.Lease{old})
			if (len(got) == 1) != c.want {
				t.Fatalf("Supersedable = %v, want %v", got, c.want)
			}
			// what the agent does with the answer: one transaction
			nw, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("new"), Pod: old.Pod, NetNS: ledger.NetNS{Path: "/ns/new"}, Ranges: ranges, Supersede: got})
			if err != nil {
				t.Fatal(err)
			}
			n := len(f.l.LeasesOfPod("net", "u1"))
			if c.want && (n != 1 || nw.IPs[0] != old.IPs[0]) {
				t.Fatalf("superseded: pod holds %d leases, new %v old %v", n, nw.IPs, old.IPs)
			}
			if !c.want && (n != 2 || nw.IPs[0] == old.IPs[0]) {
				t.Fatalf("kept: pod holds %d leases, new %v old %v", n, nw.IPs, old.IPs)
			}
			if c.want && lastReason(t, f.l, old) != ledger.ReasonSuperseded {
				t.Fatal("reason not superseded")
			}
		})
	}
	// an old lease in creation (young, unknown to the runtime) is kept
	f := newFixture(t, nil)
	old := f.add("old", "u1")
	f.ns.set("/ns/old", NSAddrAbsent)
	if got := f.r.Supersedable(f.ctx, []ledger.Lease{old}); len(got) != 0 {
		t.Fatal("young old lease superseded")
	}
}

func TestMayRelease(t *testing.T) {
	cases := []struct {
		name      string
		state     *cri.State
		statusErr bool
		ns        NSState
		want      bool
	}{
		{"ready", ptr(cri.StateReady), false, NSGone, false},
		{"runtime error", nil, true, NSGone, false},
		{"gone", nil, false, NSGone, true},
		{"notready, absent", ptr(cri.StateNotReady), false, NSAddrAbsent, true},
		{"notready, stranded", ptr(cri.StateNotReady), false, NSAddrPresent, false},
		{"gone but younger than grace (maybe in creation)", nil, false, NSGone, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			ls := f.add("a", "u1")
			if !strings.Contains(c.name, "younger") {
				f.clk.Advance(grace)
			}
			if c.state != nil {
				f.rt.set("a", *c.state)
			}
			if c.statusErr {
				f.rt.statusErr = errors.New("unavailable")
			}
			f.ns.set("/ns/a", c.ns)
			if got := f.r.MayRelease(f.ctx, ls); got != c.want {
				t.Fatalf("MayRelease = %v, want %v", got, c.want)
			}
		})
	}
}
