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

// The sticky-address and reservation tests on the Kubernetes datastore: a real kube-apiserver
// (kubeenv's apiserver-only mode, no host lock) with the CRDs of
// deploy/ipledger.yaml, each cluster its own Lease namespace and network; the
// block records' borrows go through the IPBlock schema and come back.
func TestStickyKube(t *testing.T) {
	newC := kubeClusters(t, "sticky")
	t.Run("BorrowRace", func(t *testing.T) { testBorrowRace(t, newC) })
	t.Run("DeadBorrowerReturned", func(t *testing.T) { testDeadBorrowerReturned(t, newC) })
	t.Run("ReservationsCopy", func(t *testing.T) { testReservationsCopy(t, newC) })
	t.Run("StickyReserved", func(t *testing.T) { testStickyReserved(t, newC) })
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
