// Package ledgertest is the shared test suite of the ledger: the same tests run
// against every ledger.Store implementation, and every ledger a test opens is audited
// in t.Cleanup, so the test that breaks an invariant is the one that fails.
package ledgertest

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Factory makes an empty store for a test; reopen closes it (when persistent) and
// opens the same state again.
type Factory func(t *testing.T) (st ledger.Store, reopen func() ledger.Store)

// Clock is the settable clock of the suite (Advance lets time pass, Step moves only
// the wall clock).
type Clock = clocktest.Clock

// NewClock starts at a fixed instant.
func NewClock() *Clock { return clocktest.New() }

// TestLogger sends log lines to t.Log.
func TestLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Audit checks l's books now and fails t with every problem found.
func Audit(t testing.TB, l *ledger.Ledger) ledger.AuditReport {
	t.Helper()
	rep, err := l.Audit()
	if err != nil {
		t.Fatalf("audit: %v", err)
	}
	if !rep.OK {
		t.Errorf("audit failed: problems %v, double assigned %v", rep.Problems, rep.DoubleAssigned)
	}
	return rep
}

// Open opens a ledger on st and audits it when the test ends.
func Open(t testing.TB, st ledger.Store, opts ledger.Options) *ledger.Ledger {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = TestLogger(t)
	}
	l, err := ledger.Open(st, opts)
	if err != nil {
		t.Fatalf("open ledger: %v", err)
	}
	t.Cleanup(func() { Audit(t, l) })
	return l
}

// Ranges parses a ranges JSON literal or fails the test.
func Ranges(t testing.TB, js string) []pool.RangeSet {
	t.Helper()
	sets, err := pool.ParseRangeSets([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return sets
}

// Key builds an attachment key on network "net" with ifname eth0.
func Key(cid string) ledger.Key { return ledger.Key{Network: "net", ContainerID: cid, IfName: "eth0"} }

// Run runs the ledger suite against the stores of newStore.
func Run(t *testing.T, newStore Factory) {
	tests := []struct {
		name string
		fn   func(t *testing.T, newStore Factory)
	}{
		{"AllocationFamilies", testAllocationFamilies},
		{"Exhaustion", testExhaustion},
		{"ReuseDelayAndOrder", testReuseDelayAndOrder},
		{"SameUIDReuse", testSameUIDReuse},
		{"Idempotent", testIdempotent},
		{"PoolConflict", testPoolConflict},
		{"HistoryAndReasons", testHistory},
		{"Persistence", testPersistence},
		{"Supersede", testSupersede},
		{"InvalidKeys", testInvalidKeys},
		{"ConditionalRelease", testConditionalRelease},
		{"ConcurrentGroupCommit", testConcurrent},
		{"AuditFindsDamage", testAuditFindsDamage},
		{"RollbackReleaseAndReuse", testRollbackReleaseAndReuse},
		{"BadFieldFailsAlone", testBadFieldFailsAlone},
		{"ReuseDelayIgnoresWallSteps", testReuseDelayIgnoresWallSteps},
		{"OverlappingNetworks", testOverlappingNetworks},
		{"ReplaceRanges", testReplaceRanges},
		{"ModeSwitch", testModeSwitch},
		{"SupersedeJudgedHolder", testSupersedeJudgedHolder},
		{"BlocksAllocate", testBlocksAllocate},
		{"BlocksGatewayAndRanges", testBlocksGatewayAndRanges},
		{"BlocksConfigConflicts", testBlocksConfigConflicts},
		{"BlocksRemove", testBlocksRemove},
		{"BlocksFencing", testBlocksFencing},
		{"BlocksLost", testBlocksLost},
		{"BlocksDualStack", testBlocksDualStack},
		{"BlocksFailedCommits", testBlocksFailedCommits},
		{"BlocksWithheld", testBlocksWithheld},
		{"BlocksWant", testBlocksWant},
		{"ClusterRangesLive", testClusterRangesLive},
		{"ReuseDelayAcrossRestart", testReuseDelayAcrossRestart},
		{"CreationBootReading", testCreationBootReading},
		{"LogLater", testLogLater},
		{"WhyKept", testWhyKept},
		{"WantedAddress", testWantedAddress},
		{"Exclude", testExclude},
		{"NamedPool", testNamedPool},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, newStore) })
	}
}

