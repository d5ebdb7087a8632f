package cluster_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
)

// etcdLeader returns the index of the etcd cluster's leader.
func etcdLeader(t *testing.T, ec *etcdenv.Cluster) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, ep := range ec.Endpoints() {
		st, err := ec.Client().Status(ctx, ep)
		if err == nil && st.Header.MemberId == st.Leader {
			return i
		}
	}
	t.Fatal("etcd: no member reports itself leader")
	return -1
}

// TestFiveAgentsOnEtcd: five ipledgerd processes share one cluster-wide pool through
// a three-member etcd cluster (Debian's etcd-server, separate processes). 5,000
// allocations (1,000 under -short) and as many releases run concurrently through the agents' sockets,
// one in twenty through the real plugin binary, and the etcd leader is SIGKILLed a
// third of the way in. No ADD ever answers an address another live lease holds (the
// test's own record), and the real `ipledgerctl cluster-audit` finds no address held
// twice and every lease in a block its node owns, with the last leases still
// allocated and again after they are released.
func TestFiveAgentsOnEtcd(t *testing.T) {
	sideBySideWhenShort(t)
	ec := etcdenv.StartCluster(t, 3)
	nodes := startNodes(t, 5, []string{"--datastore", "etcd", "--etcd-endpoints", strings.Join(ec.Endpoints(), ",")})
	killed := -1
	allocs := 5000
	if testing.Short() {
		allocs = 1000
	}
	st := churn(t, nodes, churnOpts{Allocations: allocs, Workers: 4, Live: 20, PluginEvery: 20, Retry: 45 * time.Second}, func() {
		killed = etcdLeader(t, ec)
		t.Logf("SIGKILL of etcd member %d (the leader) mid-run", killed)
		ec.Kill(killed)
	})
	if killed < 0 {
		t.Fatal("the etcd member was never killed")
	}
	rep := mustBalance(t, nodes)
	if want := 5 * 4 * 20; rep.Leases != want {
		t.Errorf("cluster audit saw %d leases, want the %d the churn left", rep.Leases, want)
	}
	owners := map[string]int{}
	for _, b := range blocksOf(t, nodes[0]) {
		owners[b.Owner]++
	}
	for _, n := range nodes {
		if owners[n.name] == 0 {
			t.Errorf("node %s owns no block while it holds leases: %v", n.name, owners)
		}
	}
	noFalseReclaim(t, nodes)
	st.releaseAll(t)
	ec.Restart(killed)
	rep = mustBalance(t, nodes)
	if rep.Leases != 0 {
		t.Errorf("%d leases left after every release", rep.Leases)
	}
	waitHandBack(t, nodes)
}

// waitHandBack waits until every node, its leases all released, has given back its
// empty blocks but one (the block grace is 2s in the tests); at most 60s.
func waitHandBack(t *testing.T, nodes []*node) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		bs := blocksOf(t, nodes[0])
		var extra []string
		for _, n := range nodes {
			if own := ownedBy(bs, n.name); len(own) > 1 {
				extra = append(extra, n.name)
			}
		}
		if len(extra) == 0 {
			t.Logf("every node keeps one block after the grace: %d blocks recorded", len(bs))
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nodes %v still own more than one empty block 60s after their last release", extra)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
