package controller_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// nodes stands for the Node watch; what it answers changes under the test.
type nodes struct {
	mu     sync.Mutex
	synced bool
	list   []nodenet.Node
	ch     chan struct{}
}

func (n *nodes) Synced() bool { n.mu.Lock(); defer n.mu.Unlock(); return n.synced }

func (n *nodes) Nodes() []nodenet.Node { n.mu.Lock(); defer n.mu.Unlock(); return n.list }

func (n *nodes) Changed() <-chan struct{} { return n.ch }

func (n *nodes) set(synced bool, list ...nodenet.Node) {
	n.mu.Lock()
	n.synced, n.list = synced, list
	n.mu.Unlock()
}

type masqCalls struct {
	mu    sync.Mutex
	calls [][]netip.Prefix
}

func (m *masqCalls) Sync(pods, _ []netip.Prefix) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls = append(m.calls, pods)
	return nil
}

type blocks struct {
	err  error
	list []nodenet.Block
}

func (b *blocks) Owners(context.Context) ([]nodenet.Block, error) { return b.list, b.err }

func node(name, addr, cidr string) nodenet.Node {
	n := nodenet.Node{Name: name, Addrs: []netip.Addr{netip.MustParseAddr(addr)}}
	if cidr != "" {
		n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix(cidr)}
	}
	return n
}

// ours lists the node's routes of ipledger's protocol, by destination.
func ours(t *testing.T, h *netnodes.Host) map[string]string {
	t.Helper()
	out := map[string]string{} // by destination
	for _, line := range strings.Split(h.Dump(), "\n") {
		if strings.Contains(line, "proto 201") {
			f := strings.Fields(line)
			if f[0] == "unreachable" || f[0] == "blackhole" {
				f = f[1:]
			}
			out[f[0]] = line
		}
	}
	return out
}

func checksText(cs []api.Check) string {
	var b strings.Builder
	for _, c := range cs {
		b.WriteString(c.Level + " " + c.Text + "\n")
	}
	return b.String()
}