// testReuseDelayAcrossRestart: an address released before a restart on the same boot
// waits only what is left of its reuse delay (the release's CLOCK_BOOTTIME reading is
// stored with it), to the nanosecond and never less; after another boot, or when the
// boot clock cannot be read, it waits a whole delay from Open.
func testReuseDelayAcrossRestart(t *testing.T, newStore Factory) {
	const delay = time.Minute
	for _, c := range []struct {
		name    string
		restart func(b *clocktest.Boot)
		wait    time.Duration // after the restart
	}{
		{"same-boot", func(b *clocktest.Boot) { b.Advance(40 * time.Second) }, 20 * time.Second},
		{"same-boot-delay-over", func(b *clocktest.Boot) { b.Advance(2 * delay) }, 0},
		{"other-boot", func(b *clocktest.Boot) { b.Reboot("boot-2", 3*delay) }, delay},
		{"boot-unknown", func(b *clocktest.Boot) { b.Advance(40 * time.Second); b.Unknown() }, delay},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, reopen := newStore(t)
			boot := clocktest.NewBoot("boot-1", time.Hour)
			l, err := ledger.Open(st, ledger.Options{Clock: NewClock(), ReuseDelay: delay, Boot: boot})
			if err != nil {
				t.Fatal(err)
			}
			r := Ranges(t, `[[{"subnet":"10.9.0.0/24","rangeStart":"10.9.0.5","rangeEnd":"10.9.0.5"}]]`)
			if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("old"), Ranges: r}); err != nil {
				t.Fatal(err)
			}
			if _, _, err := l.Release(Key("old"), ledger.ReasonDEL, ""); err != nil {
				t.Fatal(err)
			}
			c.restart(boot)
			clk := NewClock() // a new process: its monotonic clock starts again
			l2 := Open(t, reopen(), ledger.Options{Clock: clk, ReuseDelay: delay, Boot: boot})
			if c.wait > 0 {
				clk.Advance(c.wait - time.Nanosecond)
				if ls, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("early"), Ranges: r}); !errors.Is(err, ledger.ErrPoolExhausted) {
					t.Fatalf("1ns before the delay is over: %v %v, want the pool exhausted", ls.IPs, err)
				}
				clk.Advance(time.Nanosecond)
			}
			ls, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("new"), Ranges: r})
			if err != nil || ls.IPs[0].Addr().String() != "10.9.0.5" {
				t.Fatalf("once the delay is over: %v %v, want 10.9.0.5", ls.IPs, err)
			}
		})
	}
}

// testCreationBootReading: an allocation stores the boot clock's reading with its
// lease in the same transaction, and it reads back after a reopen; a lease allocated
// without a boot clock (or an old record) reads with none, and an idempotent ADD
// keeps the first reading.
func testCreationBootReading(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	boot := clocktest.NewBoot("boot-1", time.Hour)
	l, err := ledger.Open(st, ledger.Options{Clock: NewClock(), Boot: boot})
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	a, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if a.BootID != "boot-1" || a.SinceBoot != time.Hour {
		t.Fatalf("allocated with reading %q %v, want boot-1 %v", a.BootID, a.SinceBoot, time.Hour)
	}
	boot.Advance(time.Minute)
	if again, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r}); err != nil || !existed || again.SinceBoot != time.Hour {
		t.Fatalf("idempotent ADD: %+v existed=%v %v, want the first reading kept", again, existed, err)
	}
	boot.Unknown()
	if b, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: r}); err != nil || b.BootID != "" || b.SinceBoot != 0 {
		t.Fatalf("allocated with the boot clock unknown: %+v %v, want no reading", b, err)
	}
	l2 := Open(t, reopen(), ledger.Options{Clock: NewClock()})
	if got, ok := l2.Lease(Key("a")); !ok || got.BootID != "boot-1" || got.SinceBoot != time.Hour {
		t.Fatalf("after reopen a = %+v (%v), want reading boot-1 %v", got, ok, time.Hour)
	}
	if got, ok := l2.Lease(Key("b")); !ok || got.BootID != "" || got.SinceBoot != 0 {
		t.Fatalf("after reopen b = %+v (%v), want no reading", got, ok)
	}
}

