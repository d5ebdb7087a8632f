package kubeds_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// An IPPool an operator applies (kubectl apply: no key annotation, no labels) is
// the record "pools/<name>": Get and List read it, and the agents parse it as the
// named pool, node selector and block size included. Before kubeds read such an
// object, Get failed on it ("not written by ipledger") and List skipped it.
func TestOperatorIPPool(t *testing.T) {
	e := startEnv(t, kubeenv.APIServerOptions{})
	s := e.store(t)
	ctx := ctxT(t)
	const manifest = `
apiVersion: ipledger.io/v1alpha1
kind: IPPool
metadata:
  name: blue
spec:
  ranges:
    - [{subnet: 10.50.0.0/16}]
    - [{subnet: "fd50::/64"}]
  blockSize: 28
  nodeSelector:
    topology.kubernetes.io/zone: b
`
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Resource(ippools).Create(context.Background(), &obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.client.Resource(ippools).Delete(context.Background(), "blue", metav1.DeleteOptions{}) })
	kv, err := s.Get(ctx, cluster.PoolKey("blue"))
	if err != nil {
		t.Fatalf("get pools/blue: %v", err)
	}
	p, err := cluster.ParseIPPool("blue", kv.Value)
	if err != nil {
		t.Fatalf("parse %s: %v", kv.Value, err)
	}
	if len(p.Ranges) != 2 || p.Ranges[0][0].Subnet.String() != "10.50.0.0/16" || p.BlockBits[0] != 28 || p.BlockBits[1] != 124 ||
		p.NodeSelector["topology.kubernetes.io/zone"] != "b" {
		t.Fatalf("IPPool blue read as %+v", p)
	}
	w, err := s.Watch(ctx, "pools/", kv.Revision-1)
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-w.Events(); ev.KV.Key != "pools/blue" || ev.KV.Revision != kv.Revision {
		t.Fatalf("watch from before the IPPool: %+v (%v), want pools/blue created", ev, w.Err())
	}
	kvs, _, err := s.List(ctx, "pools/")
	if err != nil || len(kvs) != 1 || kvs[0].Key != "pools/blue" || kvs[0].Revision != kv.Revision {
		t.Fatalf("list pools/: %+v %v, want pools/blue", kvs, err)
	}
}
