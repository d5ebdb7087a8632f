package reconcile

import (
	"context"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/memstore"
)

// bootFixture is a fixture whose ledger stamps leases with a boot clock that the
// test drives along with the monotonic clock.
type bootFixture struct {
	*fixture
	boot *clocktest.Boot
	lclk *clocktest.Clock // the ledger's clock
}

func newBootFixture(t *testing.T) *bootFixture {
	t.Helper()
	clk := clocktest.New()
	boot := clocktest.NewBoot("boot-1", time.Hour)
	l := ledgertest.Open(t, memstore.New(), ledger.Options{Clock: clk, Boot: boot})
	f := &fixture{t: t, clk: clk, l: l, rt: newFakeRuntime(), ns: &fakeNetns{st: map[string]NSState{}}, ctx: context.Background()}
	b := &bootFixture{fixture: f, boot: boot, lclk: clk}
	b.restart()
	return b
}

// advance lets d pass on both clocks.
func (b *bootFixture) advance(d time.Duration) {
	b.clk.Advance(d)
	if b.lclk != b.clk {
		b.lclk.Advance(d)
	}
	b.boot.Advance(d)
}

// restart is an agent restart: a new reconciler with nothing in memory and a
// monotonic clock of its own, over the same ledger and boot clock.
func (b *bootFixture) restart() {
	b.t.Helper()
	clk := clocktest.New()
	clk.Step(b.clk.Now().Sub(clk.Now())) // the same wall time, a new monotonic origin
	b.clk = clk
	r, err := New(Options{Ledger: b.l, Runtime: b.rt, Netns: b.ns, Interval: interval, Grace: grace, Clock: clk, Boot: b.boot, Logger: testLogger(b.t)})
	if err != nil {
		b.t.Fatal(err)
	}
	b.r = r
}

// releasedAfter runs rounds every interval, the first after first, until id's lease
// is released, and returns the time from now to the release.
func (b *bootFixture) releasedAfter(id string, first time.Duration, max int) time.Duration {
	b.t.Helper()
	start := b.clk.Mono()
	b.advance(first)
	for i := 0; i < max; i++ {
		if i > 0 {
			b.advance(interval)
		}
		b.r.Reconcile(b.ctx)
		if !b.held(id) {
			return b.clk.Mono() - start
		}
	}
	b.t.Fatalf("lease of %s not released after %d rounds", id, max)
	return 0
}

// TestRestartSameBootKeepsAge: a lease allocated before an agent restart on the same
// boot is as old after the restart as the boot clock says, so when its sandbox goes
// at the restart and the first round comes a whole interval later, its first
// observation counts and it is released grace plus at most one interval after the
// sandbox went (invariant 3). When its reading is of another boot, or it has none,
// its age starts again at the first round (in creation until grace has passed) and
// the release comes one interval later than that.
func TestRestartSameBootKeepsAge(t *testing.T) {
	none := func(*bootFixture) {}
	cases := []struct {
		name          string
		alloc, before func(b *bootFixture) // before the allocation; before the restart
		want          time.Duration        // from the sandbox's removal to the release
	}{
		{"same boot", none, none, grace + interval},
		{"other boot", none, func(b *bootFixture) { b.boot.Reboot("boot-2", time.Minute) }, grace + 2*interval},
		{"boot clock unknown", none, func(b *bootFixture) { b.boot.Unknown() }, grace + 2*interval},
		{"lease without a reading", func(b *bootFixture) { b.boot.Unknown() }, func(b *bootFixture) { b.boot.Reboot("boot-1", 2*time.Hour) }, grace + 2*interval},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBootFixture(t)
			c.alloc(b)
			b.add("a", "u1")
			b.rt.set("a", cri.StateReady)
			b.ns.set("/ns/a", NSGone)
			for i := 0; i < 20; i++ { // long past its creation
				b.advance(interval)
				if rd := b.r.Reconcile(b.ctx); len(rd.Released) != 0 {
					t.Fatal("released a READY sandbox's lease")
				}
			}
			c.before(b)
			b.rt.remove("a") // the sandbox goes as the agent restarts
			b.restart()
			b.advance(interval)
			b.r.Reconcile(b.ctx)
			v := b.r.Verdict(key("a"))
			if c.want == grace+interval && (v.Sandbox != SandboxGone || v.Suspect == "") {
				t.Fatalf("first round after the restart: view %+v, want GONE and suspected", v)
			}
			if c.want != grace+interval && v.Sandbox != SandboxUnknown {
				t.Fatalf("first round after the restart: view %+v, want UNKNOWN (maybe in creation)", v)
			}
			took := interval + b.releasedAfter("a", interval, 20)
			if took != c.want {
				t.Fatalf("released %v after the sandbox went, want %v (grace %v, interval %v)", took, c.want, grace, interval)
			}
			t.Logf("%s: released %v after the sandbox went (grace %v, interval %v)", c.name, took, grace, interval)
		})
	}
}

// TestRestartSameBootInCreation: the boot clock reading makes a lease no older than
// its allocation: one allocated half a grace before a restart is still in creation
// after it, for GC and supersession, until a grace has passed since the allocation
// (not since the restart).
func TestRestartSameBootInCreation(t *testing.T) {
	b := newBootFixture(t)
	ls := b.add("a", "u1") // its sandbox is not known to the runtime yet
	b.ns.set("/ns/a", NSGone)
	b.advance(grace / 2)
	b.restart()
	if b.r.MayRelease(b.ctx, ls) || len(b.r.Supersedable(b.ctx, []ledger.Lease{ls})) != 0 {
		t.Fatal("a lease allocated half a grace ago is treated as out of creation")
	}
	b.advance(grace/2 - time.Millisecond)
	if b.r.MayRelease(b.ctx, ls) {
		t.Fatal("GC may release a lease 1ms before a grace has passed since its allocation")
	}
	b.advance(time.Millisecond)
	if !b.r.MayRelease(b.ctx, ls) {
		t.Fatal("GC may not release a gone sandbox's lease a grace after its allocation, across a restart on the same boot")
	}
}