func testAllocationFamilies(t *testing.T, newStore Factory) {
	cases := []struct {
		name   string
		ranges string
		want   [][]string // per allocation, its addresses
	}{
		{"v4", `[[{"subnet":"10.1.0.0/29"}]]`, [][]string{{"10.1.0.2/29"}, {"10.1.0.3/29"}}},
		{"v6", `[[{"subnet":"fd00::/125"}]]`, [][]string{{"fd00::2/125"}, {"fd00::3/125"}}},
		{"dual", `[[{"subnet":"10.1.0.0/29"}],[{"subnet":"fd00::/64"}]]`, [][]string{{"10.1.0.2/29", "fd00::2/64"}, {"10.1.0.3/29", "fd00::3/64"}}},
		{"multi-range", `[[{"subnet":"10.1.0.0/30"},{"subnet":"10.2.0.0/30","gateway":"10.2.0.2"}]]`, [][]string{{"10.1.0.2/30"}, {"10.2.0.1/30"}}},
		{"start-end", `[[{"subnet":"10.1.0.0/24","rangeStart":"10.1.0.100","rangeEnd":"10.1.0.101"}]]`, [][]string{{"10.1.0.100/24"}, {"10.1.0.101/24"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := newStore(t)
			l := Open(t, st, ledger.Options{Clock: NewClock()})
			for i, want := range tc.want {
				ls, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprintf("c%d", i)), Ranges: Ranges(t, tc.ranges)})
				if err != nil || existed {
					t.Fatalf("allocate %d: %v existed=%v", i, err, existed)
				}
				if got := fmt.Sprint(ls.IPs); got != fmt.Sprint(want) {
					t.Fatalf("allocate %d: got %s, want %v", i, got, want)
				}
			}
		})
	}
}

func testExhaustion(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/29"}]]`) // .2-.6 usable (.1 gateway)
	for i := 0; i < 5; i++ {
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprintf("c%d", i)), Ranges: r}); err != nil {
			t.Fatal(err)
		}
	}
	_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("c5"), Ranges: r})
	if !errors.Is(err, ledger.ErrPoolExhausted) || !strings.Contains(err.Error(), `"net"`) || !strings.Contains(err.Error(), "all 5 usable addresses") {
		t.Fatalf("err = %v, want ErrPoolExhausted naming the network and the pool size", err)
	}
	if ps, _ := l.Pool("net"); ps.Available || ps.InUse != 5 {
		t.Fatalf("pool status %+v, want unavailable with 5 in use", ps)
	}
	if _, ok := l.Lease(Key("c5")); ok {
		t.Fatal("failed allocation left a lease")
	}
}

func testReuseDelayAndOrder(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk, ReuseDelay: time.Minute})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/29"}]]`)
	ips := map[string]string{}
	for _, c := range []string{"a", "b", "c", "d", "e"} {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(c), Ranges: r})
		if err != nil {
			t.Fatal(err)
		}
		ips[c] = ls.IPs[0].String()
	}
	// release in the order c, a, e: the least recently released (c) comes back first
	for _, c := range []string{"c", "a", "e"} {
		if _, ok, err := l.Release(Key(c), ledger.ReasonDEL, ""); err != nil || !ok {
			t.Fatalf("release %s: %v %v", c, ok, err)
		}
		clk.Advance(time.Second)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("x"), Ranges: r}); !errors.Is(err, ledger.ErrPoolExhausted) || !strings.Contains(err.Error(), "3 more released") {
		t.Fatalf("inside reuse delay: err = %v, want exhausted with 3 waiting", err)
	}
	clk.Advance(time.Minute - 3*time.Second) // c is now exactly at the delay, a and e are not
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("x"), Ranges: r})
	if err != nil || ls.IPs[0].String() != ips["c"] {
		t.Fatalf("got %v %v, want %s (released first)", ls.IPs, err, ips["c"])
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("y"), Ranges: r}); !errors.Is(err, ledger.ErrPoolExhausted) {
		t.Fatalf("a is still inside the reuse delay: err = %v", err)
	}
	clk.Advance(2 * time.Second)
	for _, want := range []string{"a", "e"} {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("n" + want), Ranges: r})
		if err != nil || ls.IPs[0].String() != ips[want] {
			t.Fatalf("got %v %v, want %s", ls.IPs, err, ips[want])
		}
	}
}

