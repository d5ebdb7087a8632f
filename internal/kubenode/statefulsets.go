package kubenode

import (
	"context"
	"log/slog"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// StatefulSets is a cache of the cluster's StatefulSets (apps/v1, list and
// watch): their names and spec.replicas, for the retention of sticky addresses.
// Its word that a StatefulSet is absent, or has fewer replicas, is an answer only
// once it has listed since it started and while no list or watch error has come
// since its last list (Replicas' known).
type StatefulSets struct {
	log *slog.Logger
	inf cache.SharedIndexInformer

	changed chan struct{} // one pending notice of a change

	mu     sync.Mutex
	listed bool   // a list succeeded since start
	broken string // the error since the last list, "" when none
}

// NewStatefulSets returns the cache of the cluster's StatefulSets through cfg;
// Run starts it.
func NewStatefulSets(cfg *rest.Config, log *slog.Logger) (*StatefulSets, error) {
	c, err := restClient(cfg, appsV1)
	if err != nil {
		return nil, err
	}
	inner := cache.NewListWatchFromClient(c, "statefulsets", metav1.NamespaceAll, fields.Everything())
	return newStatefulSets(inner, log), nil
}

func newStatefulSets(inner cache.ListerWatcher, log *slog.Logger) *StatefulSets {
	s := &StatefulSets{log: log, changed: make(chan struct{}, 1)}
	s.inf = cache.NewSharedIndexInformer(&stsLW{inner: cache.ToListerWatcherWithContext(inner), s: s}, &appsv1.StatefulSet{}, 0, cache.Indexers{})
	notify := func(any) {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	_, _ = s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, o any) { notify(o) }, DeleteFunc: notify})
	_ = s.inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.broken == "" {
			s.log.Warn("StatefulSet watch broken; no sticky address is released until it lists again", "err", err)
		}
		s.broken = err.Error()
	})
	return s
}

// stsLW is the StatefulSet cache's ListerWatcher: it records every list's
// outcome (the cache vouches for absences only after a list since its last
// error).
type stsLW struct {
	inner cache.ListerWatcherWithContext
	s     *StatefulSets
}

var (
	_ cache.ListerWatcher            = (*stsLW)(nil)
	_ cache.ListerWatcherWithContext = (*stsLW)(nil)
)

// IsWatchListSemanticsUnSupported makes the reflector list with a plain LIST,
// which the cache records.
func (*stsLW) IsWatchListSemanticsUnSupported() bool { return true }

func (l *stsLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), o)
}

func (l *stsLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), o)
}

func (l *stsLW) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	obj, err := l.inner.ListWithContext(ctx, o)
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	if err != nil {
		l.s.broken = err.Error()
		return nil, err
	}
	if o.Continue == "" {
		l.s.listed, l.s.broken = true, ""
	}
	return obj, nil
}

func (l *stsLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return l.inner.WatchWithContext(ctx, o)
}

// Changed receives a value after StatefulSets were added, changed or deleted
// (several changes may make one).
func (s *StatefulSets) Changed() <-chan struct{} { return s.changed }

// Run lists and watches until ctx ends; it returns at once.
func (s *StatefulSets) Run(ctx context.Context) { go s.inf.RunWithContext(ctx) }

// Ordinals returns the StatefulSet's spec.ordinals.start (0 when unset) and
// spec.replicas (1 when unset, as the API's defaults) and whether it exists;
// known is false while the cache cannot vouch for an absence (it has not listed
// since start, or an error came since).
func (s *StatefulSets) Ordinals(namespace, name string) (start, replicas int32, exists, known bool) {
	s.mu.Lock()
	known = s.listed && s.broken == "" && s.inf.HasSynced()
	s.mu.Unlock()
	obj, ok, err := s.inf.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !ok {
		return 0, 0, false, known && err == nil
	}
	sts, ok := obj.(*appsv1.StatefulSet)
	if !ok {
		return 0, 0, false, false
	}
	replicas = 1
	if sts.Spec.Replicas != nil {
		replicas = *sts.Spec.Replicas
	}
	if sts.Spec.Ordinals != nil {
		start = sts.Spec.Ordinals.Start
	}
	return start, replicas, true, true
}
