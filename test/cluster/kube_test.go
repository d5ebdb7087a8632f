package cluster_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// startKube starts a real kube-apiserver (kubeenv's apiserver-only mode) with the
// CRDs of deploy/ipledger.yaml and the namespace of the node Leases.
func startKube(t testing.TB) *kubeenv.APIServer {
	t.Helper()
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	manifest, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := kubeds.InstallCRDs(ctx, api.Config(), manifest); err != nil {
		t.Fatal(err)
	}
	if out, err := api.Kubectl("create", "namespace", kubeds.DefaultNamespace); err != nil {
		t.Fatalf("kubectl create namespace: %v %s", err, out)
	}
	return api
}

// TestFiveAgentsOnKubernetes: five ipledgerd processes share one cluster-wide pool
// through a real kube-apiserver (IPPool/IPBlock custom resources, compare-and-swap on
// resourceVersion, a Lease per node). 5,000 allocations and as many releases run
// concurrently through the agents' sockets and the plugin binary, and the apiserver
// is restarted a third of the way in. No ADD ever answers an address another live
// lease holds, and the cluster audit finds no address held twice and every lease in
// a block its node owns, with leases live and after they are released.
func TestFiveAgentsOnKubernetes(t *testing.T) {
	api := startKube(t)
	nodes := startNodes(t, 5, []string{"--datastore", "kubernetes", "--kubeconfig", api.Kubeconfig})
	restarted := false
	st := churn(t, nodes, churnOpts{Allocations: 5000, Workers: 4, Live: 20, PluginEvery: 20, Retry: 60 * time.Second}, func() {
		// down longer than lease TTL + quarantine (3s + 3s): when it is back, every
		// node's Lease looks expired, yet every node was alive all along
		t0 := time.Now()
		api.Stop()
		time.Sleep(8 * time.Second)
		if err := api.Start(); err != nil {
			t.Errorf("apiserver start: %v", err)
			return
		}
		t.Logf("kube-apiserver restarted after %v down", time.Since(t0).Round(time.Millisecond))
		restarted = true
	})
	if !restarted {
		t.Fatal("the apiserver was not restarted")
	}
	rep := mustBalance(t, nodes)
	if want := 5 * 4 * 20; rep.Leases != want {
		t.Errorf("cluster audit saw %d leases, want the %d the churn left", rep.Leases, want)
	}
	noFalseReclaim(t, nodes)
	st.releaseAll(t)
	rep = mustBalance(t, nodes)
	if rep.Leases != 0 {
		t.Errorf("%d leases left after every release", rep.Leases)
	}
}

