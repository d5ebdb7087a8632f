package nodenet_test

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

func ip(s string) netip.Addr    { return netip.MustParseAddr(s) }
func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// sourceSeen connects from ns to addr's ServeSource on port 8080 and returns the
// source address the listener there saw.
func sourceSeen(t *testing.T, from *netnodes.NS, addr netip.Addr) string {
	t.Helper()
	src, err := from.SourceSeen(netip.AddrPortFrom(addr, 8080))
	if err != nil {
		t.Fatal(err)
	}
	return src.String()
}

// apply installs, on every node, the routes Desired plans for it and the
// masquerade of the cluster's pod ranges.
func apply(t *testing.T, env *netnodes.Env, nodes []nodenet.Node, blocks []nodenet.Block, nonMasq []netip.Prefix) {
	t.Helper()
	for i, h := range env.Nodes {
		plan := nodenet.Desired(nodes[i].Name, nodes, blocks)
		if len(plan.Problems) > 0 {
			t.Fatalf("%s: problems %v", h.Name, plan.Problems)
		}
		rep, err := routes.New(h.Netlink).Sync(plan.Routes)
		if err != nil {
			t.Fatalf("%s: routes: %v", h.Name, err)
		}
		if len(rep.Conflicts) > 0 || len(rep.OffLink) > 0 || rep.Installed+rep.Unchanged != len(plan.Routes) {
			t.Fatalf("%s: routes %+v for plan %v", h.Name, rep, plan.Routes)
		}
		if err := masq.New(h.Handle).Sync(nodenet.ClusterCIDRs(nodes, blocks), nonMasq); err != nil {
			t.Fatalf("%s: masquerade: %v", h.Name, err)
		}
	}
}

// TestTraffic: three nodes on one L2 network, pods behind node0 and node1,
// routes and masquerade from the plans; pods reach each other with their own
// addresses and the outside with their node's.
func TestTraffic(t *testing.T) {
	env := netnodes.New(t, 3)
	var nodes []nodenet.Node
	for i, h := range env.Nodes {
		nodes = append(nodes, nodenet.Node{
			Name:     h.Name,
			Addrs:    h.Addrs(),
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24), netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 2, 0x44, 7: byte(i)}), 64)},
		})
	}
	a, b := env.Node(0), env.Node(1)
	podA := env.AddPod(a, "pa", ip("10.244.0.5"), ip("fd00:244::5"))
	podB := env.AddPod(b, "pb", ip("10.244.1.5"), ip("fd00:244:0:1::5"))
	defer func() {
		if t.Failed() {
			for _, ns := range []*netnodes.NS{a.NS, b.NS, podA.NS} {
				t.Log(ns.Dump())
			}
		}
	}()
	netnodes.ServeSource(t, podA.NS, ":8080")
	netnodes.ServeSource(t, podB.NS, ":8080")
	netnodes.ServeSource(t, env.Outside.NS, ":8080")
	netnodes.ServeSource(t, b.NS, ":8080")

	// Before any route: the pods cannot reach each other.
	if c, err := podA.Dial("tcp", "10.244.1.5:8080", 300*time.Millisecond); err == nil {
		c.Close()
		t.Fatal("pod A reached pod B with no route between the nodes")
	}

	apply(t, env, nodes, nil, nil)
	for _, tc := range []struct {
		name    string
		from    *netnodes.NS
		to      netip.Addr
		wantSrc netip.Addr
	}{
		{"pod to pod keeps the pod's address", podA.NS, ip("10.244.1.5"), ip("10.244.0.5")},
		{"pod to pod keeps the pod's address, IPv6", podA.NS, ip("fd00:244:0:1::5"), ip("fd00:244::5")},
		{"and back", podB.NS, ip("10.244.0.5"), ip("10.244.1.5")},
		{"pod to outside leaves as its node", podA.NS, netnodes.OutsideV4, a.Addr4},
		{"pod to outside leaves as its node, IPv6", podA.NS, netnodes.OutsideV6, a.Addr6},
	} {
		if got := sourceSeen(t, tc.from, tc.to); got != tc.wantSrc.String() {
			t.Errorf("%s: %s saw %s, want %s", tc.name, tc.to, got, tc.wantSrc)
		}
	}
	// Only the two connections to the outside were masqueraded (a NAT rule
	// sees the first packet of each connection).
	st, err := masq.New(a.Handle).Current()
	if err != nil {
		t.Fatal(err)
	}
	if st.Packets != 2 {
		t.Errorf("node0 masqueraded %d connections, want 2", st.Packets)
	}

	// A pod reaching another node's own address leaves as its node too,
	// unless the node network is among the non-masquerade CIDRs.
	if got := sourceSeen(t, podA.NS, b.Addr4); got != a.Addr4.String() {
		t.Errorf("pod A -> node1 seen from %s, want node0's %s", got, a.Addr4)
	}
	apply(t, env, nodes, nil, []netip.Prefix{netnodes.L2V4})
	if got := sourceSeen(t, podA.NS, b.Addr4); got != "10.244.0.5" {
		t.Errorf("pod A -> node1 with the L2 network non-masquerade seen from %s, want the pod's 10.244.0.5", got)
	}

	// Cluster mode: blocks instead of podCIDRs. An unassigned address of
	// node1's block is unreachable at once (node1's unreachable route), not
	// sent on to the default route.
	blocks := []nodenet.Block{
		{Prefix: pfx("10.244.0.0/26"), Owner: a.Name},
		{Prefix: pfx("10.244.1.0/26"), Owner: b.Name},
		{Prefix: pfx("10.244.2.0/26")},
		{Prefix: pfx("fd00:244::/122"), Owner: a.Name},
		{Prefix: pfx("fd00:244:0:1::/122"), Owner: b.Name},
	}
	apply(t, env, nodes, blocks, nil)
	if got := sourceSeen(t, podA.NS, ip("fd00:244:0:1::5")); got != "fd00:244::5" {
		t.Errorf("cluster mode: pod B saw %s, want pod A's fd00:244::5", got)
	}
	if got := sourceSeen(t, podA.NS, netnodes.OutsideV4); got != a.Addr4.String() {
		t.Errorf("cluster mode: outside saw %s, want node0's %s", got, a.Addr4)
	}
	start := time.Now()
	c, err := podA.Dial("tcp", "10.244.1.6:8080", 3*time.Second)
	if err == nil {
		c.Close()
		t.Fatal("reached an unassigned address")
	}
	if !errors.Is(err, syscall.EHOSTUNREACH) {
		t.Errorf("unassigned address of node1's block: %v, want host unreachable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("unreachable took %v", d)
	}
}
