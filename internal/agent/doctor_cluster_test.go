package agent_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/memds"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
)

// watchCopies runs the node's watched copies of the pool and block records, as
// ipledgerd does, until the test ends, and returns once both have listed.
func (n *clusterNode) watchCopies() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	n.t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { n.m.WatchPools(ctx) })
	wg.Go(func() { n.m.WatchOwners(ctx) })
	for !n.m.AuditPools().Known {
		select {
		case <-n.m.PoolsFollowed():
		case <-n.m.BlocksChanged():
		case <-time.After(time.Minute):
			n.t.Fatalf("%s: the watched copies never listed: %s", n.m.Node(), n.m.AuditPools().Cause)
		}
	}
}

// clusterDoctor asks the agent's operator API for its diagnosis and returns the
// cluster checks, each line checked for a level and a fix.
func clusterDoctor(t *testing.T, n *clusterNode) []api.Check {
	t.Helper()
	r := n.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpDoctor})
	if r.Error != nil || r.Doctor == nil {
		t.Fatalf("doctor: %+v", r.Error)
	}
	for _, c := range r.Doctor.ClusterChecks {
		t.Logf("%-4s %s", c.Level, c.Text)
		switch c.Level {
		case api.CheckOK:
		case api.CheckWarn, api.CheckFail:
			if !strings.Contains(c.Text, "fix:") {
				t.Errorf("%s line names no fix: %q", c.Level, c.Text)
			}
		default:
			t.Errorf("check with level %q: %q", c.Level, c.Text)
		}
	}
	return r.Doctor.ClusterChecks
}

// want asserts that exactly one check starts with prefix, at level, and contains
// every one of parts.
func want(t *testing.T, checks []api.Check, prefix, level string, parts ...string) {
	t.Helper()
	var found []api.Check
	for _, c := range checks {
		if strings.HasPrefix(c.Text, prefix) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Errorf("%d checks start with %q, want 1", len(found), prefix)
		return
	}
	if found[0].Level != level {
		t.Errorf("check %q: level %s, want %s", found[0].Text, found[0].Level, level)
	}
	for _, p := range parts {
		if !strings.Contains(found[0].Text, p) {
			t.Errorf("check %q does not say %q", found[0].Text, p)
		}
	}
}

func addPod(t *testing.T, n *clusterNode, name string) *api.Response {
	t.Helper()
	return n.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAdd, Network: "pods",
		ContainerID: "sandbox-" + name, IfName: "eth0", Pod: api.Pod{Namespace: "shop", Name: name, UID: "uid-" + name},
		Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.60.0.0/27"}]]`), BlockSize: 29})
}