func testSameUIDReuse(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk, ReuseDelay: time.Hour})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}],[{"subnet":"fd00::/120"}]]`)
	pod := ledger.Pod{Namespace: "ns", Name: "web", UID: "uid-1"}
	first, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sandbox1"), Pod: pod, Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("other"), Pod: ledger.Pod{UID: "uid-2"}, Ranges: r}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Release(Key("sandbox1"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	// another pod does not get it inside the reuse delay, the same pod UID does
	stranger, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("stranger"), Pod: ledger.Pod{UID: "uid-3"}, Ranges: r})
	if err != nil || fmt.Sprint(stranger.IPs) == fmt.Sprint(first.IPs) {
		t.Fatalf("stranger got %v (%v); must not get %v inside the reuse delay", stranger.IPs, err, first.IPs)
	}
	again, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sandbox2"), Pod: pod, Ranges: r})
	if err != nil || fmt.Sprint(again.IPs) != fmt.Sprint(first.IPs) {
		t.Fatalf("same UID got %v (%v), want %v back", again.IPs, err, first.IPs)
	}
}

func testIdempotent(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	a, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key("c"), Ranges: r})
	if err != nil || existed {
		t.Fatal(err, existed)
	}
	for i := 0; i < 3; i++ {
		b, existed, err := l.Allocate(ledger.AllocateRequest{Key: Key("c"), Ranges: r})
		if err != nil || !existed || fmt.Sprint(a.IPs) != fmt.Sprint(b.IPs) {
			t.Fatalf("repeat %d: %v existed=%v err=%v, want %v", i, b.IPs, existed, err, a.IPs)
		}
	}
	other := Key("c")
	other.IfName = "net1"
	c, _, err := l.Allocate(ledger.AllocateRequest{Key: other, Ranges: r})
	if err != nil || fmt.Sprint(c.IPs) == fmt.Sprint(a.IPs) {
		t.Fatalf("second interface of the same container got %v (%v)", c.IPs, err)
	}
	if ps, _ := l.Pool("net"); ps.Allocs != 2 {
		t.Fatalf("allocations = %d, want 2", ps.Allocs)
	}
}

func testPoolConflict(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)}); err != nil {
		t.Fatal(err)
	}
	_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: Ranges(t, `[[{"subnet":"10.8.0.0/24"}]]`)})
	if !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), "10.9.0.0/24") {
		t.Fatalf("err = %v, want ErrPoolConflict naming the existing ranges", err)
	}
	if _, ok := l.Lease(Key("b")); ok {
		t.Fatal("conflicting config allocated")
	}
}

func testHistory(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk, HistoryKeep: 4})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/30"}]]`) // one usable address: .2
	reasons := []ledger.Reason{ledger.ReasonDEL, ledger.ReasonGC, ledger.ReasonReconcileGone, ledger.ReasonReconcileNotReady, ledger.ReasonSuperseded, ledger.ReasonManual}
	for i, reason := range reasons {
		k := Key(fmt.Sprintf("c%d", i))
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Pod: ledger.Pod{Namespace: "ns", Name: "p", UID: fmt.Sprint(i)}, Ranges: r}); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
		if _, ok, err := l.Release(k, reason, "test"); err != nil || !ok {
			t.Fatal(err, ok)
		}
		clk.Advance(time.Second)
	}
	h, err := l.History("net", netip.MustParseAddr("10.9.0.2"))
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 4 {
		t.Fatalf("history has %d entries, want the last 4", len(h))
	}
	for i, rel := range h {
		want := reasons[i+2]
		if rel.Reason != want || rel.Key != Key(fmt.Sprintf("c%d", i+2)) || rel.Pod.UID != fmt.Sprint(i+2) || !rel.To.After(rel.From) {
			t.Errorf("history[%d] = %+v, want reason %s by c%d", i, rel, want, i+2)
		}
	}
	if _, _, err := l.Release(Key("c0"), "because", ""); err == nil {
		t.Fatal("release with an invalid reason accepted")
	}
	if _, ok, err := l.Release(Key("never"), ledger.ReasonDEL, ""); err != nil || ok {
		t.Fatalf("release of unknown attachment: ok=%v err=%v, want a no-op", ok, err)
	}
}

