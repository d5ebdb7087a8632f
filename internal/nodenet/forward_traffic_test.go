package nodenet_test

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// staticNodes is a Node list that never changes.
type staticNodes []nodenet.Node

func (n staticNodes) Synced() bool             { return true }
func (n staticNodes) Nodes() []nodenet.Node    { return n }
func (n staticNodes) Changed() <-chan struct{} { return nil }

// TestTrafficThroughForwardDrop: three nodes, the middle one as Docker or ufw
// leave a host (iptables FORWARD policy DROP) and as a distribution leaves it
// (IPv4 forwarding off). With routes and masquerade alone its pods reach no pod
// of another node and nothing outside; one reconciliation of the node network's
// controller on each node (routes, masquerade, FORWARD accepts) and they do,
// both ways, with their own addresses between pods and the node's outside.
func TestTrafficThroughForwardDrop(t *testing.T) {
	debpkg.Need(t, debpkg.IPTables) // iptables-nft reads the rules back as iptables would
	if _, err := exec.LookPath("iptables-nft"); err != nil {
		t.Fatalf("Debian's iptables package is installed but iptables-nft is not on PATH: %v", err)
	}
	env := netnodes.New(t, 3)
	var nodes []nodenet.Node
	for i, h := range env.Nodes {
		nodes = append(nodes, nodenet.Node{Name: h.Name, Addrs: h.Addrs(),
			PodCIDRs: []netip.Prefix{netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)}})
	}
	a, b := env.Node(0), env.Node(1)
	podA := env.AddPod(a, "pa", ip("10.244.0.5"))
	podB := env.AddPod(b, "pb", ip("10.244.1.5"))
	// node1: forwarding off (what a distribution ships), FORWARD DROP
	if err := b.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("0"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", b.Netns, "iptables-nft", "-P", "FORWARD", "DROP").CombinedOutput(); err != nil {
		t.Fatalf("iptables-nft -P FORWARD DROP: %v\n%s", err, out)
	}
	netnodes.ServeSource(t, podA.NS, ":8080")
	netnodes.ServeSource(t, podB.NS, ":8080")
	netnodes.ServeSource(t, env.Outside.NS, ":8080")

	reach := func(from *netnodes.Pod, to netip.Addr) (netip.Addr, error) {
		return from.SourceSeen(netip.AddrPortFrom(to, 8080))
	}
	// routes and masquerade alone, as before the FORWARD accepts
	apply(t, env, nodes, nil, nil)
	if src, err := reach(podA, podB.Addrs[0]); err == nil {
		t.Fatalf("pod A reached pod B (as %s) through node1 with FORWARD DROP and forwarding off", src)
	}
	if src, err := reach(podB, netnodes.OutsideV4); err == nil {
		t.Fatalf("pod B reached the outside (as %s) through node1 with FORWARD DROP and forwarding off", src)
	}

	var node1 *controller.Controller
	for i, h := range env.Nodes {
		c, err := controller.New(controller.Config{Self: h.Name, Nodes: staticNodes(nodes), Resync: time.Hour,
			Routes: routes.New(h.Netlink), Masquerade: masq.New(h.Handle), Forward: masq.NewForward(h.Handle)})
		if err != nil {
			t.Fatal(err)
		}
		c.Reconcile(context.Background())
		if st := c.Status(); st.Err != "" {
			t.Fatalf("%s: %s", h.Name, st.Err)
		}
		if i == 1 {
			node1 = c
		}
	}
	fs := node1.Status().Forward
	if fs == nil || fs.IPv4.Policy != "DROP" || !fs.IPv4.Accepts || !fs.IPv4.SetForwarding {
		t.Errorf("node1's forwarding status %+v: want policy DROP, the accepts, forwarding turned on", fs)
	}
	for _, tc := range []struct {
		name    string
		from    *netnodes.Pod
		to      netip.Addr
		wantSrc netip.Addr
	}{
		{"pod to pod across nodes", podA, podB.Addrs[0], podA.Addrs[0]},
		{"and back", podB, podA.Addrs[0], podB.Addrs[0]},
		{"pod to outside through the DROP node", podB, netnodes.OutsideV4, b.Addr4},
	} {
		if src, err := reach(tc.from, tc.to); err != nil || src != tc.wantSrc {
			t.Errorf("%s: %s saw %v (%v), want %s", tc.name, tc.to, src, err, tc.wantSrc)
		}
	}
	for _, ck := range node1.Checks() {
		if ck.Level != "OK" && strings.Contains(ck.Text, "FORWARD") {
			t.Errorf("doctor on node1: %s %s", ck.Level, ck.Text)
		}
	}
}
