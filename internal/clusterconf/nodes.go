package clusterconf

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/ipledger/ipledger/internal/datastore/kubeds"
)

var nodesGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// WatchNodes calls gone with the name of every Node object deleted while it runs
// (--datastore kubernetes; a no-op for etcd, which has no Node objects): the block
// manager then reclaims the node's blocks as soon as its lease has run out, without
// the quarantine. It returns once the watch is started; it ends with ctx. A Node
// deleted while no agent watched is caught by the lease's expiry and the quarantine.
func (c *Config) WatchNodes(ctx context.Context, gone func(node string), log *slog.Logger) error {
	if c.Datastore != Kubernetes {
		return nil
	}
	rc, err := kubeds.LoadConfig(c.Kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	// client-go's informer lists and watches, and lists again after a broken watch;
	// it keeps the Nodes' objects in memory (one per node), the price of seeing each
	// deletion once.
	f := dynamicinformer.NewDynamicSharedInformerFactory(client, 0)
	inf := f.ForResource(nodesGVR).Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		name := ""
		switch o := obj.(type) {
		case *unstructured.Unstructured:
			name = o.GetName()
		case cache.DeletedFinalStateUnknown:
			name = o.Key
		}
		if name != "" {
			log.Warn("Node deleted: its blocks are reclaimed once its lease runs out", "node", name)
			gone(name)
		}
	}}); err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	f.Start(ctx.Done())
	return nil
}