func testPersistence(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	clk := NewClock()
	opts := ledger.Options{Clock: clk, ReuseDelay: time.Minute}
	l, err := ledger.Open(st, opts)
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.9.0.0/28"}],[{"subnet":"fd00::/64"}]]`)
	var kept []ledger.Lease
	for i := 0; i < 10; i++ {
		ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprintf("c%d", i)), Pod: ledger.Pod{UID: fmt.Sprint(i)}, NetNS: ledger.NetNS{Path: "/run/netns/x", Dev: 4, Ino: uint64(100 + i)}, Ranges: r})
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			if _, _, err := l.Release(ls.Key, ledger.ReasonDEL, ""); err != nil {
				t.Fatal(err)
			}
		} else {
			kept = append(kept, ls)
		}
	}
	l2 := Open(t, reopen(), opts)
	got := l2.Leases("")
	if fmt.Sprint(got) != fmt.Sprint(kept) {
		t.Fatalf("after reopen:\n got %v\nwant %v", got, kept)
	}
	// the free order and reuse delay survive: a new pod gets a never-used address
	ls, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("new"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if ls.IPs[0].String() != "10.9.0.12/28" {
		t.Fatalf("after reopen got %v, want the next never-used address 10.9.0.12", ls.IPs)
	}
	clk.Advance(time.Hour)
	for i := 0; i < 3; i++ { // .13 and .14 fresh, then c0's address (released first)
		ls, _, err = l2.Allocate(ledger.AllocateRequest{Key: Key(fmt.Sprintf("late%d", i)), Ranges: r})
		if err != nil {
			t.Fatal(err)
		}
	}
	if ls.IPs[0].String() != "10.9.0.2/28" {
		t.Fatalf("got %v, want 10.9.0.2 (least recently released)", ls.IPs)
	}
}

func testSupersede(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk, ReuseDelay: time.Hour})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	pod := ledger.Pod{Namespace: "ns", Name: "crashy", UID: "u1"}
	old, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb1"), Pod: pod, Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	nw, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb2"), Pod: pod, Ranges: r, Supersede: []ledger.Key{Key("sb1")}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(nw.IPs) != fmt.Sprint(old.IPs) {
		t.Fatalf("superseding sandbox got %v, want the pod's address %v", nw.IPs, old.IPs)
	}
	if got := l.LeasesOfPod("net", "u1"); len(got) != 1 || got[0].Key != Key("sb2") {
		t.Fatalf("leases of pod = %v, want only sb2", got)
	}
	h, _ := l.History("net", old.IPs[0].Addr())
	if len(h) != 1 || h[0].Reason != ledger.ReasonSuperseded {
		t.Fatalf("history = %+v, want one superseded release", h)
	}
}

