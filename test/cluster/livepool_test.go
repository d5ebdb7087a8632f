package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// The live pools' network: its conflist names range A only. Each range is 29
// addresses (its .0, gateway .1 and broadcast left out) in four /29 blocks, so
// that three agents fill it in a few dozen ADDs.
const (
	liveNet   = "live"
	liveA     = "10.78.0.0/27"
	liveB     = "10.78.0.32/27"
	blueA     = "10.79.0.0/27"
	blueB     = "10.79.0.32/27"
	liveBlock = 29
)

// livePool is one pool the test changes: its record, how an ADD lands in it, and
// how the operator drains a range of it.
type livePool struct {
	name   string // pool record name (the network's, or the IPPool's)
	ns     string // the pods' namespace ("" for none)
	a, b   string // the range it starts with and the one added
	named  bool   // an IPPool (drain: remove the range) or the default pool (move it to drained)
	prefix string // container IDs
}

// liveConf is the conflist's ranges: A.
var liveConf, _ = pool.ParseRangeSets(fmt.Appendf(nil, `[[{"subnet":%q}]]`, liveA))

// liveAdd sends one ADD of cid to n in p's pool (the conflist's ranges are A of
// the default pool, whatever the record says): the address, or the agent's error.
func liveAdd(n *node, p livePool, cid string) (netip.Addr, error) {
	req := api.Request{Op: api.OpAdd, Network: liveNet, ContainerID: cid, IfName: "eth0", BlockSize: liveBlock,
		Ranges: liveConf}
	if p.ns != "" {
		req.Pod = api.Pod{Namespace: p.ns, Name: cid, UID: "uid-" + cid}
	}
	r, err := call(n, req)
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.MustParsePrefix(r.Lease.IPs[0]).Addr(), nil
}

func liveDel(t *testing.T, n *node, cid string) {
	t.Helper()
	if _, err := call(n, api.Request{Op: api.OpDel, Network: liveNet, ContainerID: cid, IfName: "eth0"}); err != nil {
		t.Fatalf("DEL %s on %s: %v", cid, n.name, err)
	}
}

func exhausted(err error) bool {
	var ae *api.Error
	return errors.As(err, &ae) && ae.Code == api.CodeExhausted
}

// editRecord changes pool record name as an operator's edit does: read, change,
// write back conditioned on the revision read (kubectl edit, an etcd txn on
// mod_revision), reading again on a conflict.
func editRecord(t *testing.T, ds datastore.Store, name string, edit func(spec map[string]any)) {
	t.Helper()
	ctx := context.Background()
	for range 20 {
		kv, err := ds.Get(ctx, cluster.PoolKey(name))
		if err != nil {
			t.Fatalf("reading pool %s: %v", name, err)
		}
		var spec map[string]any
		if err := json.Unmarshal(kv.Value, &spec); err != nil {
			t.Fatal(err)
		}
		edit(spec)
		v, _ := json.Marshal(spec)
		if _, err := ds.Update(ctx, kv.Key, v, kv.Revision); errors.Is(err, datastore.ErrConflict) {
			continue
		} else if err != nil {
			t.Fatalf("writing pool %s: %v", name, err)
		}
		t.Logf("pool record %s now %s", name, v)
		return
	}
	t.Fatalf("pool %s kept changing under the edit", name)
}

func isRange(subnet string) func(any) bool {
	return func(r any) bool { return r.(map[string]any)["subnet"] == subnet }
}

// addRangeTo appends a range to range set 0; drainRange removes one from it, and
// for a network's default pool lists it under drained (so that a conflist that
// still names it does not add it back).
func addRangeTo(subnet string) func(map[string]any) {
	return func(spec map[string]any) {
		sets := spec["ranges"].([]any)
		sets[0] = append(sets[0].([]any), map[string]any{"subnet": subnet})
	}
}

func drainRange(subnet string, named bool) func(map[string]any) {
	return func(spec map[string]any) {
		sets := spec["ranges"].([]any)
		set := sets[0].([]any)
		i := slices.IndexFunc(set, isRange(subnet))
		if i < 0 {
			panic("no range " + subnet)
		}
		if !named {
			d, _ := spec["drained"].([]any)
			spec["drained"] = append(d, set[i])
		}
		sets[0] = slices.Delete(set, i, i+1)
	}
}