// TestController runs the controller against a real node namespace: nothing is
// changed before the Nodes are listed; then routes to the other nodes' podCIDRs,
// masquerade of the cluster's pod ranges, Ready once; a deleted Node's route goes; an
// off-link next hop and a missing podCIDR become doctor FAILs; cluster mode keeps
// everything when the blocks cannot be read.
func TestController(t *testing.T) {
	env := netnodes.New(t, 1)
	h := env.Node(0)
	ns := &nodes{ch: make(chan struct{}, 1)}
	mq := &masqCalls{}
	var readies int
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Routes: routes.New(h.Netlink), Masquerade: mq,
		Resync: time.Hour, Ready: func(context.Context) error { readies++; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	c.Reconcile(ctx)
	if got := ours(t, h); len(got) != 0 || len(mq.calls) != 0 || readies != 0 {
		t.Fatalf("before the first list: routes %v, masquerade calls %d, readies %d; want nothing", got, len(mq.calls), readies)
	}
	if cs := checksText(c.Checks()); !strings.HasPrefix(cs, "WARN") {
		t.Fatalf("checks before the first list:\n%s", cs)
	}

	self := node("node0", "10.250.0.11", "10.244.0.0/24")
	n1, n2 := node("node1", "10.250.0.12", "10.244.1.0/24"), node("node2", "10.250.0.13", "10.244.2.0/24")
	ns.set(true, self, n1, n2)
	c.Reconcile(ctx)
	got := ours(t, h)
	if len(got) != 3 || !strings.Contains(got["10.244.1.0/24"], "via 10.250.0.12") || !strings.Contains(got["10.244.2.0/24"], "via 10.250.0.13") || !strings.HasPrefix(got["10.244.0.0/24"], "unreachable") {
		t.Fatalf("routes: %v", got)
	}
	if len(mq.calls) != 1 || len(mq.calls[0]) != 3 || readies != 1 {
		t.Fatalf("masquerade calls %v, readies %d", mq.calls, readies)
	}
	if cs := checksText(c.Checks()); !strings.HasPrefix(cs, "OK node network: 3 routes") {
		t.Fatalf("checks:\n%s", cs)
	}
	if k := c.Counts(); k.Routes != 3 || !k.Ready || k.Syncs != 1 {
		t.Fatalf("counts %+v", k)
	}

	// node2 deleted; node3's address is behind the default gateway (off-link)
	n3 := node("node3", "192.0.2.7", "10.244.3.0/24")
	ns.set(true, self, n1, n3)
	c.Reconcile(ctx)
	got = ours(t, h)
	if len(got) != 2 || got["10.244.1.0/24"] == "" || got["10.244.0.0/24"] == "" {
		t.Fatalf("routes after node2's deletion and an off-link node3: %v", got)
	}
	cs := checksText(c.Checks())
	if !strings.Contains(cs, "FAIL node network: node node3's pods (10.244.3.0/24) would be routed via 192.0.2.7, which is not on a directly connected network of node node0") {
		t.Fatalf("checks with an off-link next hop:\n%s", cs)
	}
	if readies != 1 {
		t.Fatalf("Ready ran %d times, want once", readies)
	}

	// this node's podCIDR gone
	ns.set(true, node("node0", "10.250.0.11", ""), n1)
	c.Reconcile(ctx)
	if cs := checksText(c.Checks()); !strings.Contains(cs, `FAIL node network: this node's Node "node0" has no spec.podCIDRs`) || !strings.Contains(cs, "--allocate-node-cidrs") {
		t.Fatalf("checks without a podCIDR:\n%s", cs)
	}
}

// TestControllerKeepsWhenBlocksUnknown: in cluster mode a failed read of the blocks
// changes nothing (an error is not "no blocks"); the routes follow the blocks' owners.
func TestControllerKeepsWhenBlocksUnknown(t *testing.T) {
	env := netnodes.New(t, 1)
	h := env.Node(0)
	ns := &nodes{ch: make(chan struct{}, 1)}
	ns.set(true, node("node0", "10.250.0.11", ""), node("node1", "10.250.0.12", ""))
	bl := &blocks{list: []nodenet.Block{{Prefix: netip.MustParsePrefix("10.70.0.0/26"), Owner: "node0"}, {Prefix: netip.MustParsePrefix("10.70.0.64/26"), Owner: "node1"}}}
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Blocks: bl, Routes: routes.New(h.Netlink), Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c.Reconcile(ctx)
	got := ours(t, h)
	if len(got) != 2 || !strings.Contains(got["10.70.0.64/26"], "via 10.250.0.12") || !strings.HasPrefix(got["10.70.0.0/26"], "unreachable 10.70.0.0/26") {
		t.Fatalf("cluster-mode routes: %v", got)
	}
	bl.err, bl.list = errors.New("datastore unreachable"), nil
	c.Reconcile(ctx)
	if again := ours(t, h); len(again) != 2 {
		t.Fatalf("routes after a failed read of the blocks: %v, want them kept", again)
	}
	if cs := checksText(c.Checks()); !strings.Contains(cs, "FAIL node network: reading the cluster's blocks: datastore unreachable: nothing changed") {
		t.Fatalf("checks:\n%s", cs)
	}
	// the block moved to this node
	bl.err, bl.list = nil, []nodenet.Block{{Prefix: netip.MustParsePrefix("10.70.0.0/26"), Owner: "node0"}, {Prefix: netip.MustParsePrefix("10.70.0.64/26"), Owner: "node0"}}
	c.Reconcile(ctx)
	got = ours(t, h)
	for dst, line := range got {
		if strings.Contains(line, "via") {
			t.Fatalf("route %s still via another node after the block moved here: %s", dst, line)
		}
	}
}

// TestReadyAgainWhenTheConditionIsGone: NetworkUnavailable is set false once the
// network is reconciled, and set again whenever the Node no longer shows it (the
// Node deleted and created again, another writer set it True).
func TestReadyAgainWhenTheConditionIsGone(t *testing.T) {
	ns := &nodes{ch: make(chan struct{}, 1)}
	ns.set(true, node("node-a", "10.250.0.11", "10.244.1.0/24"))
	var readies int
	available := false
	c, err := controller.New(controller.Config{Self: "node-a", Nodes: ns, Resync: time.Hour, Routes: &offLinkRoutes{},
		Ready:     func(context.Context) error { readies++; available = true; return nil },
		Available: func() bool { return available }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c.Reconcile(ctx)
	c.Reconcile(ctx)
	if readies != 1 || !c.Status().Ready {
		t.Fatalf("after two reconciliations: Ready ran %d times, status ready %v; want once, true", readies, c.Status().Ready)
	}
	available = false // the Node was created again
	c.Reconcile(ctx)
	if readies != 2 || !c.Status().Ready {
		t.Fatalf("after the condition went: Ready ran %d times, status ready %v; want twice, true", readies, c.Status().Ready)
	}
}

// offLinkRoutes stands for the route reconciler: every desired route via an address
// in off is reported off-link, and err is the sync's error.
type offLinkRoutes struct {
	off map[netip.Addr]bool
	err error
}

func (r *offLinkRoutes) Sync(desired []nodenet.Route) (routes.Report, error) {
	var rep routes.Report
	for _, d := range desired {
		if r.off[d.Via] {
			rep.OffLink = append(rep.OffLink, routes.OffLink{Dst: d.Dst, Via: d.Via})
		} else {
			rep.Unchanged++
		}
	}
	return rep, r.err
}

// recorder stands for the Node's event recorder.
type recorder struct{ notes []string }

func (r *recorder) Warning(reason, action, note string) {
	r.notes = append(r.notes, reason+" "+action+": "+note)
}

// TestOffLinkEvents: an off-link next hop is recorded as a Warning Event on this
// node's Node once per other node and address, naming both nodes, the address, the
// pod ranges and the fix; again only after the condition cleared and came back; a
// failed route sync (an incomplete report) clears nothing.
func TestOffLinkEvents(t *testing.T) {
	ns := &nodes{ch: make(chan struct{}, 1)}
	self := node("node0", "10.250.0.11", "10.244.0.0/24")
	n1 := nodenet.Node{Name: "node1", Addrs: []netip.Addr{netip.MustParseAddr("192.0.2.7")},
		PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.101.0/24")}}
	n2 := node("node2", "192.0.2.8", "10.244.2.0/24")
	ns.set(true, self, n1, n2)
	rt := &offLinkRoutes{off: map[netip.Addr]bool{netip.MustParseAddr("192.0.2.7"): true}}
	ev := &recorder{}
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Routes: rt, Resync: time.Hour, Events: ev})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c.Reconcile(ctx)
	c.Reconcile(ctx)
	want := "RouteNextHopOffLink RouteToNodePods: no route from node node0 to node node1's pods (10.244.1.0/24, 10.244.101.0/24): next hop 192.0.2.7 is not on a directly connected network of node0, and ipledger never routes pods through a gateway; fix: put the nodes on one L2 network, or run ipledgerd with --routes=false where the underlay routes pod addresses"
	if len(ev.notes) != 1 || ev.notes[0] != want {
		t.Fatalf("events after two reconciliations:\n%q\nwant one:\n%q", ev.notes, want)
	}
	if k := c.Counts(); k.OffLink != 2 {
		t.Fatalf("counts %+v, want 2 off-link routes", k)
	}

	rt.off[netip.MustParseAddr("192.0.2.8")] = true
	c.Reconcile(ctx)
	if len(ev.notes) != 2 || !strings.Contains(ev.notes[1], "node node2's pods (10.244.2.0/24): next hop 192.0.2.8") {
		t.Fatalf("events after node2 went off-link: %q", ev.notes)
	}

	// node1 on-link in a failed sync: not taken as cleared
	delete(rt.off, netip.MustParseAddr("192.0.2.7"))
	rt.err = errors.New("netlink: busy")
	c.Reconcile(ctx)
	rt.off[netip.MustParseAddr("192.0.2.7")] = true
	rt.err = nil
	c.Reconcile(ctx)
	if len(ev.notes) != 2 {
		t.Fatalf("events after a failed sync: %q, want no new one", ev.notes)
	}

	// node1 on-link, then off-link again: recorded again
	delete(rt.off, netip.MustParseAddr("192.0.2.7"))
	c.Reconcile(ctx)
	rt.off[netip.MustParseAddr("192.0.2.7")] = true
	c.Reconcile(ctx)
	if len(ev.notes) != 3 || ev.notes[2] != want {
		t.Fatalf("events after node1's condition cleared and came back: %q", ev.notes)
	}
}

// reportRoutes stands for the route reconciler: it answers rep for any sync.
type reportRoutes struct{ rep routes.Report }

func (r *reportRoutes) Sync([]nodenet.Route) (routes.Report, error) { return r.rep, nil }

// TestNetworkUnavailableOnlyWhenRoutesInPlace: the Node's NetworkUnavailable is set
// false only once this node's routes are in place: never with --routes=false (the
// underlay's route controller owns the condition; Routes nil), not while this
// node's Node has no podCIDR (node mode), not while a route of another owner holds
// a pod range, not while a next hop is off-link with no Event reporting it; each
// such reconciliation leaves no error, so only the condition waits.
func TestNetworkUnavailableOnlyWhenRoutesInPlace(t *testing.T) {
	self := node("node0", "10.250.0.11", "10.244.0.0/24")
	n1 := node("node1", "10.250.0.12", "10.244.1.0/24")
	conflict := routes.Report{Conflicts: []routes.Conflict{{Dst: netip.MustParsePrefix("10.244.1.0/24"), Protocol: 4, Dev: "cni0"}}}
	offLink := routes.Report{OffLink: []routes.OffLink{{Dst: netip.MustParsePrefix("10.244.1.0/24"), Via: netip.MustParseAddr("10.250.0.12")}}}
	for _, tc := range []struct {
		name     string
		routes   bool
		events   bool
		self     nodenet.Node
		rep      routes.Report
		ready    bool
		notReady string // what Status().NotInPlace says
	}{
		{name: "in place", routes: true, self: self, ready: true},
		{name: "--routes=false", self: self, notReady: "--routes=false"},
		{name: "no podCIDR", routes: true, self: node("node0", "10.250.0.11", ""), notReady: `Node "node0" has no spec.podCIDRs`},
		{name: "conflict", routes: true, self: self, rep: conflict, notReady: "1 pod ranges held by routes of another owner (first: 10.244.1.0/24"},
		{name: "off-link unreported", routes: true, self: self, rep: offLink, notReady: "next hop off-link, and no Event reports it"},
		{name: "off-link reported", routes: true, events: true, self: self, rep: offLink, ready: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := &nodes{ch: make(chan struct{}, 1)}
			ns.set(true, tc.self, n1)
			var readies int
			cfg := controller.Config{Self: "node0", Nodes: ns, Resync: time.Hour, Masquerade: &masqCalls{},
				Ready: func(context.Context) error { readies++; return nil }}
			rt := &reportRoutes{rep: tc.rep}
			if tc.routes {
				cfg.Routes = rt
			}
			if tc.events {
				cfg.Events = &recorder{}
			}
			c, err := controller.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			c.Reconcile(ctx)
			c.Reconcile(ctx)
			st := c.Status()
			if st.Err != "" || c.Waiting() != "" {
				t.Fatalf("reconciliation error %q, waiting %q; want none", st.Err, c.Waiting())
			}
			if (readies == 1) != tc.ready || readies > 1 || st.Ready != tc.ready || !strings.Contains(st.NotInPlace, tc.notReady) || (tc.notReady == "") != (st.NotInPlace == "") {
				t.Fatalf("Ready ran %d times, status ready %v, not in place %q; want ready %v, not in place %q", readies, st.Ready, st.NotInPlace, tc.ready, tc.notReady)
			}
			if tc.ready || !tc.routes {
				return
			}
			// the cause goes: the condition is set at the next reconciliation
			rt.rep = routes.Report{}
			ns.set(true, self, n1)
			c.Reconcile(ctx)
			if readies != 1 || !c.Status().Ready {
				t.Fatalf("once the routes are in place: Ready ran %d times, status ready %v; want once, true", readies, c.Status().Ready)
			}
		})
	}
}

type pools struct {
	err  error
	list []netip.Prefix
}

func (p *pools) PoolRanges(context.Context) ([]netip.Prefix, error) { return p.list, p.err }

// TestMasqueradePoolRanges: cluster mode's masquerade spares the pools' whole
// ranges, not only the blocks claimed so far, so a pod of a block another node
// claimed a moment ago keeps its address towards this node's pods; with the
// pools unknown, the rules stay as they are.
func TestMasqueradePoolRanges(t *testing.T) {
	ns := &nodes{ch: make(chan struct{}, 1)}
	ns.set(true, node("node0", "10.250.0.11", ""), node("node1", "10.250.0.12", ""))
	mq := &masqCalls{}
	bl := &blocks{list: []nodenet.Block{{Prefix: netip.MustParsePrefix("10.244.0.0/26"), Owner: "node0"}}}
	pl := &pools{list: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}}
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Blocks: bl, Pools: pl, Masquerade: mq, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.Reconcile(context.Background())
	want := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:244::/56")}
	if len(mq.calls) != 1 || !slices.Equal(mq.calls[0], want) {
		t.Fatalf("masquerade synced with %v, want once with the pools' ranges %v", mq.calls, want)
	}
	if st := c.Status(); st.Err != "" || !slices.Equal(st.PodCIDRs, want) {
		t.Errorf("status %+v", st)
	}

	pl.err = errors.New("etcd unreachable")
	c.Reconcile(context.Background())
	if len(mq.calls) != 1 {
		t.Errorf("pools unknown: masquerade synced again with %v; want the rules left as they are", mq.calls[1:])
	}
	if st := c.Status(); !strings.Contains(st.Err, "pools' ranges") {
		t.Errorf("pools unknown: status error %q, want it named", st.Err)
	}
}