// TestDeletedNodeBlocksReclaimed: with a 60s quarantine, the blocks of an agent that
// was SIGKILLed are freed within seconds of its Node object's deletion (the agents
// watch Nodes): as soon as its 3s lease has run out, not after the quarantine. The
// live node keeps its own block.
func TestDeletedNodeBlocksReclaimed(t *testing.T) {
	kube := startKube(t)
	for _, n := range []string{"node-0", "node-1"} {
		if out, err := kube.KubectlIn([]byte("apiVersion: v1\nkind: Node\nmetadata:\n  name: "+n+"\n"), "apply", "-f", "-"); err != nil {
			t.Fatalf("kubectl apply Node %s: %v %s", n, err, out)
		}
	}
	nodes := startNodes(t, 2, []string{"--datastore", "kubernetes", "--kubeconfig", kube.Kubeconfig, "--reclaim-quarantine", "60s"})
	live, dead := nodes[0], nodes[1]
	for _, n := range nodes {
		if _, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: n.name + "-pod", IfName: "eth0", Ranges: ranges(t)}); err != nil {
			t.Fatalf("%s: ADD: %v", n.name, err)
		}
	}
	bs := blocksOf(t, live)
	deadBlocks, liveBlocks := ownedBy(bs, dead.name), ownedBy(bs, live.name)
	if len(deadBlocks) != 1 || len(liveBlocks) != 1 {
		t.Fatalf("want one block each: %+v", bs)
	}
	dead.Kill()
	killed := time.Now()
	if out, err := kube.Kubectl("delete", "node", dead.name); err != nil {
		t.Fatalf("kubectl delete node: %v %s", err, out)
	}
	deleted := time.Now()
	for {
		cur, ok := blockNamed(blocksOf(t, live), deadBlocks[0].Block)
		if ok && cur.Owner == "" {
			if cur.Epoch <= deadBlocks[0].Epoch {
				t.Fatalf("block freed without an epoch bump: %+v", cur)
			}
			break
		}
		// without the Node watch the block would wait for the lease and the 60s
		// quarantine
		if time.Since(killed) > 50*time.Second {
			t.Fatalf("block %s of the deleted node not freed 50s after the deletion: %+v", deadBlocks[0].Block, cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("a deleted node's block was free %v after its Node was deleted (%v after its agent was killed)", time.Since(deleted).Round(10*time.Millisecond), time.Since(killed).Round(10*time.Millisecond))
	if cur, _ := blockNamed(blocksOf(t, live), liveBlocks[0].Block); cur.Owner != live.name || cur.Epoch != liveBlocks[0].Epoch {
		t.Fatalf("the live node's block moved: %+v", cur)
	}
	rep := mustBalance(t, []*node{live})
	if rep.Leases != 1 {
		t.Errorf("live node's leases: %d, want 1", rep.Leases)
	}
	if _, err := live.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: live.name + "-pod", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
}

// TestReRegisteredNodeKeepsQuarantine: a Node deleted and then registered again under
// its name (a kubelet re-registers its Node while it and its pods still run) is a
// live node to the other agents again. When its agent then stops (killed here; down
// for a restart or cut off in life), its block waits out the lease and the 20s
// quarantine like any node's, instead of being freed as soon as the lease runs out,
// which would let another node hand out addresses the node's pods may still use.
func TestReRegisteredNodeKeepsQuarantine(t *testing.T) {
	const quarantine = 20 * time.Second
	kube := startKube(t)
	for _, n := range []string{"node-0", "node-1"} {
		applyNode(t, kube, n)
	}
	nodes := startNodes(t, 2, []string{"--datastore", "kubernetes", "--kubeconfig", kube.Kubeconfig, "--reclaim-quarantine", quarantine.String()})
	live, back := nodes[0], nodes[1]
	for _, n := range nodes {
		if _, err := call(n, api.Request{Op: api.OpAdd, Network: network, ContainerID: n.name + "-pod", IfName: "eth0", Ranges: ranges(t)}); err != nil {
			t.Fatalf("%s: ADD: %v", n.name, err)
		}
	}
	backBlocks := ownedBy(blocksOf(t, live), back.name)
	if len(backBlocks) != 1 {
		t.Fatalf("want one block of %s: %+v", back.name, backBlocks)
	}
	waitLogged := func(parts ...string) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); !logged(t, []*node{live}, parts...); time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not log %q within a minute", live.name, parts)
			}
		}
	}
	if out, err := kube.Kubectl("delete", "node", back.name); err != nil {
		t.Fatalf("kubectl delete node: %v %s", err, out)
	}
	waitLogged(`msg="Node deleted`, "node="+back.name)
	applyNode(t, kube, back.name)
	waitLogged(`msg="Node registered again`, "node="+back.name)

	back.Kill()
	killed := time.Now()
	for {
		cur, ok := blockNamed(blocksOf(t, live), backBlocks[0].Block)
		if ok && cur.Owner == "" {
			break
		}
		if time.Since(killed) > 2*time.Minute {
			t.Fatalf("block %s not freed 2 minutes after %s was killed: %+v", backBlocks[0].Block, back.name, cur)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(killed)
	t.Logf("the re-registered node's block was freed %v after its agent was killed", took.Round(10*time.Millisecond))
	if took < quarantine {
		t.Fatalf("block %s freed %v after %s was killed, before the %v quarantine: the Node's deletion still counted after it was registered again", backBlocks[0].Block, took, back.name, quarantine)
	}
	if _, err := live.Call(api.Request{Op: api.OpDel, Network: network, ContainerID: live.name + "-pod", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
}