// blocksIn returns the block records of the datastore in prefix.
func blocksIn(t *testing.T, ds datastore.Store, prefix string) []cluster.BlockRecord {
	t.Helper()
	bs, err := cluster.ReadBlocks(context.Background(), ds)
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix(prefix)
	var out []cluster.BlockRecord
	for _, b := range bs {
		if p.Overlaps(b.CIDR) {
			out = append(out, b)
		}
	}
	return out
}

// changeLive runs the operator's two changes of pool p on agents nodes through
// the real ipledgerd binaries, pods added and deleted throughout:
//
//  1. range A fills (every agent answers "exhausted"); a third of the pods go,
//     range B is added to the record, and every agent goes on to hand out B's
//     addresses once its blocks of A are full again;
//  2. range A is drained: once each agent's doctor says its blocks there drain,
//     no new pod gets an address of A, the pods there keep theirs (their ADD
//     again answers the same), and when they are gone every block record of A
//     is deleted and none is claimed again, B filling to "exhausted".
//
// No ADD answers an address another live pod holds (the test's record) and the
// cluster audit balances at each step, and after every DEL no lease is left.
func changeLive(t *testing.T, ds datastore.Store, nodes []*node, p livePool) {
	h := &holders{m: map[netip.Addr]string{}}
	type pod struct {
		n    *node
		cid  string
		addr netip.Addr
	}
	var pods []pod
	seq := 0
	add := func(n *node) (pod, error) {
		seq++
		cid := fmt.Sprintf("%s-%s-%d", p.prefix, n.name, seq)
		a, err := liveAdd(n, p, cid)
		if err != nil {
			return pod{}, err
		}
		h.take(a, n.name+"/"+cid)
		x := pod{n, cid, a}
		pods = append(pods, x)
		return x, nil
	}
	del := func(x pod) {
		h.drop(x.addr)
		liveDel(t, x.n, x.cid)
		pods = slices.DeleteFunc(pods, func(y pod) bool { return y.cid == x.cid })
	}
	inside := func(prefix string, a netip.Addr) bool { return netip.MustParsePrefix(prefix).Contains(a) }
	// fillAll adds pods round-robin until every agent answers "exhausted"; each
	// address must be in one of within.
	fillAll := func(within ...string) int {
		full := map[*node]bool{}
		added := 0
		for len(full) < len(nodes) {
			for _, n := range nodes {
				if full[n] {
					continue
				}
				x, err := add(n)
				if exhausted(err) {
					full[n] = true
					continue
				}
				if err != nil {
					t.Fatalf("ADD on %s: %v", n.name, err)
				}
				if !slices.ContainsFunc(within, func(r string) bool { return inside(r, x.addr) }) {
					t.Fatalf("%s on %s got %s, outside %v", x.cid, n.name, x.addr, within)
				}
				added++
			}
		}
		return added
	}
	checkDoubles := func() {
		t.Helper()
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, d := range h.doubles {
			t.Errorf("double assignment: %s", d)
		}
		if t.Failed() {
			t.FailNow()
		}
	}

	// 1. A full, then B added while pods go
	if n := fillAll(p.a); n != 29 {
		t.Fatalf("%d pods got an address of %s before it was full, want its 29", n, p.a)
	}
	for i := len(pods) - 1; i >= 0; i -= 3 {
		del(pods[i])
	}
	editRecord(t, ds, p.name, addRangeTo(p.b))
	for _, n := range nodes {
		// the agent follows the record from its watch; until it has, its ADD may
		// still answer "exhausted" (the bound only stops a watch that never
		// delivers)
		bound := time.Now().Add(time.Minute)
		for {
			x, err := add(n)
			if exhausted(err) && time.Now().Before(bound) {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("ADD on %s after %s was added: %v", n.name, p.b, err)
			}
			if inside(p.b, x.addr) {
				t.Logf("%s: %s from the added range %s", n.name, x.addr, p.b)
				break
			}
			if !inside(p.a, x.addr) {
				t.Fatalf("%s on %s got %s, outside %s and %s", x.cid, n.name, x.addr, p.a, p.b)
			}
		}
	}
	checkDoubles()
	mustBalance(t, nodes)

	// 2. A drained
	var inA []pod
	for _, x := range pods {
		if inside(p.a, x.addr) {
			inA = append(inA, x)
		}
	}
	editRecord(t, ds, p.name, drainRange(p.a, p.named))
	for _, n := range nodes {
		if slices.ContainsFunc(inA, func(x pod) bool { return x.n == n }) {
			waitDoctor(t, n, "WARN", "pool "+p.name+":", "blocks draining")
		}
	}
	// new pods while half the pods of A go: none in A
	for i, x := range inA {
		if i%2 == 0 {
			del(x)
		}
		nx, err := add(nodes[i%len(nodes)])
		if err != nil {
			t.Fatalf("ADD on %s while %s drains: %v", nodes[i%len(nodes)].name, p.a, err)
		}
		if !inside(p.b, nx.addr) {
			t.Fatalf("%s on %s got %s while %s drains, want an address of %s", nx.cid, nx.n.name, nx.addr, p.a, p.b)
		}
	}
	var kept []pod
	for i, x := range inA {
		if i%2 == 1 {
			kept = append(kept, x)
		}
	}
	for _, x := range kept {
		if a, err := liveAdd(x.n, p, x.cid); err != nil || a != x.addr {
			t.Fatalf("%s on %s (in draining %s) answered %s %v, want its %s", x.cid, x.n.name, p.a, a, err, x.addr)
		}
	}
	if len(blocksIn(t, ds, p.a)) == 0 {
		t.Fatalf("no block record of %s left while %d pods hold its addresses", p.a, len(kept))
	}
	checkDoubles()
	mustBalance(t, nodes)
	for _, x := range kept {
		del(x)
	}
	// each block of A is given back at its node's next sweep (a second apart)
	bound := time.Now().Add(time.Minute)
	for bs := blocksIn(t, ds, p.a); len(bs) > 0; bs = blocksIn(t, ds, p.a) {
		if time.Now().After(bound) {
			t.Fatalf("block records of drained %s left a minute after its last pod went: %+v", p.a, bs)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// never claimed again: the pool fills at B's end
	fillAll(p.b)
	if bs := blocksIn(t, ds, p.a); len(bs) > 0 {
		t.Fatalf("blocks of drained %s claimed again: %+v", p.a, bs)
	}
	checkDoubles()
	mustBalance(t, nodes)
	for len(pods) > 0 {
		del(pods[0])
	}
	if rep := mustBalance(t, nodes); rep.Leases != 0 {
		t.Fatalf("%d leases left after every pod went", rep.Leases)
	}
}

// TestLivePoolsOnEtcd: three real ipledgerd agents on etcd serve a network's
// default pool while the operator adds a range to its record and drains one
// (changeLive).
func TestLivePoolsOnEtcd(t *testing.T) {
	e := etcdenv.StartEmbedded(t)
	nodes := startNodes(t, 3, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(e.Endpoints(), ",")})
	ds, err := etcdds.New(etcdds.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	changeLive(t, ds, nodes, livePool{name: liveNet, a: liveA, b: liveB, prefix: "d"})
}

// TestLivePoolsOnKubernetes: the same on a real kube-apiserver, for the
// network's default pool (its IPPool written from the conflist) and for an
// IPPool blue chosen by the pods' namespace's ipledger.io/pool annotation.
func TestLivePoolsOnKubernetes(t *testing.T) {
	kube := startKube(t)
	ns := "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-b\n  annotations:\n    ipledger.io/pool: blue\n"
	if out, err := kube.KubectlIn([]byte(ns), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply namespace: %v %s", err, out)
	}
	ds, err := kubeds.New(kube.Config(), kubeds.Options{})
	if err != nil {
		t.Fatal(err)
	}
	blue := fmt.Sprintf(`{"ranges":[[{"subnet":%q}]],"blockSize":%d}`, blueA, liveBlock)
	if _, err := ds.Create(context.Background(), cluster.PoolKey("blue"), []byte(blue)); err != nil {
		t.Fatal(err)
	}
	nodes := startNodes(t, 3, []string{"--datastore", "kubernetes", "--kubeconfig", kube.Kubeconfig})
	t.Run("DefaultPool", func(t *testing.T) {
		changeLive(t, ds, nodes, livePool{name: liveNet, a: liveA, b: liveB, prefix: "d"})
	})
	t.Run("IPPool", func(t *testing.T) {
		changeLive(t, ds, nodes, livePool{name: "blue", ns: "team-b", a: blueA, b: blueB, named: true, prefix: "n"})
	})
}