// failingMasq fails its first Sync and signals each call.
type failingMasq struct {
	mu    sync.Mutex
	calls int
	ch    chan int
}

func (m *failingMasq) Sync(_, _ []netip.Prefix) error {
	m.mu.Lock()
	m.calls++
	n := m.calls
	m.mu.Unlock()
	m.ch <- n
	if n == 1 {
		return errors.New("nftables: transaction refused")
	}
	return nil
}

// TestRetryAfterMasqueradeFailure: a reconciliation that failed is tried again soon, not at
// the next resync (an hour here) or the next change.
func TestRetryAfterMasqueradeFailure(t *testing.T) {
	ns := &nodes{ch: make(chan struct{}, 1)}
	ns.set(true, node("node0", "10.250.0.11", "10.244.0.0/24"))
	mq := &failingMasq{ch: make(chan int, 4)}
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Masquerade: mq, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if n := <-mq.ch; n != 1 {
		t.Fatalf("call %d first", n)
	}
	select {
	case <-mq.ch:
	case <-time.After(time.Minute): // a bound on the test, far below the hour's resync
		t.Fatal("the failed masquerade sync was not retried before the resync")
	}
}

// TestRetryAfterRouteFailure: a failed reconciliation is tried again soon, not at the
// resync (an hour here), until one succeeds; then no more.
func TestRetryAfterRouteFailure(t *testing.T) {
	ns := &nodes{ch: make(chan struct{}, 1)}
	ns.set(true, node("node0", "10.250.0.11", "10.244.0.0/24"), node("node1", "10.250.0.12", "10.244.1.0/24"))
	r := &failingRoutes{fails: 3}
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Routes: r, Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx) })
	defer wg.Wait()
	defer cancel()
	waitFor(t, "a reconciliation that succeeds", func() bool { return c.Syncs() == 1 })
	r.mu.Lock()
	calls := r.calls
	r.mu.Unlock()
	if calls != 4 {
		t.Errorf("route syncs %d, want 4 (3 failed, then 1)", calls)
	}
	if k := c.Counts(); k.Errors != 3 {
		t.Errorf("errors counted %d, want 3", k.Errors)
	}
}

