package kubeds_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

var nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

func (e *env) createNode(t *testing.T, name string) {
	t.Helper()
	n := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": name}}}
	if _, err := e.client.Resource(nodesGVR).Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func (e *env) deleteNode(t *testing.T, name string) {
	t.Helper()
	if err := e.client.Resource(nodesGVR).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node %s: %v", name, err)
	}
}

// nodeWatch runs s.WatchNodes until the test ends and returns the channels of
// the names it reports gone and back, once it is known to be watching (a probe
// Node created and deleted until one is reported gone).
func nodeWatch(t *testing.T, e *env, s *kubeds.Store) (gone, back <-chan string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	g, b := make(chan string, 100), make(chan string, 100)
	done := make(chan error, 1)
	go func() { done <- s.WatchNodes(ctx, func(n string) { g <- n }, func(n string) { b <- n }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("WatchNodes ended with %v, want context.Canceled", err)
		}
	})
	for i := 0; ; i++ {
		if i == 60 {
			t.Fatal("WatchNodes reported no deleted probe Node in a minute")
		}
		probe := fmt.Sprintf("probe-%d", i)
		e.createNode(t, probe)
		time.Sleep(200 * time.Millisecond)
		e.deleteNode(t, probe)
		var seen bool
		select {
		case n := <-g:
			if n != probe {
				t.Fatalf("reported %q gone, want %q", n, probe)
			}
			seen = true
		case <-time.After(time.Second):
		}
		// the probe is reported back if it was created after the first list; one
		// report comes before its gone (one goroutine calls both, in order)
		for len(b) > 0 {
			if n := <-b; n != probe {
				t.Fatalf("reported %q back, want %q", n, probe)
			}
		}
		if seen {
			return g, b
		}
	}
}

// want waits a minute for name on ch, reported as what.
func want(t *testing.T, what string, ch <-chan string, name string) {
	t.Helper()
	select {
	case n := <-ch:
		if n != name {
			t.Fatalf("reported Node %q %s, want %q", n, what, name)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Node %q not reported %s within a minute", name, what)
	}
}

// none checks that nothing is reported on ch for d.
func none(t *testing.T, what string, ch <-chan string, d time.Duration) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("reported Node %q %s; none may be", n, what)
	case <-time.After(d):
	}
}

// TestNodeDeletionsReported: a deleted Node is reported once, also when it was
// deleted across an apiserver restart (the watch breaks; the next list shows it
// missing); a Node that still exists is never reported. A Node created again under
// a deleted one's name is reported back, also when it came back across an
// apiserver restart; one that never went is not.
func TestNodeDeletionsReported(t *testing.T) {
	e := startEnv(t, kubeenv.APIServerOptions{})
	s := e.store(t)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		e.createNode(t, n)
	}
	gone, back := nodeWatch(t, e, s)
	e.deleteNode(t, "node-a")
	want(t, "gone", gone, "node-a")
	e.createNode(t, "node-a") // the kubelet registers its Node again
	want(t, "back", back, "node-a")

	e.api.Stop()
	if err := e.api.Start(); err != nil {
		t.Fatal(err)
	}
	e.deleteNode(t, "node-b")
	want(t, "gone", gone, "node-b")
	e.api.Stop()
	if err := e.api.Start(); err != nil {
		t.Fatal(err)
	}
	e.createNode(t, "node-b")
	want(t, "back", back, "node-b")
	e.createNode(t, "node-d")
	e.deleteNode(t, "node-d")
	// node-d may be deleted before the watcher saw it (then it is not
	// reported); nothing else may be.
	select {
	case n := <-gone:
		if n != "node-d" {
			t.Fatalf("reported %q gone; only node-d may be", n)
		}
	case <-time.After(3 * time.Second):
	}
	for len(back) > 0 {
		if n := <-back; n != "node-d" {
			t.Fatalf("reported %q back; only node-d may be", n)
		}
	}
	none(t, "gone", gone, 2*time.Second)
	if len(back) > 0 {
		t.Fatalf("reported %q back; node-c never went", <-back)
	}
}
