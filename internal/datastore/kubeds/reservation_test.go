package kubeds_test

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/ipledger/ipledger/internal/cluster"
)

// An IPReservation an operator applies (kubectl apply: no key annotation) is the
// record "reservations/<name>": Get, List and Watch read it, and the agents parse
// its addresses of both families and its reason. The CRD's schema refuses a spec
// without addresses, naming the field.
func operatorIPReservation(t *testing.T, e *env) {
	s := e.store(t)
	ctx := ctxT(t)
	const manifest = `
apiVersion: ipledger.io/v1alpha1
kind: IPReservation
metadata:
  name: gateways
spec:
  addresses: [10.244.1.2, 10.244.1.240/28, "fd00:10:244::/120"]
  reason: routers of rack 4
`
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(manifest), &obj.Object); err != nil {
		t.Fatal(err)
	}
	kvs, rev0, err := s.List(ctx, cluster.ReservationsPrefix)
	if err != nil || len(kvs) != 0 {
		t.Fatalf("list before: %v %v", kvs, err)
	}
	w, err := s.Watch(ctx, cluster.ReservationsPrefix, rev0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Resource(ipresvs).Create(context.Background(), &obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.Resource(ipresvs).Delete(context.Background(), "gateways", metav1.DeleteOptions{})
	})
	kv, err := s.Get(ctx, cluster.ReservationKey("gateways"))
	if err != nil {
		t.Fatalf("get reservations/gateways: %v", err)
	}
	r, err := cluster.ParseReservation("gateways", kv.Value)
	want := []netip.Prefix{netip.MustParsePrefix("10.244.1.2/32"), netip.MustParsePrefix("10.244.1.240/28"), netip.MustParsePrefix("fd00:10:244::/120")}
	if err != nil || !slices.Equal(r.Prefixes, want) || r.Reason != "routers of rack 4" {
		t.Fatalf("IPReservation gateways read as %+v (%v) from %s", r, err, kv.Value)
	}
	if ev := <-w.Events(); ev.KV.Key != "reservations/gateways" || ev.KV.Revision != kv.Revision {
		t.Fatalf("watch: %+v (%v), want reservations/gateways created", ev, w.Err())
	}
	kvs, _, err = s.List(ctx, cluster.ReservationsPrefix)
	if err != nil || len(kvs) != 1 || kvs[0].Key != "reservations/gateways" || kvs[0].Revision != kv.Revision {
		t.Fatalf("list reservations/: %+v %v, want reservations/gateways", kvs, err)
	}
	bad := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "ipledger.io/v1alpha1", "kind": "IPReservation",
		"metadata": map[string]any{"name": "empty"}, "spec": map[string]any{"reason": "forgot the addresses"}}}
	_, err = e.client.Resource(ipresvs).Create(context.Background(), bad, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "spec.addresses") {
		t.Fatalf("an IPReservation without spec.addresses: %v, want refused naming spec.addresses", err)
	}
}
