package kubenode

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// namespaceChoicesFromTheWatch: on a real kube-apiserver, a namespace's
// ipledger.io/pool is read by a GET until the namespaces are listed, then from the
// list and watch without a request per ADD, a change of the annotation included;
// a namespace the cache does not hold is asked for by a GET (and one the API
// server does not have has no choices).
func namespaceChoicesFromTheWatch(t *testing.T, srv *kubeenv.APIServer) {
	c, err := corev1client.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns, err := c.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Annotations: map[string]string{"ipledger.io/pool": "blue", "other": "x"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := NewPods(srv.Config(), "node-a", nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var gets atomic.Int64
	get := p.getNS
	p.getNS = func(ctx context.Context, name string) (*corev1.Namespace, error) {
		gets.Add(1)
		return get(ctx, name)
	}
	want := func(ns, pool string, wantGets int64) {
		t.Helper()
		got, err := p.NamespaceChoices(ctx, ns)
		if err != nil || got["ipledger.io/pool"] != pool || len(got) > 1 || gets.Load() != wantGets {
			t.Fatalf("namespace %s: %v %v after %d GETs, want pool %q after %d", ns, got, err, gets.Load(), pool, wantGets)
		}
	}
	want("team-b", "blue", 1) // not listed yet: the API server is asked
	p.Run(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), p.ns.inf.HasSynced) {
		t.Fatal("namespaces never listed")
	}
	want("team-b", "blue", 1)
	want("team-b", "blue", 1)
	ns.Annotations["ipledger.io/pool"] = "green"
	if _, err := c.Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for { // the watch brings the change; no GET meanwhile
		got, err := p.NamespaceChoices(ctx, "team-b")
		if err != nil {
			t.Fatal(err)
		}
		if got["ipledger.io/pool"] == "green" {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the annotation's change never reached the cache")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if gets.Load() != 1 {
		t.Fatalf("%d GETs while the watch serves, want none after the first", gets.Load())
	}
	want("nowhere", "", 2) // not in the cache: asked, and absent
}

// NamespaceChoicesFromTheWatch is namespaceChoicesFromTheWatch for
// TestOnOneAPIServer (the external test package), which shares its apiserver.
var NamespaceChoicesFromTheWatch = namespaceChoicesFromTheWatch