// TestDoctorClusterMode: through the agent's operator API, doctor's cluster checks
// follow the datastore and the node lease on the test clock (lease TTL 3 s, margin
// 0.3 s): all OK when healthy; a failed last call WARNs while the lease is provable;
// full blocks with the datastore away FAIL the network as degraded; past the lease
// the node lease FAILs (fenced), and the datastore FAILs once unreachable longer
// than the TTL; back online, full blocks WARN that the next ADD must claim one; and
// after another node reclaimed this node's block, the pods left in it are named.
func TestDoctorClusterMode(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	a := newClusterNode(t, ds, clk, "node-a")
	if r := addPod(t, a, "web-0"); r.Error != nil {
		t.Fatalf("ADD: %+v", r.Error)
	}
	a.watchCopies()

	t.Log("healthy")
	cs := clusterDoctor(t, a)
	for _, c := range cs {
		if c.Level != api.CheckOK {
			t.Errorf("healthy node: %s %s", c.Level, c.Text)
		}
	}
	want(t, cs, "datastore (memory) reachable", api.CheckOK, "0s ago")
	want(t, cs, "node lease of node-a provable", api.CheckOK, "2.7s left before fencing")
	want(t, cs, "cluster network pods:", api.CheckOK, "1 blocks owned, 5 free addresses")
	want(t, cs, "no lease in a block", api.CheckOK)
	want(t, cs, "pool records parse, and every block belongs to a pool", api.CheckOK)
	if len(cs) != 5 {
		t.Errorf("%d cluster checks, want 5 (datastore, lease, one network, lost blocks, pool records)", len(cs))
	}

	t.Log("datastore away, lease still provable")
	ds.SetAvailable(false)
	clk.Advance(time.Second)
	_ = a.m.Sweep(context.Background()) // a failed call, noted
	clk.Advance(500 * time.Millisecond)
	cs = clusterDoctor(t, a)
	want(t, cs, "datastore (memory): the last call, 500ms ago, failed", api.CheckWarn, "unavailable", "still provable for 1.2s")
	want(t, cs, "node lease of node-a provable", api.CheckOK, "1.2s left")
	want(t, cs, "cluster network pods:", api.CheckOK, "1 blocks owned, 5 free")

	t.Log("blocks full, datastore away: degraded")
	for i := 1; i <= 5; i++ {
		if r := addPod(t, a, fmt.Sprint("web-", i)); r.Error != nil {
			t.Fatalf("ADD web-%d from the owned block: %+v", i, r.Error)
		}
	}
	cs = clusterDoctor(t, a)
	want(t, cs, "cluster network pods degraded", api.CheckFail, "datastore is unreachable", "1 blocks owned, 0 free", "restore the datastore")

	t.Log("past the lease: fenced")
	clk.Advance(1500 * time.Millisecond) // 3 s after the last renewal
	cs = clusterDoctor(t, a)
	want(t, cs, "node lease of node-a NOT provable", api.CheckFail, "fenced", "ADDs fail")
	want(t, cs, "datastore (memory): the last call", api.CheckWarn, "unreachable for 3s")
	want(t, cs, "cluster network pods degraded", api.CheckFail, "node lease not provable")
	clk.Advance(time.Second)
	cs = clusterDoctor(t, a)
	want(t, cs, "datastore (memory) unreachable for 4s, longer than the node lease's TTL (3s)", api.CheckFail, "the last call, 3s ago, failed")

	t.Log("datastore back, blocks full")
	ds.SetAvailable(true)
	if err := a.m.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	cs = clusterDoctor(t, a)
	want(t, cs, "datastore (memory) reachable", api.CheckOK)
	want(t, cs, "node lease of node-a provable", api.CheckOK)
	want(t, cs, "cluster network pods: no free address in the node's 1 blocks", api.CheckWarn, "next ADD must claim a block", "ipledgerctl blocks")

	t.Log("another node reclaims node-a's block while node-a does not renew")
	b := newClusterNode(t, ds, clk, "node-b")
	for i := 0; b.m.Counts().Reclaims == 0; i++ {
		if i > 30 {
			t.Fatal("node-b never reclaimed node-a's block")
		}
		clk.Advance(time.Second)
		_ = b.m.Renew(context.Background())
		_ = b.m.Sweep(context.Background())
	}
	if err := a.m.Renew(context.Background()); err != nil {
		t.Fatal(err)
	}
	cs = clusterDoctor(t, a)
	want(t, cs, "6 leases in blocks this node lost", api.CheckWarn, "pod shop/web-0 (pods, 10.60.0.2 in lost block 10.60.0.0/29)", "drain this node", "delete those pods")
	want(t, cs, "node lease of node-a provable", api.CheckOK)
	want(t, cs, "cluster network pods: the node owns no block", api.CheckWarn, "next ADD must claim one")

	// deleting the pods clears the warning
	for i := 0; i <= 5; i++ {
		if r := a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpDel, Network: "pods", ContainerID: fmt.Sprint("sandbox-web-", i), IfName: "eth0"}); r.Error != nil {
			t.Fatalf("DEL web-%d: %+v", i, r.Error)
		}
	}
	cs = clusterDoctor(t, a)
	want(t, cs, "no lease in a block", api.CheckOK)
}

