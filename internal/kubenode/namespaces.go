package kubenode

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// nsCache is the list and watch of the cluster's Namespaces, each kept as its
// address-choice annotations only: the ipledger.io/pool of a namespace's pods,
// read at every ADD without a request to the API server. It answers only while
// it can vouch for what it holds: after its first list, and not while its watch
// has failed since the last list or event (the resourceVersion has not moved
// since the failure); a namespace it does not hold is not "none" (it may be new):
// the caller asks the API server then.
type nsCache struct {
	inf cache.SharedIndexInformer

	mu       sync.Mutex
	broken   bool   // the watch failed ...
	brokenAt string // ... at this resourceVersion, and nothing was read since
}

func newNSCache(lw cache.ListerWatcher) *nsCache {
	n := &nsCache{inf: cache.NewSharedIndexInformer(lw, &corev1.Namespace{}, 0, cache.Indexers{})}
	_ = n.inf.SetTransform(func(obj any) (any, error) {
		ns, ok := obj.(*corev1.Namespace)
		if !ok {
			return obj, nil // a tombstone: kept as it is
		}
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion,
			Annotations: choicesOf(ns.Annotations)}}, nil
	})
	_ = n.inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		n.mu.Lock()
		n.broken, n.brokenAt = true, n.inf.LastSyncResourceVersion()
		n.mu.Unlock()
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	return n
}

func (n *nsCache) run(ctx context.Context) { go n.inf.RunWithContext(ctx) }

// lookup returns the choices of namespace name; ok false when the cache cannot
// vouch for them (not listed yet, watch failed since, or the namespace not held).
func (n *nsCache) lookup(name string) (map[string]string, bool) {
	if !n.inf.HasSynced() {
		return nil, false
	}
	n.mu.Lock()
	if n.broken {
		if n.inf.LastSyncResourceVersion() == n.brokenAt {
			n.mu.Unlock()
			return nil, false
		}
		n.broken = false // listed or watched again since
	}
	n.mu.Unlock()
	obj, exists, err := n.inf.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil, false
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return nil, false
	}
	return ns.Annotations, true
}
