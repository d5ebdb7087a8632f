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
	kubeenv "github.com/ipledger/ipledger/internal/testenv/kube"
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

// nodeWatch runs s.WatchNodeDeletions until the test ends and returns the
// channel of the names it reports, once it is known to be watching (a probe
// Node created and deleted until one is reported).
func nodeWatch(t *testing.T, e *env, s *kubeds.Store) <-chan string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan string, 100)
	done := make(chan error, 1)
	go func() { done <- s.WatchNodeDeletions(ctx, func(n string) { gone <- n }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("WatchNodeDeletions ended with %v, want context.Canceled", err)
		}
	})
	for i := 0; ; i++ {
		if i == 60 {
			t.Fatal("WatchNodeDeletions reported no deleted probe Node in a minute")
		}
		probe := fmt.Sprintf("probe-%d", i)
		e.createNode(t, probe)
		time.Sleep(200 * time.Millisecond)
		e.deleteNode(t, probe)
		select {
		case n := <-gone:
			if n != probe {
				t.Fatalf("reported %q, want %q", n, probe)
			}
			return gone
		case <-time.After(time.Second):
		}
	}
}

func wantGone(t *testing.T, gone <-chan string, want string) {
	t.Helper()
	select {
	case n := <-gone:
		if n != want {
			t.Fatalf("reported Node %q gone, want %q", n, want)
		}
	case <-time.After(time.Minute):
		t.Fatalf("Node %q not reported gone within a minute", want)
	}
}

// TestNodeDeletionsReported: a deleted Node is reported once, also when it was
// deleted across an apiserver restart (the watch breaks; the next list shows it
// missing); a Node that still exists is never reported.
func TestNodeDeletionsReported(t *testing.T) {
	e := startEnv(t, kubeenv.APIServerOptions{})
	s := e.store(t)
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		e.createNode(t, n)
	}
	gone := nodeWatch(t, e, s)
	e.deleteNode(t, "node-a")
	wantGone(t, gone, "node-a")

	e.api.Stop()
	if err := e.api.Start(); err != nil {
		t.Fatal(err)
	}
	e.deleteNode(t, "node-b")
	wantGone(t, gone, "node-b")
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
	select {
	case n := <-gone:
		t.Fatalf("reported %q gone; node-c still exists", n)
	case <-time.After(2 * time.Second):
	}
}