// Doctor names what still holds a drained range and a pool change refused: after
// an operator takes 10.60.0.0/27 out of the network's default pool (its record:
// out of ranges, into drained), the node's block there is draining and doctor
// WARNs naming the pod whose lease holds it, with the fix; the range put back in
// the record while the block drains, doctor says the block drains since the
// range was drained, the range is back in the pool, and the block is given back
// once empty for the reuse delay (not that the range left the pool, which it
// said before); a block size change of
// the pool with live blocks is refused and doctor WARNs with the field and the fix.
func TestDoctorDrainingAndRefused(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	rec := `{"network":"pods","ranges":[[{"subnet":"10.60.0.0/27"},{"subnet":"10.60.1.0/27"}]],"blockBits":[29]}`
	if _, err := ds.Create(context.Background(), cluster.PoolKey("pods"), []byte(rec)); err != nil {
		t.Fatal(err)
	}
	a := newClusterNode(t, ds, clk, "node-a")
	wctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { a.m.WatchPools(wctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-a.m.PoolsFollowed() // listed
	r := a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAdd, Network: "pods", ContainerID: "web0", IfName: "eth0",
		Pod: api.Pod{Namespace: "default", Name: "web-0", UID: "u0"}, Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.60.0.0/27"}]]`), BlockSize: 29})
	if r.Error != nil || !strings.HasPrefix(r.Lease.IPs[0], "10.60.0.") {
		t.Fatalf("ADD: %+v %+v", r.Error, r.Lease)
	}
	edit := func(value string) {
		t.Helper()
		kv, err := ds.Get(context.Background(), cluster.PoolKey("pods"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ds.Update(context.Background(), kv.Key, []byte(value), kv.Revision); err != nil {
			t.Fatal(err)
		}
	}
	wait := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-a.m.PoolsFollowed():
			case <-time.After(time.Minute):
				t.Fatalf("%s: never seen", what)
			}
		}
	}
	edit(`{"network":"pods","ranges":[[{"subnet":"10.60.1.0/27"}]],"blockBits":[29],"drained":[{"subnet":"10.60.0.0/27","rangeStart":"10.60.0.1","rangeEnd":"10.60.0.30","gateway":"10.60.0.1"}]}`)
	// the ledger marks the block draining before the manager takes the new
	// record; the doctor reads both, so wait for both
	wait("drain", func() bool {
		bs := a.l.Blocks("pods")
		return len(bs) == 1 && bs[0].State == ledger.BlockDraining && len(a.m.DrainedRanges("pods")) == 1
	})
	checks := clusterDoctor(t, a)
	want(t, checks, "pool pods: 1 blocks draining", api.CheckWarn, "held by 1 leases", "pod default/web-0 (pods, 10.60.0.2 in draining block 10.60.0.0/29)", "fix:")
	// the audit (ipledgerctl pools) shows the drained range and what holds the block
	au := a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAudit})
	if au.Error != nil || au.Audit == nil || len(au.Audit.Pools) != 1 {
		t.Fatalf("audit: %+v", au)
	}
	if p := au.Audit.Pools[0]; p.Network != "pods" || !slices.Equal(p.Drained, []string{"10.60.0.0/27"}) || len(p.Draining) != 1 ||
		p.Draining[0].Block != "10.60.0.0/29" || p.Draining[0].Leases != 1 || !slices.Equal(p.Draining[0].Pods, []string{"default/web-0"}) {
		t.Fatalf("audit's pool: %+v, want 10.60.0.0/27 drained and block 10.60.0.0/29 held by default/web-0", p)
	}
	// the range re-added while the block drains: doctor says so, and no longer
	// that the range left the pool
	edit(`{"network":"pods","ranges":[[{"subnet":"10.60.1.0/27"},{"subnet":"10.60.0.0/27"}]],"blockBits":[29],"drained":[]}`)
	wait("re-added", func() bool { return len(a.m.DrainedRanges("pods")) == 0 })
	checks = clusterDoctor(t, a)
	want(t, checks, "pool pods: 1 blocks draining since their range was drained", api.CheckWarn, "the range is back in the pool",
		"hand out nothing until they are given back", "reuse delay", "then claimable again", "held by 1 leases", "pod default/web-0 (pods, 10.60.0.2 in draining block 10.60.0.0/29)", "fix:")
	for _, c := range checks {
		if strings.Contains(c.Text, "range left the pool") {
			t.Errorf("doctor says the range left the pool after it was re-added: %q", c.Text)
		}
	}
	au = a.s.Handle(context.Background(), api.Request{Version: api.Version, Op: api.OpAudit})
	if au.Error != nil || au.Audit == nil || len(au.Audit.Pools) != 1 {
		t.Fatalf("audit: %+v", au)
	}
	if p := au.Audit.Pools[0]; len(p.Drained) != 0 || len(p.Draining) != 1 || !p.Draining[0].RangeInPool || p.Draining[0].Leases != 1 {
		t.Fatalf("audit's pool after the re-add: %+v, want nothing drained and block 10.60.0.0/29 draining, its range in the pool", p)
	}
	edit(`{"network":"pods","ranges":[[{"subnet":"10.60.1.0/27"},{"subnet":"10.60.0.0/27"}]],"blockBits":[28],"drained":[]}`)
	wait("refusal", func() bool { return a.m.Refused()["pods"] != "" })
	checks = clusterDoctor(t, a)
	want(t, checks, "pool pods: its record is not served", api.CheckWarn, "blockBits: blocks of /[28]", "restore blockBits", "fix:")
}

