package cluster_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// addOn allocates one attachment on n (retrying "try again later" as a runtime
// does) and returns its address.
func addOn(t *testing.T, n *node, cid string) netip.Addr {
	t.Helper()
	r, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: cid, IfName: "eth0", Ranges: ranges(t),
		Pod: api.Pod{Namespace: "default", Name: cid, UID: "uid-" + cid}})
	if err != nil {
		t.Fatalf("ADD %s on %s: %v", cid, n.name, err)
	}
	return netip.MustParsePrefix(r.Lease.IPs[0]).Addr()
}

func delOn(t *testing.T, n *node, cid string) {
	t.Helper()
	if _, err := n.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: cid, IfName: "eth0"}); err != nil {
		t.Fatalf("DEL %s on %s: %v", cid, n.name, err)
	}
}

// waitDoctor waits until n's doctor has a line holding every one of parts, and
// returns it.
func waitDoctor(t *testing.T, n *node, parts ...string) string {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		lines, _ := doctorRun(t, n.Socket)
		for _, l := range lines {
			all := true
			for _, p := range parts {
				all = all && strings.Contains(l, p)
			}
			if all {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("doctor of %s never said %q:\n%s", n.name, parts, strings.Join(lines, "\n"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestReservationAddedWhilePodsRun: three real ipledgerd agents in cluster mode
// on embedded etcd, pods running on each. An IPReservation is added (the record
// reservations/lab, as `etcdctl put` writes it) covering a live pod's address and
// the whole block each node allocates from. Once each agent's doctor counts it,
// 20 new pods per node get no reserved address (each node claims a block outside
// it); the covered pod keeps its address (its ADD again answers it) and doctor
// names it, pod, address and reservation (as the other pods inside); after its DEL, 60 more pods on its node
// (past the reuse delay) never get the address back. The cluster audit balances.
func TestReservationAddedWhilePodsRun(t *testing.T) {
	sideBySideWhenShort(t)
	e := etcdenv.StartEmbedded(t)
	nodes := startNodes(t, 3, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(e.Endpoints(), ",")})
	var live []string // "node cid"
	first := map[string]netip.Addr{}
	for _, n := range nodes {
		for i := range 3 {
			cid := fmt.Sprintf("%s-old%d", n.name, i)
			a := addOn(t, n, cid)
			if i == 0 {
				first[n.name] = a
			}
			live = append(live, n.name+" "+cid)
		}
	}
	// the reservation: node-0's first pod's address, and the /26 block each node
	// allocates from now
	covered := first["node-0"]
	res := cluster.Reservation{Name: "lab", Reason: "lab routers", Prefixes: []netip.Prefix{netip.PrefixFrom(covered, 32)}}
	var reserved []netip.Prefix
	for _, n := range nodes {
		b, _ := first[n.name].Prefix(26)
		res.Prefixes = append(res.Prefixes, b)
		reserved = append(reserved, b)
	}
	ds, err := etcdds.New(etcdds.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	v, err := cluster.MarshalReservation(res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ds.Create(context.Background(), cluster.ReservationKey("lab"), v); err != nil {
		t.Fatal(err)
	}
	// every agent's copy has it: its doctor names each of its pods inside
	for _, n := range nodes {
		l := waitDoctor(t, n, "WARN", "3 live leases inside an IPReservation")
		want := fmt.Sprintf("pod default/%s-old0 (%s, IPReservation lab)", n.name, first[n.name])
		if !strings.Contains(l, want) || !strings.Contains(l, "keeps its address until its pod goes") {
			t.Errorf("doctor of %s: %q lacks %q", n.name, l, want)
		}
	}
	inReserved := func(a netip.Addr) bool {
		for _, p := range reserved {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	for _, n := range nodes {
		for i := range 20 {
			cid := fmt.Sprintf("%s-new%d", n.name, i)
			if a := addOn(t, n, cid); inReserved(a) {
				t.Fatalf("%s on %s got %s, inside IPReservation lab %v", cid, n.name, a, res.Prefixes)
			}
			live = append(live, n.name+" "+cid)
		}
	}
	// the covered pod keeps its address: ADD is idempotent, the lease is the same
	if a := addOn(t, nodes[0], "node-0-old0"); a != covered {
		t.Fatalf("the covered pod's ADD again answered %s, want its %s", a, covered)
	}
	delOn(t, nodes[0], "node-0-old0")
	if l := waitDoctor(t, nodes[0], "WARN", "2 live leases inside an IPReservation"); strings.Contains(l, "node-0-old0") {
		t.Errorf("doctor of node-0 still names the released lease: %q", l)
	}
	time.Sleep(300 * time.Millisecond) // past the 200ms reuse delay: the address would be free to reuse
	for i := range 60 {
		cid := fmt.Sprintf("node-0-after%d", i)
		if a := addOn(t, nodes[0], cid); inReserved(a) {
			t.Fatalf("%s got %s after the covered lease was released, inside IPReservation lab", cid, a)
		}
		live = append(live, "node-0 "+cid)
	}
	mustBalance(t, nodes)
	byName := map[string]*node{}
	for _, n := range nodes {
		byName[n.name] = n
	}
	for _, x := range live {
		nn, cid, _ := strings.Cut(x, " ")
		if cid != "node-0-old0" {
			delOn(t, byName[nn], cid)
		}
	}
}
