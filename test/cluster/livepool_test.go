package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/cluster/clustertest"
	"github.com/ipledger/ipledger/internal/ctl"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/etcdds"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/pool"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// The live pools' network: its conflist names range A only. A is 29 addresses
// (its .0, gateway .1 and broadcast left out) in four /29 blocks, so that three
// agents fill it in a few dozen ADDs; B, added later, is 61 in eight, room for
// every pod of A to move there whichever node it lands on.
const (
	liveNet   = "live"
	liveA     = "10.78.0.0/27"
	liveB     = "10.78.0.64/26"
	blueA     = "10.79.0.0/27"
	blueB     = "10.79.0.64/26"
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

// liveRun is pods of one pool added and deleted on agents nodes, each answer
// checked against the test's record of live holders.
type liveRun struct {
	t     *testing.T
	ds    datastore.Store
	nodes []*node
	p     livePool
	h     *holders
	pods  []livePod
	seq   int
	// reuse, when set, is the agents' --reuse-delay: an ADD answered less than
	// that after the DEL of the same address was sent fails the test (the
	// agent's release came after the DEL was sent and its choice before the
	// answer, so the address certainly went out within the reuse delay).
	reuse time.Duration
	delAt map[netip.Addr]time.Time
}

type livePod struct {
	n    *node
	cid  string
	addr netip.Addr
}

func newLiveRun(t *testing.T, ds datastore.Store, nodes []*node, p livePool) *liveRun {
	return &liveRun{t: t, ds: ds, nodes: nodes, p: p, h: &holders{m: map[netip.Addr]string{}}, delAt: map[netip.Addr]time.Time{}}
}

func (r *liveRun) add(n *node) (livePod, error) {
	r.seq++
	cid := fmt.Sprintf("%s-%s-%d", r.p.prefix, n.name, r.seq)
	a, err := liveAdd(n, r.p, cid)
	if err != nil {
		return livePod{}, err
	}
	if at, ok := r.delAt[a]; ok && r.reuse > 0 && time.Since(at) < r.reuse {
		r.t.Fatalf("%s on %s got %s %v after the DEL of its last holder was sent, within the reuse delay %v", cid, n.name, a, time.Since(at), r.reuse)
	}
	r.h.take(a, n.name+"/"+cid)
	x := livePod{n, cid, a}
	r.pods = append(r.pods, x)
	return x, nil
}

func (r *liveRun) del(x livePod) {
	r.t.Helper()
	r.h.drop(x.addr)
	r.delAt[x.addr] = time.Now()
	liveDel(r.t, x.n, x.cid)
	r.pods = slices.DeleteFunc(r.pods, func(y livePod) bool { return y.cid == x.cid })
}

func inside(prefix string, a netip.Addr) bool { return netip.MustParsePrefix(prefix).Contains(a) }

// fillAll adds pods round-robin until every agent answers "exhausted"; each
// address must be in one of within. It returns how many it added.
func (r *liveRun) fillAll(within ...string) int {
	r.t.Helper()
	full := map[*node]bool{}
	added := 0
	for len(full) < len(r.nodes) {
		for _, n := range r.nodes {
			if full[n] {
				continue
			}
			x, err := r.add(n)
			if exhausted(err) {
				full[n] = true
				continue
			}
			if err != nil {
				r.t.Fatalf("ADD on %s: %v", n.name, err)
			}
			if !slices.ContainsFunc(within, func(p string) bool { return inside(p, x.addr) }) {
				r.t.Fatalf("%s on %s got %s, outside %v", x.cid, n.name, x.addr, within)
			}
			added++
		}
	}
	return added
}

// balanced fails the test on a double assignment the test saw or the cluster
// audit finds.
func (r *liveRun) balanced() ctl.ClusterAudit {
	r.t.Helper()
	r.h.mu.Lock()
	for _, d := range r.h.doubles {
		r.t.Errorf("double assignment: %s", d)
	}
	r.h.mu.Unlock()
	if r.t.Failed() {
		r.t.FailNow()
	}
	return mustBalance(r.t, r.nodes)
}

// podsIn returns the live pods whose address is in prefix.
func (r *liveRun) podsIn(prefix string) []livePod {
	var out []livePod
	for _, x := range r.pods {
		if inside(prefix, x.addr) {
			out = append(out, x)
		}
	}
	return out
}

// podsInBlocks returns the live pods whose address is in one of blocks.
func (r *liveRun) podsInBlocks(blocks map[netip.Prefix]string) []livePod {
	var out []livePod
	for _, x := range r.pods {
		for b := range blocks {
			if b.Contains(x.addr) {
				out = append(out, x)
			}
		}
	}
	return out
}

// delAll deletes every pod and checks that no lease is left.
func (r *liveRun) delAll() {
	r.t.Helper()
	for len(r.pods) > 0 {
		r.del(r.pods[0])
	}
	if rep := r.balanced(); rep.Leases != 0 {
		r.t.Fatalf("%d leases left after every pod went", rep.Leases)
	}
}

// waitBlocksGone waits until no block record of prefix is left (each is given
// back at its node's next sweep, a second apart; the bound only stops a drain
// that never ends).
func (r *liveRun) waitBlocksGone(prefix string) {
	r.t.Helper()
	bound := time.Now().Add(time.Minute)
	for bs := blocksIn(r.t, r.ds, prefix); len(bs) > 0; bs = blocksIn(r.t, r.ds, prefix) {
		if time.Now().After(bound) {
			r.t.Fatalf("block records of drained %s left a minute after its last pod went: %+v", prefix, bs)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// addedAndFull fills range A, deletes a third of its pods, adds range B to the
// record, and waits until every agent has handed out an address of B.
func (r *liveRun) addedAndFull() {
	t, p := r.t, r.p
	if n := r.fillAll(p.a); n != 29 {
		t.Fatalf("%d pods got an address of %s before it was full, want its 29", n, p.a)
	}
	for i := len(r.pods) - 1; i >= 0; i -= 3 {
		r.del(r.pods[i])
	}
	clustertest.EditPool(t, r.ds, p.name, clustertest.AddRange(p.b))
	for _, n := range r.nodes {
		r.untilFrom(n, p.b)
	}
	r.balanced()
}

// untilFrom adds pods on n until one gets an address of range prefix, each of
// the others one of A.
func (r *liveRun) untilFrom(n *node, prefix string) {
	r.t.Helper()
	// the agent follows the record from its watch; until it has, its ADD may
	// still answer "exhausted" (the bound only stops a watch that never delivers)
	bound := time.Now().Add(time.Minute)
	for {
		x, err := r.add(n)
		if exhausted(err) && time.Now().Before(bound) {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err != nil {
			r.t.Fatalf("ADD on %s after %s was added: %v", n.name, prefix, err)
		}
		if inside(prefix, x.addr) {
			r.t.Logf("%s: %s from the added range %s", n.name, x.addr, prefix)
			return
		}
		if !inside(r.p.a, x.addr) {
			r.t.Fatalf("%s on %s got %s, outside %s and %s", x.cid, n.name, x.addr, r.p.a, prefix)
		}
	}
}

// drain drains range A from the record and waits until the doctor of every
// agent holding pods there WARNs of its draining blocks.
func (r *liveRun) drain() {
	clustertest.EditPool(r.t, r.ds, r.p.name, clustertest.DrainRange(r.p.a, r.p.named))
	for _, n := range r.nodes {
		if slices.ContainsFunc(r.podsIn(r.p.a), func(x livePod) bool { return x.n == n }) {
			waitDoctor(r.t, n, "WARN", "pool "+r.p.name+":", "blocks draining")
		}
	}
}

// keepTheirs checks that every pod of pods keeps its address: its ADD again
// answers the same.
func (r *liveRun) keepTheirs(pods []livePod) {
	r.t.Helper()
	for _, x := range pods {
		if a, err := liveAdd(x.n, r.p, x.cid); err != nil || a != x.addr {
			r.t.Fatalf("%s on %s (in draining %s) answered %s %v, want its %s", x.cid, x.n.name, r.p.a, a, err, x.addr)
		}
	}
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
	r := newLiveRun(t, ds, nodes, p)
	r.addedAndFull()
	inA := r.podsIn(p.a)
	r.drain()
	// new pods while half the pods of A go: none in A
	var kept []livePod
	for i, x := range inA {
		if i%2 == 0 {
			r.del(x)
		} else {
			kept = append(kept, x)
		}
		nx, err := r.add(nodes[i%len(nodes)])
		if err != nil {
			t.Fatalf("ADD on %s while %s drains: %v", nodes[i%len(nodes)].name, p.a, err)
		}
		if !inside(p.b, nx.addr) {
			t.Fatalf("%s on %s got %s while %s drains, want an address of %s", nx.cid, nx.n.name, nx.addr, p.a, p.b)
		}
	}
	r.keepTheirs(kept)
	if len(blocksIn(t, ds, p.a)) == 0 {
		t.Fatalf("no block record of %s left while %d pods hold its addresses", p.a, len(kept))
	}
	r.balanced()
	for _, x := range kept {
		r.del(x)
	}
	r.waitBlocksGone(p.a)
	// never claimed again: the pool fills at B's end
	r.fillAll(p.b)
	if bs := blocksIn(t, ds, p.a); len(bs) > 0 {
		t.Fatalf("blocks of drained %s claimed again: %+v", p.a, bs)
	}
	r.balanced()
	r.delAll()
}

// etcdAgents starts embedded etcd and three agents on it (with more flags, which
// may override testTimings), and returns them with a client of the datastore
// (closed when the test ends).
func etcdAgents(t *testing.T, more ...string) ([]*node, datastore.Store) {
	t.Helper()
	e := etcdenv.StartEmbedded(t)
	nodes := startNodes(t, 3, append([]string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(e.Endpoints(), ",")}, more...))
	ds, err := etcdds.New(etcdds.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ds.Close() })
	return nodes, ds
}

// TestLivePoolsOnEtcd: three real ipledgerd agents on etcd serve a network's
// default pool while the operator adds a range to its record and drains one
// (changeLive).
func TestLivePoolsOnEtcd(t *testing.T) {
	sideBySideWhenShort(t)
	nodes, ds := etcdAgents(t)
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

// drainReuse is the agents' reuse delay in the drain edges: long enough that a
// drained block given back without waiting it out shows (the agents sweep every
// second), short enough not to slow the test.
const drainReuse = 3 * time.Second

// TestDrainEdgesOnEtcd: drainEdges with three real ipledgerd agents on etcd.
func TestDrainEdgesOnEtcd(t *testing.T) {
	sideBySideWhenShort(t)
	nodes, ds := etcdAgents(t, "--reuse-delay", drainReuse.String())
	drainEdges(t, ds, nodes)
}

// TestDrainEdgesOnKubernetes: drainEdges with three real ipledgerd agents on a
// real kube-apiserver (no kubelet): block records are IPBlocks, node leases
// Leases, the pool record the network's IPPool.
func TestDrainEdgesOnKubernetes(t *testing.T) {
	kube := startKube(t)
	ds, err := kubeds.New(kube.Config(), kubeds.Options{})
	if err != nil {
		t.Fatal(err)
	}
	nodes := startNodes(t, 3, []string{"--datastore", "kubernetes", "--kubeconfig", kube.Kubeconfig, "--reuse-delay", drainReuse.String()})
	drainEdges(t, ds, nodes)
}

// drainEdges: three real ipledgerd agents (nodes, on datastore ds), range A of
// the default pool drained while every agent holds pods in its blocks, and then:
//
//   - an agent stopped with SIGTERM and restarted, and one SIGKILLed and
//     restarted: after the restart its doctor still WARNs of its draining
//     blocks, its new pods get addresses of B only, its pods in A keep theirs;
//   - an agent SIGKILLed for good: its draining blocks are never another
//     node's while its lease and the quarantine run (no owner but it or none),
//     are reclaimed as a dead node's blocks are, and then leave no record: the
//     range stays drained, nothing of it claimable, no pod of the live agents
//     getting one of the dead node's addresses there;
//   - range A re-added while the restarted agents' blocks there still drain:
//     those blocks hand out nothing more until their last pod goes, the rest
//     of A is the pool's at once, and once they are given back (the reuse
//     delay after their last release) their addresses are handed out again.
//
// Throughout, no ADD answers an address less than the reuse delay after the DEL
// of its last holder was sent (liveRun.reuse).
func drainEdges(t *testing.T, ds datastore.Store, nodes []*node) {
	p := livePool{name: liveNet, a: liveA, b: liveB, prefix: "e"}
	r := newLiveRun(t, ds, nodes, p)
	r.reuse = drainReuse
	r.fillAll(p.a)
	clustertest.EditPool(t, ds, p.name, clustertest.AddRange(p.b))
	for _, n := range nodes {
		r.untilFrom(n, p.b)
	}
	for _, n := range nodes {
		if !slices.ContainsFunc(r.podsIn(p.a), func(x livePod) bool { return x.n == n }) {
			t.Fatalf("%s holds no pod in %s to drain", n.name, p.a)
		}
	}
	r.drain()

	// an agent restarted while its blocks drain
	for i, kill := range []bool{false, true} {
		n := nodes[i]
		if kill {
			n.Kill()
		} else if err := n.Stop(); err != nil {
			t.Fatalf("SIGTERM %s: %v", n.name, err)
		}
		n.Restart()
		for range 3 {
			x, err := r.add(n)
			if err != nil || !inside(p.b, x.addr) {
				t.Fatalf("%s restarted (SIGKILL %v) while %s drains: ADD answered %s %v, want an address of %s", n.name, kill, p.a, x.addr, err, p.b)
			}
		}
		waitDoctor(t, n, "WARN", "pool "+p.name+":", "blocks draining")
		var its []livePod
		for _, x := range r.podsIn(p.a) {
			if x.n == n {
				its = append(its, x)
			}
		}
		r.keepTheirs(its)
	}
	r.balanced()

	// a dead node's draining blocks
	dead := nodes[2]
	var deadBlocks []netip.Prefix
	for _, b := range blocksIn(t, ds, p.a) {
		if b.Owner == dead.name {
			deadBlocks = append(deadBlocks, b.CIDR)
		}
	}
	if len(deadBlocks) == 0 {
		t.Fatalf("%s owns no block of %s", dead.name, p.a)
	}
	dead.Kill()
	live := nodes[:2]
	r.nodes = live
	// the dead node's pods are gone with it; its addresses in A stay in the
	// test's record of holders while A stays drained: no live agent may hand
	// one out
	var deadInA []netip.Addr
	r.pods = slices.DeleteFunc(r.pods, func(x livePod) bool {
		if x.n == dead && inside(p.a, x.addr) {
			deadInA = append(deadInA, x.addr)
		} else if x.n == dead {
			r.h.drop(x.addr)
		}
		return x.n == dead
	})
	bound := time.Now().Add(time.Minute)
	for {
		var left []cluster.BlockRecord
		for _, b := range blocksIn(t, ds, p.a) {
			if slices.Contains(deadBlocks, b.CIDR) {
				if b.Owner != dead.name && b.Owner != "" {
					t.Fatalf("the dead node's draining block %s went to %s", b.CIDR, b.Owner)
				}
				left = append(left, b)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(bound) {
			t.Fatalf("the dead node's draining blocks left a minute after it died: %+v", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
	for _, n := range live {
		x, err := r.add(n)
		if err != nil || !inside(p.b, x.addr) {
			t.Fatalf("ADD on %s after the dead node's blocks of drained %s went: %s %v, want an address of %s", n.name, p.a, x.addr, err, p.b)
		}
	}
	r.balanced()

	// A re-added while the restarted agents' blocks there drain
	stillDraining := map[netip.Prefix]string{}
	for _, b := range blocksIn(t, ds, p.a) {
		stillDraining[b.CIDR] = b.Owner
	}
	for _, a := range deadInA {
		r.h.drop(a) // reclaimed past the quarantine: the pool's again once A is
	}
	before := r.podsInBlocks(stillDraining)
	if len(before) == 0 {
		t.Fatal("no block of A drains any more")
	}
	clustertest.EditPool(t, ds, p.name, clustertest.UndrainRange(p.a))
	// once the agents follow, A's free blocks are theirs again: the pool fills
	// to exhausted over both ranges, never in a block that still drains
	bound = time.Now().Add(time.Minute)
	for len(r.podsIn(p.a)) == len(before) {
		if time.Now().After(bound) {
			t.Fatalf("no pod got an address of re-added %s in a minute", p.a)
		}
		r.fillAll(p.a, p.b)
		time.Sleep(100 * time.Millisecond)
	}
	for _, x := range r.podsInBlocks(stillDraining) {
		if !slices.ContainsFunc(before, func(y livePod) bool { return y.cid == x.cid }) {
			t.Fatalf("%s on %s got %s, in a block that drained when %s was re-added", x.cid, x.n.name, x.addr, p.a)
		}
	}
	r.balanced()
	// their last pods go: the blocks are given back, and their addresses are
	// the pool's again
	for _, x := range r.podsInBlocks(stillDraining) {
		r.del(x)
	}
	var again []livePod
	for bound = time.Now().Add(time.Minute); len(again) == 0; {
		if time.Now().After(bound) {
			t.Fatalf("no address of the blocks %v handed out again in a minute after they drained", stillDraining)
		}
		r.fillAll(p.a, p.b)
		again = r.podsInBlocks(stillDraining)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("after the drain ended, %d pods got addresses of the formerly draining blocks %v, e.g. %s on %s", len(again), stillDraining, again[0].addr, again[0].n.name)
	r.balanced()
	r.delAll()
}
