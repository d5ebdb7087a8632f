package kubeds_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/cluster"
)

// An IPPool an operator applies (kubectl apply: no key annotation, no labels) is
// the record "pools/<name>": Get and List read it, and the agents parse it as the
// named pool, node selector and block size included. Before kubeds read such an
// object, Get failed on it ("not written by ipledger") and List skipped it.
func operatorIPPool(t *testing.T, e *env) {
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

// A network's default pool with spec.drained (the ranges an operator took out of
// it) is accepted by the IPPool CRD's schema, which describes the field (kubectl
// explain), and comes back from the store unchanged; a malformed spec.drained (not
// a list of ranges, or a range without a subnet) is refused by the API server
// naming the field. Before the schema described it, spec.drained was kept as an
// unknown field: explain knew nothing of it and any shape was accepted.
func ipPoolDrainedSchema(t *testing.T, e *env) {
	s := e.store(t)
	ctx := ctxT(t)
	rec := `{"network":"k8s-pod-network","ranges":[[{"subnet":"10.1.0.0/16"}]],"blockBits":[26],"drained":[{"subnet":"10.0.0.0/16","rangeStart":"10.0.0.1","rangeEnd":"10.0.255.254","gateway":"10.0.0.1"}]}`
	mustCreate(t, s, cluster.PoolKey("k8s-pod-network"), rec)
	kv, err := s.Get(ctx, cluster.PoolKey("k8s-pod-network"))
	if err != nil || !jsonEq(t, kv.Value, []byte(rec)) {
		t.Fatalf("default pool with spec.drained: got %s (%v), want %s", kv.Value, err, rec)
	}
	out, err := e.api.Kubectl("explain", "ippool.spec.drained")
	if err != nil || !strings.Contains(out, "taken out of the pool") || !strings.Contains(out, "subnet") {
		t.Fatalf("kubectl explain ippool.spec.drained: %v\n%s\nwant the field described, with its subnet", err, out)
	}
	for _, c := range []struct{ name, drained, want string }{
		{"not a list", `"10.0.0.0/16"`, "spec.drained"},
		{"a range without its subnet", `[{"rangeStart":"10.0.0.1"}]`, "spec.drained[0].subnet"},
		{"a range that is a string", `["10.0.0.0/16"]`, "spec.drained[0]"},
	} {
		var obj unstructured.Unstructured
		doc := `{"apiVersion":"ipledger.io/v1alpha1","kind":"IPPool","metadata":{"name":"bad"},"spec":{"network":"bad","ranges":[[{"subnet":"10.9.0.0/16"}]],"blockBits":[26],"drained":` + c.drained + `}}`
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatal(err)
		}
		_, err := e.client.Resource(ippools).Create(context.Background(), &obj, metav1.CreateOptions{})
		if err == nil {
			_ = e.client.Resource(ippools).Delete(context.Background(), "bad", metav1.DeleteOptions{})
			t.Errorf("%s: spec.drained %s accepted, want refused", c.name, c.drained)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: refused with %v, want it to name %s", c.name, err, c.want)
		}
	}
}
