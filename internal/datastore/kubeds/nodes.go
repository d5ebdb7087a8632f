package kubeds

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
)

var nodeGVR = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}

// NodeRetry bounds the wait between two attempts of WatchNodes to list
// the Nodes again after an error (it starts at a second and doubles).
const NodeRetry = 30 * time.Second

// WatchNodes calls gone with the name of every Node object it has seen that is
// then deleted, once per deletion, and back with the name of every Node that
// appears after its first list (created, or created again after a deletion), until
// ctx ends (it returns ctx's error then). A Node it never saw is never reported
// gone: an agent whose host is no Node (a test, a VM outside the cluster), or a
// Node deleted before the call, is not taken for a dead node. back lets a caller
// forget a deletion when the Node is registered again under its name (a kubelet
// re-registers the Node it runs for). It reads object metadata only (the metadata
// client: no Node status crosses the wire), lists the Nodes, watches from the
// list's revision, and after a broken stream lists again: a Node in the last list
// and missing from the new one was deleted meanwhile and is reported, one missing
// from the last list and in the new one is reported back. While the apiserver is
// unreachable it retries (1 s, doubling up to NodeRetry); nothing is reported on an
// error. The agent's ServiceAccount may get, list and watch Nodes
// (deploy/ipledger.yaml).
func (s *Store) WatchNodes(ctx context.Context, gone, back func(node string)) error {
	mc, err := metadata.NewForConfig(s.cfg)
	if err != nil {
		return fmt.Errorf("kubeds: metadata client: %w", err)
	}
	nodes := mc.Resource(nodeGVR)
	var known map[string]bool // nil until the first list
	backoff := time.Second
	var opened time.Duration
	for {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err := func() error {
			l, err := nodes.List(ctx, metav1.ListOptions{})
			if err != nil {
				return mapErr(ctx, "list", "nodes", err)
			}
			now := make(map[string]bool, len(l.Items))
			for _, n := range l.Items {
				now[n.Name] = true
			}
			for n := range known {
				if !now[n] {
					gone(n)
				}
			}
			if known != nil {
				for n := range now {
					if !known[n] {
						back(n)
					}
				}
			}
			known = now
			backoff = time.Second
			opened = s.clock.Mono()
			w, err := nodes.Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion, AllowWatchBookmarks: true})
			if err != nil {
				return mapErr(ctx, "watch", "nodes", err)
			}
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return ctx.Err()
				case ev, ok := <-w.ResultChan():
					if !ok {
						return nil // the stream ended: list again
					}
					m, isMeta := ev.Object.(*metav1.PartialObjectMetadata)
					switch {
					case ev.Type == watch.Error:
						return fmt.Errorf("kubeds: watch nodes: %v", ev.Object)
					case !isMeta:
					case ev.Type == watch.Added || ev.Type == watch.Modified:
						if !known[m.Name] {
							known[m.Name] = true
							back(m.Name)
						}
					case ev.Type == watch.Deleted:
						if known[m.Name] {
							delete(known, m.Name)
							gone(m.Name)
						}
					}
				}
			}
		}()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// An error (unreachable, forbidden until the RBAC is applied, a
		// compacted revision) or a stream that ended at once: wait, longer each
		// time; a stream that ran a while: list again now.
		if err == nil && s.clock.Mono()-opened >= minStreamLife {
			continue
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		backoff = min(backoff*2, NodeRetry)
	}
}
