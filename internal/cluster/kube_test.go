package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestKubeDatastore runs the tests that forBackends runs on memds and etcd on
// the Kubernetes datastore too: one real kube-apiserver (kubeenv's
// apiserver-only mode, no host lock) with the CRDs of deploy/ipledger.yaml,
// shared by the subtests one after the other, each cluster with every record
// emptied and its own Lease namespace. The sticky-address and reservation
// tests: the block records' borrows go through the IPBlock schema and come
// back. The live pool tests: an IPPool's edits reach the agents through the
// watch of the CRD. One apiserver instead of one per test: its start is most
// of each subtest's time (about 25 s each on 2 cores, against 1 to 5 s of
// test).
func TestKubeDatastore(t *testing.T) {
	newC := kubeClusters(t, "kube")
	for _, tc := range []struct {
		name string
		test func(*testing.T, func(*testing.T) *cl)
	}{
		{"BorrowRace", testBorrowRace},
		{"DeadBorrowerReturned", testDeadBorrowerReturned},
		{"ReservationsCopy", testReservationsCopy},
		{"StickyReserved", testStickyReserved},
		{"PoolRangeAdded", testPoolRangeAdded},
		{"PoolRangeDrained", testPoolRangeDrained},
		{"DrainedBlockKeepsReuseDelay", testDrainedBlockKeepsReuseDelay},
		{"ConflistExtendsPool", testConflistExtendsPool},
		{"PoolChangesUnderChurn", testPoolChangesUnderChurn},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.test(t, newC) })
	}
}

// kubeClusters starts a real kube-apiserver (kubeenv's apiserver-only mode, no
// host lock) with the CRDs of deploy/ipledger.yaml and returns a maker of test
// clusters on it: each empties every record and gets a Lease namespace of its own
// (prefix-N).
func kubeClusters(t *testing.T, prefix string) func(*testing.T) *cl {
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	cfg := api.Config()
	cfg.QPS, cfg.Burst = 1000, 2000
	manifest, err := os.ReadFile(filepath.Join("..", "..", "deploy", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := kubeds.InstallCRDs(cctx, cfg, manifest); err != nil {
		t.Fatal(err)
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	return func(t *testing.T) *cl {
		n++
		// every block record is cluster-wide: empty them, and give the Leases a
		// namespace of their own
		for _, r := range []string{"ipblocks", "ippools", "ipreservations", "iprecords"} {
			gvr := schema.GroupVersionResource{Group: kubeds.Group, Version: kubeds.Version, Resource: r}
			if err := client.Resource(gvr).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		ns := fmt.Sprintf("%s-%d", prefix, n)
		nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
		if _, err := client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		open := func() datastore.Store {
			s, err := kubeds.New(cfg, kubeds.Options{Namespace: ns})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}
		return newCluster(t, clocktest.New(), open(), open)
	}
}
