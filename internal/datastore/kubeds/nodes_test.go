package kubeds_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/ipledger/ipledger/internal/kubenode"
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

// nodeReports is a kubenode.Subscriber that sends what it hears on channels.
type nodeReports struct{ gone, back chan string }

func (r nodeReports) NodeGone(n string) { r.gone <- n }
func (r nodeReports) NodeBack(n string) { r.back <- n }

// agentWatchesNodes checks that cfg, impersonating the agent's ServiceAccount, may
// do what the agent's Node watch (internal/kubenode) does: get, list and watch the
// Nodes, hearing of node's deletion and re-creation (cluster mode's dead-node
// reclaim), and patch node's NetworkUnavailable condition. node exists when it is
// called.
func agentWatchesNodes(t *testing.T, e *env, cfg *rest.Config, node string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := kubenode.New(cfg, node, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r := nodeReports{gone: make(chan string, 10), back: make(chan string, 10)}
	w.Subscribe(r)
	w.Run(ctx)
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !w.WaitSynced(sctx) {
		t.Fatal("the agent's Node watch did not list the Nodes within a minute")
	}
	wantReported := func(what string, ch <-chan string) {
		t.Helper()
		select {
		case n := <-ch:
			if n != node {
				t.Fatalf("reported Node %q %s, want %q", n, what, node)
			}
		case <-time.After(time.Minute):
			t.Fatalf("Node %q not reported %s within a minute", node, what)
		}
	}
	e.deleteNode(t, node)
	wantReported("gone", r.gone)
	e.createNode(t, node)
	wantReported("back", r.back)
	if err := w.SetNetworkAvailable(ctx); err != nil {
		t.Fatalf("agent sets its Node's NetworkUnavailable: %v", err)
	}
	// The informer gets by with lists alone when it may not watch (it lists
	// again after each refused watch), so the grant is asked for outright.
	for _, verb := range []string{"get", "list", "watch"} {
		out, err := e.api.Kubectl("auth", "can-i", verb, "nodes", "--as", cfg.Impersonate.UserName)
		if strings.TrimSpace(out) != "yes" {
			t.Fatalf("kubectl auth can-i %s nodes as the agent: %q, %v; want yes", verb, out, err)
		}
	}
}