func testInvalidKeys(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	for _, k := range []ledger.Key{
		{Network: "net", ContainerID: "", IfName: "eth0"},
		{Network: "net", ContainerID: strings.Repeat("a", ledger.MaxContainerIDLen+1), IfName: "eth0"},
		{Network: "net", ContainerID: "../../etc/passwd", IfName: "eth0"},
		{Network: "net", ContainerID: "abc\x00def", IfName: "eth0"},
		{Network: "net", ContainerID: "-abc", IfName: "eth0"},
		{Network: "net", ContainerID: "abc", IfName: ""},
		{Network: "net", ContainerID: "abc", IfName: "a/b"},
		{Network: "net", ContainerID: "abc", IfName: "0123456789abcdef"},
		{Network: "net", ContainerID: "abc", IfName: ".."},
		{Network: "", ContainerID: "abc", IfName: "eth0"},
	} {
		if _, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: r}); !errors.Is(err, ledger.ErrInvalidAttachment) {
			t.Errorf("key %q: err = %v, want ErrInvalidAttachment", k, err)
		}
	}
	if n := len(l.Leases("")); n != 0 {
		t.Fatalf("%d leases after invalid requests", n)
	}
}

// testConditionalRelease: ReleaseIfCreated releases only the holder it names and
// ReleaseCreatedBefore only a lease older than its time; either keeps a lease the
// attachment got since.
func testConditionalRelease(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("c"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := l.ReleaseIfCreated(ls.Key, ls.Created.Add(time.Nanosecond), ledger.ReasonGC, ""); ok || err != nil {
		t.Fatalf("ReleaseIfCreated of another holder: released %v, %v", ok, err)
	}
	if _, ok, err := l.ReleaseCreatedBefore(ls.Key, ls.Created, ledger.ReasonDEL, ""); ok || err != nil {
		t.Fatalf("ReleaseCreatedBefore its own creation time: released %v, %v", ok, err)
	}
	if _, ok, err := l.ReleaseCreatedBefore(ls.Key, ls.Created.Add(time.Nanosecond), ledger.ReasonDEL, ""); !ok || err != nil {
		t.Fatalf("ReleaseCreatedBefore a later time: released %v, %v", ok, err)
	}
	clk.Advance(time.Second)
	ls2, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("c"), Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := l.ReleaseIfCreated(ls2.Key, ls.Created, ledger.ReasonGC, ""); ok {
		t.Fatal("ReleaseIfCreated released the attachment's new lease for its old one")
	}
	if _, ok, err := l.ReleaseIfCreated(ls2.Key, ls2.Created, ledger.ReasonGC, ""); !ok || err != nil {
		t.Fatalf("ReleaseIfCreated of the named holder: released %v, %v", ok, err)
	}
}

// testConcurrent: many callers allocating and releasing at once, in a pool small
// enough that some allocations fail for exhaustion inside a shared group commit; the
// failures must not undo the others, no address may be held twice, and every
// acknowledged lease must be in the ledger.
func testConcurrent(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	l, err := ledger.Open(st, ledger.Options{Clock: NewClock(), Logger: TestLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.9.0.0/26"}],[{"subnet":"fd00:9::/64"}]]`) // 61 usable v4
	const workers, rounds = 16, 40
	var mu sync.Mutex
	live := map[ledger.Key]string{}
	var wg sync.WaitGroup
	var exhausted atomic.Int64
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for i := 0; i < rounds; i++ {
				k := Key(fmt.Sprintf("w%d-%d", w, i))
				ls, _, err := l.Allocate(ledger.AllocateRequest{Key: k, Ranges: r})
				if errors.Is(err, ledger.ErrPoolExhausted) {
					exhausted.Add(1)
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				live[k] = fmt.Sprint(ls.IPs)
				mu.Unlock()
				if i%3 != 0 {
					if _, ok, err := l.Release(k, ledger.ReasonDEL, ""); err != nil || !ok {
						t.Errorf("release %s: %v %v", k, ok, err)
						return
					}
					mu.Lock()
					delete(live, k)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d live, %d allocations refused as exhausted", len(live), exhausted.Load())
	seen := map[string]ledger.Key{}
	for k, ips := range live {
		ls, ok := l.Lease(k)
		if !ok || fmt.Sprint(ls.IPs) != ips {
			t.Fatalf("acknowledged lease %s=%s: got %v %v", k, ips, ls.IPs, ok)
		}
		if other, dup := seen[ips]; dup {
			t.Fatalf("%s held by %s and %s", ips, other, k)
		}
		seen[ips] = k
	}
	if n := len(l.Leases("")); n != len(live) {
		t.Fatalf("%d leases in the ledger, %d acknowledged", n, len(live))
	}
	Audit(t, l)
	l2 := Open(t, reopen(), ledger.Options{})
	if n := len(l2.Leases("")); n != len(live) {
		t.Fatalf("after reopen %d leases, %d acknowledged", n, len(live))
	}
}

// testAuditFindsDamage: the audit reports a store damaged behind the ledger's back:
// an address whose free record was lost (neither held nor free: leaked for good), and
// an address written into a second lease (held twice).
func testAuditFindsDamage(t *testing.T, newStore Factory) {
	for _, c := range []struct {
		name   string
		damage func(tx ledger.Tx, a, b ledger.Lease, freed netip.Addr) error
		want   string
	}{
		{"free record lost", func(tx ledger.Tx, _, _ ledger.Lease, freed netip.Addr) error {
			return tx.DeleteFree("net", freed)
		}, "neither (leaked)"},
		{"held twice", func(tx ledger.Tx, a, b ledger.Lease, _ netip.Addr) error {
			b.IPs = a.IPs
			return tx.PutLease(b)
		}, "double"},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, reopen := newStore(t)
			l, err := ledger.Open(st, ledger.Options{Logger: TestLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			r := Ranges(t, `[[{"subnet":"10.9.0.0/29"}]]`)
			var ls []ledger.Lease
			for _, cid := range []string{"a", "b", "c"} {
				x, _, err := l.Allocate(ledger.AllocateRequest{Key: Key(cid), Ranges: r})
				if err != nil {
					t.Fatal(err)
				}
				ls = append(ls, x)
			}
			if _, _, err := l.Release(Key("c"), ledger.ReasonDEL, ""); err != nil {
				t.Fatal(err)
			}
			if rep, err := l.Audit(); err != nil || !rep.OK {
				t.Fatalf("audit before the damage: %+v %v", rep, err)
			}
			st2 := reopen()
			t.Cleanup(func() { st2.Close() })
			if err := st2.Update(func(tx ledger.Tx) error { return c.damage(tx, ls[0], ls[1], ls[2].IPs[0].Addr()) }); err != nil {
				t.Fatal(err)
			}
			l2, err := ledger.Open(st2, ledger.Options{Logger: TestLogger(t)})
			if err != nil {
				t.Logf("open refused the damaged store: %v", err)
				return
			}
			rep, err := l2.Audit()
			if err != nil {
				t.Fatal(err)
			}
			got := fmt.Sprint(rep.Problems)
			if len(rep.DoubleAssigned) > 0 {
				got += " double"
			}
			if rep.OK || !strings.Contains(got, c.want) {
				t.Fatalf("audit of a damaged store: ok=%v problems %v double %v; want %q", rep.OK, rep.Problems, rep.DoubleAssigned, c.want)
			}
			t.Logf("audit found: %s", got)
		})
	}
}

// testWhyKept: the reason an allocation gives is on the lease, across a reopen, and
// a reason past its limit fails the allocation alone, naming the field.
func testWhyKept(t *testing.T, newStore Factory) {
	st, reopen := newStore(t)
	l, err := ledger.Open(st, ledger.Options{Clock: NewClock()})
	if err != nil {
		t.Fatal(err)
	}
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	const why = "sticky for web-0 (StatefulSet default/web)"
	a, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Ranges: r, Why: why})
	if err != nil || a.Why != why {
		t.Fatalf("allocated %+v %v, want why %q", a, err, why)
	}
	long := strings.Repeat("x", ledger.MaxDetailLen+1)
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Ranges: r, Why: long}); err == nil || !strings.Contains(err.Error(), "why") {
		t.Fatalf("allocated with a %d-byte why: %v, want an error naming why", len(long), err)
	}
	l2 := Open(t, reopen(), ledger.Options{Clock: NewClock()})
	if got, ok := l2.Lease(Key("a")); !ok || got.Why != why {
		t.Fatalf("after reopen a = %+v (%v), want why %q", got, ok, why)
	}
}
