package cluster_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	kubeenv "github.com/ipledger/ipledger/internal/testenv/kube"
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