// TestForwardChecks: doctor names forwarding off and a FORWARD DROP without the
// accepts, each with its fix; nothing for a family without pod ranges.
func TestForwardChecks(t *testing.T) {
	pods := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}
	text := func(cs []api.Check) string { return checksText(cs) }
	if got := text(controller.ForwardChecks("n1", "IPv6", masq.FamilyStatus{}, pods)); got != "" {
		t.Errorf("no IPv6 range: %q", got)
	}
	got := text(controller.ForwardChecks("n1", "IPv4", masq.FamilyStatus{Ranges: true, Filter: true, Policy: "DROP", Err: "nftables: EPERM"}, pods))
	for _, want := range []string{"FAIL node network: IPv4 forwarding is off on node n1", "sysctl -w net.ipv4.ip_forward=1",
		"FAIL node network: the iptables FORWARD policy of node n1 is DROP", "10.244.0.0/16", "iptables -A FORWARD -s RANGE -j ACCEPT"} {
		if !strings.Contains(got, want) {
			t.Errorf("checks lack %q:\n%s", want, got)
		}
	}
	ok := masq.FamilyStatus{Ranges: true, Filter: true, Policy: "DROP", Accepts: true, Forwarding: true}
	if got := text(controller.ForwardChecks("n1", "IPv4", ok, pods)); got != "" {
		t.Errorf("accepts in place, forwarding on: %q", got)
	}
	ok.Legacy = true
	if got := text(controller.ForwardChecks("n1", "IPv4", ok, pods)); !strings.Contains(got, "WARN") || !strings.Contains(got, "iptables-legacy -S FORWARD") {
		t.Errorf("legacy filter table: %q", got)
	}
}