// Doctor checks the cluster's pool records from the watched copies: before they
// run it says it has not checked (and judges nothing); then an IPPool whose spec
// does not parse FAILs naming the pool, the field and the fix, and a block of an
// IPPool deleted while a pod holds an address in it WARNs naming the block, its
// owner and that pod on the owner (and the owner on another node), with the fix.
func TestDoctorPoolRecords(t *testing.T) {
	clk := clocktest.New()
	ds := memds.New(clk)
	bg := context.Background()
	if _, err := ds.Create(bg, cluster.PoolKey("green"), []byte(`{"ranges":[[{"subnet":"10.70.0.0/24"}]],"blockSize":28}`)); err != nil {
		t.Fatal(err)
	}
	choices := ipChoices{"default/g0": {"ipledger.io/pool": "green"}}
	a := newClusterNode(t, ds, clk, "node-a", func(c *agent.Config) { c.Choices = choices })
	b := newClusterNode(t, ds, clk, "node-b")
	want(t, clusterDoctor(t, a), "pool records not checked", api.CheckWarn, "the watch of the pool records", "fix:")

	a.watchCopies()
	b.watchCopies()
	r := a.s.Handle(bg, api.Request{Version: api.Version, Op: api.OpAdd, Network: "pods", ContainerID: "g0", IfName: "eth0",
		Pod: api.Pod{Namespace: "default", Name: "g0", UID: "u-g0"}, Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.60.0.0/27"}]]`), BlockSize: 29})
	if r.Error != nil || !strings.HasPrefix(r.Lease.IPs[0], "10.70.0.") {
		t.Fatalf("ADD in pool green: %+v %+v", r.Error, r.Lease)
	}
	g0, _, _ := strings.Cut(r.Lease.IPs[0], "/")
	if _, err := ds.Create(bg, cluster.PoolKey("red"), []byte(`{"ranges":[[{"subnet":"10.71.0.0/33"}]],"blockSize":28}`)); err != nil {
		t.Fatal(err)
	}
	kv, err := ds.Get(bg, cluster.PoolKey("green"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ds.Delete(bg, kv.Key, kv.Revision); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*clusterNode{a, b} {
		for {
			au := n.m.AuditPools()
			if au.Known && len(au.Bad) == 1 && len(au.Orphans) == 1 {
				break
			}
			select {
			case <-n.m.PoolsFollowed():
			case <-n.m.BlocksChanged():
			case <-time.After(time.Minute):
				t.Fatalf("%s: the bad and the deleted pool never seen: %+v", n.m.Node(), au)
			}
		}
	}
	block := "10.70.0.0/28"
	checks := clusterDoctor(t, a)
	want(t, checks, "pool record red does not parse: ", api.CheckFail, "IPPool red", "ranges[0][0].subnet", "10.71.0.0/33", "kubectl edit ippool red")
	want(t, checks, "block "+block+" of pool green, owner node-a: its pool's record (pools/green) is gone", api.CheckWarn,
		"pod default/g0 (green, "+g0+" in block "+block+")", "re-create IPPool green", "fix:")
	checks = clusterDoctor(t, b)
	want(t, checks, "block "+block+" of pool green, owner node-a", api.CheckWarn, "the leases of node node-a")
	if ls := a.l.Leases(""); len(ls) != 1 {
		t.Fatalf("doctor changed the leases: %v", ls)
	}
}
