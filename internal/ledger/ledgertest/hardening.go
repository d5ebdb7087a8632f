package ledgertest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/store/faultstore"
)

// testBadFieldFailsAlone: every field of a request is bounded before the request
// joins a group commit. A request over a limit fails alone with an error naming the
// field and the limit; requests committed beside it succeed; a request with every
// field at its limit fits the store.
func testBadFieldFailsAlone(t *testing.T, newStore Factory) {
	inner, _ := newStore(t)
	st := faultstore.New(inner, nil)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}],[{"subnet":"fd00::/120"}]]`)
	pod := ledger.Pod{Namespace: "ns", Name: "web", UID: "u1"}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb1"), Pod: pod, Ranges: r}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("victim"), Ranges: r}); err != nil {
		t.Fatal(err)
	}
	// 1. a 70 KB release reason in one group commit with a supersede ADD and a DEL
	entered, release := st.Hold()
	lead := make(chan error)
	go func() { _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("lead"), Ranges: r}); lead <- err }()
	<-entered
	huge, add, del := make(chan error), make(chan error), make(chan error)
	go func() {
		_, _, err := l.Release(Key("victim"), ledger.ReasonManual, strings.Repeat("x", 70<<10))
		huge <- err
	}()
	go func() {
		_, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("sb2"), Pod: pod, Ranges: r, Supersede: []ledger.Key{Key("sb1")}})
		add <- err
	}()
	go func() { _, _, err := l.Release(Key("lead-neighbour"), ledger.ReasonDEL, ""); del <- err }()
	time.Sleep(100 * time.Millisecond) // let them queue behind the held commit
	release()
	if err := <-lead; err != nil {
		t.Fatal(err)
	}
	if err := <-huge; !errors.Is(err, ledger.ErrInvalidAttachment) || !strings.Contains(err.Error(), "release detail") || !strings.Contains(err.Error(), "4096") {
		t.Fatalf("70 KB reason: err = %v, want ErrInvalidAttachment naming the release detail and its limit", err)
	}
	if err := <-add; err != nil {
		t.Fatalf("supersede ADD beside the bad release: %v", err)
	}
	if err := <-del; err != nil {
		t.Fatalf("DEL beside the bad release: %v", err)
	}
	if _, ok := l.Lease(Key("victim")); !ok {
		t.Fatal("the refused release released")
	}
	if got := l.LeasesOfPod("net", "u1"); len(got) != 1 || got[0].Key != Key("sb2") {
		t.Fatalf("leases of u1 = %v, want sb2 only", got)
	}

	// 2. each field over its limit fails alone, naming the field and the limit
	long := func(n int) string { return strings.Repeat("a", n) }
	cases := []struct {
		field string
		req   ledger.AllocateRequest
	}{
		{"K8S_POD_NAMESPACE", ledger.AllocateRequest{Pod: ledger.Pod{Namespace: long(ledger.MaxPodNamespaceLen + 1)}}},
		{"K8S_POD_NAME", ledger.AllocateRequest{Pod: ledger.Pod{Name: long(ledger.MaxPodNameLen + 1)}}},
		{"K8S_POD_UID", ledger.AllocateRequest{Pod: ledger.Pod{UID: long(ledger.MaxPodUIDLen + 1)}}},
		{"K8S_POD_INFRA_CONTAINER_ID", ledger.AllocateRequest{Pod: ledger.Pod{InfraContainerID: long(ledger.MaxContainerIDLen + 1)}}},
		{"CNI_NETNS", ledger.AllocateRequest{NetNS: ledger.NetNS{Path: "/" + long(ledger.MaxNetNSPathLen)}}},
		{"K8S_POD_NAME", ledger.AllocateRequest{Pod: ledger.Pod{Name: "a\x00b"}}},
		{"supersede", ledger.AllocateRequest{Supersede: make([]ledger.Key, ledger.MaxSupersede+1)}},
	}
	for i, c := range cases {
		c.req.Key, c.req.Ranges = Key(fmt.Sprintf("bad%d", i)), r
		_, _, err := l.Allocate(c.req)
		if !errors.Is(err, ledger.ErrInvalidAttachment) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s over its limit: err = %v, want ErrInvalidAttachment naming %s", c.field, err, c.field)
		}
	}
	// 3. every field at its limit fits the store's record limit
	max := ledger.AllocateRequest{
		Key:    ledger.Key{Network: "net", ContainerID: long(ledger.MaxContainerIDLen), IfName: long(ledger.MaxIfNameLen)},
		Pod:    ledger.Pod{Namespace: long(ledger.MaxPodNamespaceLen), Name: long(ledger.MaxPodNameLen), UID: long(ledger.MaxPodUIDLen), InfraContainerID: long(ledger.MaxContainerIDLen)},
		NetNS:  ledger.NetNS{Path: "/" + long(ledger.MaxNetNSPathLen-1)},
		Ranges: r,
	}
	if _, _, err := l.Allocate(max); err != nil {
		t.Fatalf("ADD with every field at its limit: %v", err)
	}
	if _, ok, err := l.Release(max.Key, ledger.ReasonManual, long(ledger.MaxDetailLen)); err != nil || !ok {
		t.Fatalf("release with a detail at its limit: %v %v", ok, err)
	}
}

// testReuseDelayIgnoresWallSteps: the reuse delay is elapsed time. The wall clock
// stepped an hour forward or back between a release and the next allocation neither
// hands the address to another pod before the delay nor holds it back after it. After
// a reopen the address waits one more delay at most.
func testReuseDelayIgnoresWallSteps(t *testing.T, newStore Factory) {
	const delay = 10 * time.Minute
	for _, step := range []time.Duration{time.Hour, -time.Hour} {
		t.Run(fmt.Sprint(step), func(t *testing.T) {
			st, reopen := newStore(t)
			clk := NewClock()
			opts := ledger.Options{Clock: clk, ReuseDelay: delay}
			l, err := ledger.Open(st, opts)
			if err != nil {
				t.Fatal(err)
			}
			r := Ranges(t, `[[{"subnet":"10.9.0.0/30"}]]`) // one usable address
			a, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("a"), Pod: ledger.Pod{UID: "u1"}, Ranges: r})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := l.Release(Key("a"), ledger.ReasonDEL, ""); err != nil {
				t.Fatal(err)
			}
			clk.Step(step)
			clk.Advance(delay - time.Second)
			if ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Pod: ledger.Pod{UID: "u2"}, Ranges: r}); !errors.Is(err, ledger.ErrPoolExhausted) {
				t.Fatalf("wall clock stepped %v, %v after the release: got %v (%v), want exhausted (inside the reuse delay)", step, delay-time.Second, ls.IPs, err)
			}
			clk.Advance(time.Second)
			ls, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("b"), Pod: ledger.Pod{UID: "u2"}, Ranges: r})
			if err != nil || ls.IPs[0] != a.IPs[0] {
				t.Fatalf("wall clock stepped %v, reuse delay passed: got %v (%v), want %v", step, ls.IPs, err, a.IPs)
			}
			// released before a restart: waits a full delay after the reopen
			if _, _, err := l.Release(Key("b"), ledger.ReasonDEL, ""); err != nil {
				t.Fatal(err)
			}
			clk.Advance(delay / 2)
			clk.Step(step)
			l2 := Open(t, reopen(), opts)
			clk.Advance(delay - time.Second)
			if _, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("c"), Pod: ledger.Pod{UID: "u3"}, Ranges: r}); !errors.Is(err, ledger.ErrPoolExhausted) {
				t.Fatalf("after reopen, inside a delay counted from the reopen: err = %v, want exhausted", err)
			}
			clk.Advance(time.Second)
			if _, _, err := l2.Allocate(ledger.AllocateRequest{Key: Key("c"), Pod: ledger.Pod{UID: "u3"}, Ranges: r}); err != nil {
				t.Fatalf("after reopen and a full delay: %v", err)
			}
		})
	}
}

// testOverlappingNetworks: a second network whose ranges share an address with
// another network's pool is refused, naming both networks and the overlap; disjoint
// networks are fine.
func testOverlappingNetworks(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	l := Open(t, st, ledger.Options{Clock: NewClock()})
	alloc := func(network, ranges string) error {
		_, _, err := l.Allocate(ledger.AllocateRequest{Key: ledger.Key{Network: network, ContainerID: "c", IfName: "eth0"}, Ranges: Ranges(t, ranges)})
		return err
	}
	if err := alloc("blue", `[[{"subnet":"10.9.0.0/24","rangeStart":"10.9.0.10","rangeEnd":"10.9.0.100"}],[{"subnet":"fd00:9::/64"}]]`); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ network, ranges, want string }{
		{"green", `[[{"subnet":"10.9.0.0/25"}]]`, `"green": range 10.9.0.1-10.9.0.126 overlaps range 10.9.0.10-10.9.0.100 of network "blue"`},
		{"green", `[[{"subnet":"10.8.0.0/24"}],[{"subnet":"fd00:9::/120"}]]`, `network "blue"`},
		{"green", `[[{"subnet":"10.9.0.0/24","rangeStart":"10.9.0.100","rangeEnd":"10.9.0.120"}]]`, `10.9.0.100-10.9.0.120 overlaps`},
	} {
		err := alloc(c.network, c.ranges)
		if !errors.Is(err, ledger.ErrPoolConflict) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ranges %s: err = %v, want ErrPoolConflict containing %q", c.ranges, err, c.want)
		}
	}
	if err := alloc("green", `[[{"subnet":"10.9.0.0/24","rangeStart":"10.9.0.101","rangeEnd":"10.9.0.200"}],[{"subnet":"fd00:8::/64"}]]`); err != nil {
		t.Fatalf("disjoint network: %v", err)
	}
	if n := len(l.Pools()); n != 2 {
		t.Fatalf("%d pools, want 2", n)
	}
}

// testSupersedeJudgedHolder: SupersedeHolders releases the old lease only when its
// attachment still holds the lease that was judged; one released and allocated again
// since (a new holder under the same key) is kept.
func testSupersedeJudgedHolder(t *testing.T, newStore Factory) {
	st, _ := newStore(t)
	clk := NewClock()
	l := Open(t, st, ledger.Options{Clock: clk})
	r := Ranges(t, `[[{"subnet":"10.9.0.0/24"}]]`)
	pod := ledger.Pod{Namespace: "ns", Name: "p", UID: "u1"}
	judged, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("old"), Pod: pod, Ranges: r})
	if err != nil {
		t.Fatal(err)
	}
	// between the judgement and the superseding ADD the old attachment is released
	// and allocated again: another holder
	if _, _, err := l.Release(Key("old"), ledger.ReasonDEL, ""); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("old"), Pod: pod, Ranges: r}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("new"), Pod: pod, Ranges: r, SupersedeHolders: []ledger.Holder{ledger.HolderOf(judged)}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Lease(Key("old")); !ok {
		t.Fatal("supersession released a holder that was never judged")
	}
	now, _ := l.Lease(Key("old"))
	if _, _, err := l.Allocate(ledger.AllocateRequest{Key: Key("newer"), Pod: pod, Ranges: r, SupersedeHolders: []ledger.Holder{ledger.HolderOf(now)}}); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Lease(Key("old")); ok {
		t.Fatal("the judged holder was not superseded")
	}
}