// failingRoutes fails its first fails syncs, then succeeds; calls counts them.
type failingRoutes struct {
	mu           sync.Mutex
	fails, calls int
}

func (r *failingRoutes) Sync([]nodenet.Route) (routes.Report, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.calls <= r.fails {
		return routes.Report{}, errors.New("netlink: no buffer space available")
	}
	return routes.Report{}, nil
}

// waitFor polls cond until it holds; failing after a minute is the bound of a
// test that hangs, not a measure of speed.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeletedRouteComesBack: a route of ours deleted by another program is back
// as soon as the kernel tells of the deletion, with the resync an hour away. The
// test waits for the kernel's events, not for a time.
func TestDeletedRouteComesBack(t *testing.T) {
	env := netnodes.New(t, 2)
	h := env.Node(0)
	ns := &nodes{ch: make(chan struct{}, 1)}
	ns.set(true, node("node0", "10.250.0.11", "10.244.0.0/24"), node("node1", "10.250.0.12", "10.244.1.0/24"))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// the test's own view of the node's route events
	events := make(chan netlink.RouteUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.RouteSubscribeWithOptions(events, done, netlink.RouteSubscribeOptions{Namespace: &h.Handle}); err != nil {
		t.Fatal(err)
	}
	dst := netip.MustParsePrefix("10.244.1.0/24")
	await := func(typ uint16) {
		t.Helper()
		timeout := time.After(time.Minute)
		for {
			select {
			case u := <-events:
				if p, ok := netipx(u.Dst); ok && p == dst && u.Protocol == routes.Protocol && u.Type == typ {
					return
				}
			case <-timeout:
				t.Fatalf("no route event %d for %s in a minute:\n%s", typ, dst, h.Dump())
			}
		}
	}

	rec := routes.NewOpener(func() (routes.Netlink, error) { return netlink.NewHandleAt(h.Handle) })
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Routes: rec, Resync: time.Hour,
		RoutesChanged: routes.Watch(ctx, h.Handle, slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { c.Run(ctx) })
	await(unix.RTM_NEWROUTE)
	for i := range 3 {
		if err := h.Netlink.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}, Protocol: routes.Protocol}); err != nil {
			t.Fatalf("deleting the route (%d): %v", i, err)
		}
		await(unix.RTM_DELROUTE)
		await(unix.RTM_NEWROUTE)
	}
	if got := ours(t, h); !strings.Contains(got["10.244.1.0/24"], "via 10.250.0.12") {
		t.Fatalf("routes: %v", got)
	}
}

