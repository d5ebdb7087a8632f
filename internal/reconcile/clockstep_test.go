package reconcile

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
)

var steps = []struct {
	name string
	d    time.Duration
}{{"wall clock stepped forward 1h", time.Hour}, {"wall clock stepped back 1h", -time.Hour}}

// TestClockStepReconcilerGrace: a wall-clock step during a suspicion neither hurries
// the release (forward: the grace still runs its full length) nor starves it
// (backward: still released within grace plus one interval of the first
// observation).
func TestClockStepReconcilerGrace(t *testing.T) {
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			f := newFixture(t, nil)
			f.add("a", "u1")
			f.clk.Advance(time.Hour) // past the in-creation window
			f.ns.set("/ns/a", NSGone)
			start := f.clk.Mono()
			f.r.Reconcile(f.ctx) // first observation
			f.clk.Step(st.d)
			for f.held("a") {
				if f.clk.Mono()-start > grace+interval {
					t.Fatalf("not released %v after the first observation; want within grace+interval %v", f.clk.Mono()-start, grace+interval)
				}
				f.clk.Advance(interval)
				f.r.Reconcile(f.ctx)
			}
			if took := f.clk.Mono() - start; took < grace {
				t.Fatalf("released %v after the first observation, before the grace %v", took, grace)
			}
		})
	}
}

// TestClockStepInCreation: the in-creation window of a lease whose sandbox the
// runtime does not know yet (its ADD may not have returned) is measured on the
// monotonic clock, for GC, supersession and the reconciler alike.
func TestClockStepInCreation(t *testing.T) {
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			f := newFixture(t, nil)
			ls := f.add("a", "u1") // created and seen now; its sandbox is not known yet
			f.ns.set("/ns/a", NSGone)
			f.clk.Step(st.d)
			f.clk.Advance(grace / 2)
			if f.r.MayRelease(f.ctx, ls) {
				t.Fatal("GC may release a lease still in creation")
			}
			if got := f.r.Supersedable(f.ctx, []ledger.Lease{ls}); len(got) != 0 {
				t.Fatal("a lease still in creation may be superseded")
			}
			if rd := f.r.Reconcile(f.ctx); len(rd.Released) != 0 || rd.Suspect != 0 {
				t.Fatalf("round %+v: a lease in creation suspected or released", rd)
			}
			f.clk.Advance(grace / 2)
			if !f.r.MayRelease(f.ctx, ls) {
				t.Fatal("GC may not release a gone sandbox's lease a full grace after its creation")
			}
			if got := f.r.Supersedable(f.ctx, []ledger.Lease{ls}); len(got) != 1 {
				t.Fatal("a gone sandbox's lease a full grace after its creation may not be superseded")
			}
		})
	}
}

// TestClockStepStrandedGrace: the stranded grace before a reclaim is not shortened
// by a forward step nor lengthened by a backward one.
func TestClockStepStrandedGrace(t *testing.T) {
	const sg = 5 * time.Second
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			f := newFixture(t, func(o *Options) { o.ReclaimStranded = true; o.StrandedGrace = sg })
			f.add("a", "u1")
			f.clk.Advance(time.Hour)
			f.rt.set("a", cri.StateNotReady)
			f.ns.set("/ns/a", NSAddrPresent)
			start := f.clk.Mono()
			f.r.Reconcile(f.ctx)
			f.clk.Step(st.d)
			for f.held("a") {
				if f.clk.Mono()-start > sg+interval {
					t.Fatalf("not reclaimed %v after the first observation; want within %v", f.clk.Mono()-start, sg+interval)
				}
				f.clk.Advance(interval)
				f.r.Reconcile(f.ctx)
			}
			if took := f.clk.Mono() - start; took < sg {
				t.Fatalf("reclaimed %v after the first observation, before the stranded grace %v", took, sg)
			}
		})
	}
}

// TestRestartCountsFromFirstSight: a reconciler started over leases made long ago
// (by wall time, or by a wall clock stepped forward before the start) counts their
// age from its first sight of them: a restart can delay a release, never hurry it.
func TestRestartCountsFromFirstSight(t *testing.T) {
	f := newFixture(t, nil)
	ls := f.add("a", "u1")
	f.ns.set("/ns/a", NSGone)
	f.clk.Step(24 * time.Hour) // the wall says the lease is a day old
	r2, err := New(Options{Ledger: f.l, Runtime: f.rt, Netns: f.ns, Interval: interval, Grace: grace, Clock: f.clk, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if r2.MayRelease(f.ctx, ls) {
		t.Fatal("a new reconciler lets GC release a lease it has just seen for the first time")
	}
	f.clk.Advance(grace)
	if !r2.MayRelease(f.ctx, ls) {
		t.Fatal("GC may not release a gone sandbox's lease a grace after the first sight")
	}
}

// TestDecisionLog: every round writes one line per lease with its decision and the
// evidence behind it: the sandbox verdict and where it came from, the namespace
// probe, the observations that counted.
func TestDecisionLog(t *testing.T) {
	var buf bytes.Buffer
	f := newFixture(t, func(o *Options) {
		o.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	f.add("gone", "u1")
	f.add("ready", "u2")
	f.rt.set("ready", cri.StateReady)
	f.clk.Advance(time.Hour)
	f.ns.set("/ns/gone", NSGone)
	rounds := 0
	for f.held("gone") && rounds < 10 {
		buf.Reset()
		f.clk.Advance(interval)
		f.r.Reconcile(f.ctx)
		rounds++
	}
	type line struct {
		Msg, Attachment, Decision, Sandbox, Status, Netns string
		Observations                                      int
	}
	var lines []line
	for _, raw := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l line
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		if l.Msg == "reconcile: decision" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("last round logged %d decisions, want one per lease (2):\n%s", len(lines), buf.String())
	}
	for _, l := range lines {
		switch l.Attachment {
		case key("gone").String():
			if !strings.HasPrefix(l.Decision, "release reconcile-gone") || l.Sandbox != SandboxGone || l.Status != "not listed; status: not found" || l.Netns != NSGone.String() || l.Observations < 2 {
				t.Fatalf("release line %+v", l)
			}
		case key("ready").String():
			if l.Decision != "keep: sandbox READY" || l.Sandbox != SandboxReady || l.Status != "listed READY" {
				t.Fatalf("keep line %+v", l)
			}
		default:
			t.Fatalf("line for %q", l.Attachment)
		}
	}
}
