package kubeds_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// manifestPath is deploy/ipledger.yaml, the file users apply.
var manifestPath = filepath.Join("..", "..", "..", "deploy", "ipledger.yaml")

func manifest(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile(manifestPath)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

var (
	ipblocks = schema.GroupVersionResource{Group: kubeds.Group, Version: kubeds.Version, Resource: "ipblocks"}
	ippools  = schema.GroupVersionResource{Group: kubeds.Group, Version: kubeds.Version, Resource: "ippools"}
	records  = schema.GroupVersionResource{Group: kubeds.Group, Version: kubeds.Version, Resource: "iprecords"}
	ipresvs  = schema.GroupVersionResource{Group: kubeds.Group, Version: kubeds.Version, Resource: "ipreservations"}
	nsGVR    = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

// env is a real kube-apiserver (kubeenv's apiserver-only mode) with the CRDs of
// deploy/ipledger.yaml installed.
type env struct {
	api    *kubeenv.APIServer
	cfg    *rest.Config
	client dynamic.Interface
	nsSeq  atomic.Int64
}

func startEnv(tb testing.TB, opts kubeenv.APIServerOptions) *env {
	tb.Helper()
	t0 := time.Now()
	api := kubeenv.StartAPIServer(tb, opts)
	tb.Logf("apiserver ready in %v", time.Since(t0).Round(time.Millisecond))
	e := &env{api: api, cfg: api.Config()}
	admin := api.Config()
	admin.QPS, admin.Burst = 1000, 2000 // the test's own requests are not throttled
	var err error
	if e.client, err = dynamic.NewForConfig(admin); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	names, err := kubeds.InstallCRDs(ctx, e.cfg, manifest(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("CRDs %v Established", names)
	return e
}

// store opens a Store on an empty datastore: the records of earlier users are
// deleted (they are cluster-wide) and the node Leases go to a new namespace.
// At cleanup it audits every record object: its key annotation maps back to
// its name and resource, and its network label is there.
func (e *env) store(tb testing.TB) *kubeds.Store {
	tb.Helper()
	ctx := context.Background()
	for _, r := range []schema.GroupVersionResource{ipblocks, ippools, ipresvs, records} {
		if err := e.client.Resource(r).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			tb.Fatalf("empty %s: %v", r.Resource, err)
		}
	}
	ns := "lease-" + strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(tb.Name()))
	if len(ns) > 50 {
		ns = ns[:50]
	}
	ns = strings.Trim(ns, "-") + "-" + time.Now().Format("150405") + "-" + string(rune('a'+e.nsSeq.Add(1)%26))
	e.namespace(tb, ns)
	s, err := kubeds.New(e.cfg, kubeds.Options{Namespace: ns})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		s.Close()
		e.auditObjects(tb)
	})
	return s
}

// auditObjects checks the key mapping on every record object stored.
func (e *env) auditObjects(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, r := range []schema.GroupVersionResource{ipblocks, ippools, ipresvs, records} {
		l, err := e.client.Resource(r).List(ctx, metav1.ListOptions{})
		if err != nil {
			tb.Errorf("audit: list %s: %v", r.Resource, err)
			continue
		}
		for _, o := range l.Items {
			key, ok := o.GetAnnotations()[kubeds.AnnotationKey]
			if !ok && (r == ippools || r == ipresvs) {
				continue // an operator's named pool or reservation (kubectl apply)
			}
			if !ok {
				tb.Errorf("audit: %s %s has no key annotation", r.Resource, o.GetName())
				continue
			}
			name, res, err := kubeds.ObjectName(key)
			if err != nil || name != o.GetName() || res != r.Resource {
				tb.Errorf("audit: %s %s holds key %q, which maps to %s %s (%v)", r.Resource, o.GetName(), key, res, name, err)
			}
			if o.GetLabels()[kubeds.LabelNetwork] == "" {
				tb.Errorf("audit: %s %s has no %s label", r.Resource, o.GetName(), kubeds.LabelNetwork)
			}
		}
	}
}

// namespace creates namespace ns.
func (e *env) namespace(tb testing.TB, ns string) {
	tb.Helper()
	nsObj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	if _, err := e.client.Resource(nsGVR).Create(context.Background(), nsObj, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("namespace %s: %v", ns, err)
	}
}