func netipx(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), ok
}

// TestNodeModeRoutes (node mode, real namespaces): an address of this node's
// podCIDR that no pod holds is unreachable at once rather than sent out by the
// default route; a Node listing first an InternalIP of a network this node is
// not on is routed via the one that is; a foreign route inside another node's
// pod range (a leftover blackhole of another CNI) fails doctor, naming it.
func TestNodeModeRoutes(t *testing.T) {
	env := netnodes.New(t, 2)
	h := env.Node(0)
	ns := &nodes{ch: make(chan struct{}, 1)}
	n1 := node("node1", "192.0.2.12", "10.244.1.0/24")
	n1.Addrs = append(n1.Addrs, netip.MustParseAddr("10.250.0.12"))
	ns.set(true, node("node0", "10.250.0.11", "10.244.0.0/24"), n1)
	eth, err := h.Netlink.LinkByName(h.Link)
	if err != nil {
		t.Fatal(err)
	}
	leftover := &netlink.Route{Dst: &net.IPNet{IP: net.ParseIP("10.244.1.64").To4(), Mask: net.CIDRMask(26, 32)}, Type: unix.RTN_BLACKHOLE, Protocol: unix.RTPROT_BOOT}
	if err := h.Netlink.RouteAdd(leftover); err != nil {
		t.Fatal(err)
	}
	c, err := controller.New(controller.Config{Self: "node0", Nodes: ns, Routes: routes.New(h.Netlink), Resync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	c.Reconcile(context.Background())

	got := ours(t, h)
	if !strings.HasPrefix(got["10.244.0.0/24"], "unreachable 10.244.0.0/24") {
		t.Errorf("own podCIDR: %q, want an unreachable route\n%s", got["10.244.0.0/24"], h.Dump())
	}
	if _, err := h.Netlink.RouteGet(net.ParseIP("10.244.0.77")); !errors.Is(err, unix.EHOSTUNREACH) && !errors.Is(err, unix.ENETUNREACH) {
		t.Errorf("route to an unassigned address of the own podCIDR: %v, want unreachable", err)
	}
	if r := got["10.244.1.0/24"]; !strings.Contains(r, "via 10.250.0.12 dev eth0") {
		t.Errorf("route to node1's pods: %q, want via its on-link address 10.250.0.12\n%s", r, h.Dump())
	}
	if rs, err := h.Netlink.RouteGet(net.ParseIP("10.244.1.7")); err != nil || len(rs) != 1 || !rs[0].Gw.Equal(net.ParseIP("10.250.0.12")) || rs[0].LinkIndex != eth.Attrs().Index {
		t.Errorf("route to a pod of node1: %v, %v", rs, err)
	}
	cs := checksText(c.Checks())
	if !strings.Contains(cs, "FAIL node network: a route of another owner (blackhole 10.244.1.64/26 proto boot) lies inside 10.244.1.0/24") ||
		!strings.Contains(cs, "ip route del 10.244.1.64/26 proto boot") {
		t.Errorf("checks with a leftover blackhole in node1's range:\n%s", cs)
	}
	if k := c.Counts(); k.Routes != 2 || k.OffLink != 0 {
		t.Errorf("counts %+v, want 2 routes, none off-link", k)
	}
}
