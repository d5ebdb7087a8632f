package kubenode

import (
	"context"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// trackedLW is the pod cache's ListerWatcher: it makes every list a consistent
// read and dates it, tells the cache of every list or watch error, refuses a watch
// that would resume after an error (or when the cache asked for a list) with the
// API server's own "expired" answer so that the reflector lists, and can end the
// running watch the same way.
type trackedLW struct {
	inner cache.ListerWatcherWithContext
	p     *Pods

	mu        sync.Mutex
	listStart time.Time
	mustList  bool
	cur       *trackedWatch
}

var (
	_ cache.ListerWatcher            = (*trackedLW)(nil)
	_ cache.ListerWatcherWithContext = (*trackedLW)(nil)
	_ cache.ReflectorStore           = podStore{}
)

// IsWatchListSemanticsUnSupported makes the reflector list with a plain LIST, whose
// start dates the cache, rather than a watch that streams its initial state.
func (*trackedLW) IsWatchListSemanticsUnSupported() bool { return true }

func (l *trackedLW) List(o metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), o)
}

func (l *trackedLW) Watch(o metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), o)
}

// ListWithContext lists at the latest revision (a quorum read, or the watch cache
// once it has caught up with it), not at the revision the reflector last saw, so
// that the list holds every pod created before it started.
func (l *trackedLW) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	if o.Continue == "" {
		o.ResourceVersion, o.ResourceVersionMatch = "", ""
		start := l.p.clk.Now()
		l.mu.Lock()
		l.listStart = start
		l.mu.Unlock()
	}
	obj, err := l.inner.ListWithContext(ctx, o)
	if err != nil {
		l.p.failed("list: " + err.Error())
	}
	return obj, err
}

// WatchWithContext watches from the reflector's revision, unless the cache must
// list first.
func (l *trackedLW) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	l.mu.Lock()
	must := l.mustList
	l.mu.Unlock()
	if must {
		return nil, apierrors.NewResourceExpired("kubenode: the pod cache lists again before it watches")
	}
	w, err := l.inner.WatchWithContext(ctx, o)
	if err != nil {
		l.mu.Lock()
		l.mustList = true
		l.mu.Unlock()
		l.p.failed("watch: " + err.Error())
		return nil, err
	}
	tw := &trackedWatch{inner: w, out: make(chan watch.Event), stop: make(chan struct{}), relist: make(chan struct{})}
	l.mu.Lock()
	l.cur = tw
	l.mu.Unlock()
	go tw.run(l.streamFailed)
	return tw, nil
}

// streamFailed is an error event in the watch's stream.
func (l *trackedLW) streamFailed(why string) {
	l.mu.Lock()
	l.mustList = true
	l.mu.Unlock()
	l.p.failed("watch stream: " + why)
}

// relist ends the running watch so that the reflector lists again.
func (l *trackedLW) relist() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mustList = true
	if l.cur != nil {
		l.cur.endForList()
		l.cur = nil
	}
}

// listed is a list installed in the cache: when it started. Watches may resume.
func (l *trackedLW) listed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mustList = false
	return l.listStart
}

// trackedWatch forwards a watch's events, noting error events, and can end with an
// "expired" error event of its own so that the reflector lists.
type trackedWatch struct {
	inner    watch.Interface
	out      chan watch.Event
	stop     chan struct{}
	relist   chan struct{}
	stopOnce sync.Once
	listOnce sync.Once
}

func (w *trackedWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *trackedWatch) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
}

func (w *trackedWatch) endForList() {
	w.listOnce.Do(func() { close(w.relist) })
}

func (w *trackedWatch) run(failed func(string)) {
	defer close(w.out)
	defer w.inner.Stop()
	in := w.inner.ResultChan()
	for {
		select {
		case ev, ok := <-in:
			if !ok {
				return
			}
			if ev.Type == watch.Error {
				failed(apierrors.FromObject(ev.Object).Error())
			}
			select {
			case w.out <- ev:
			case <-w.stop:
				return
			}
		case <-w.relist:
			st := apierrors.NewResourceExpired("kubenode: the pod cache lists again").ErrStatus
			select {
			case w.out <- watch.Event{Type: watch.Error, Object: &st}:
			case <-w.stop:
			}
			return
		case <-w.stop:
			return
		}
	}
}

// podStore is what the reflector writes the pods into.
type podStore struct{ p *Pods }

func (s podStore) Add(obj any) error    { s.p.put(obj); return nil }
func (s podStore) Update(obj any) error { s.p.put(obj); return nil }
func (s podStore) Delete(obj any) error { s.p.remove(obj); return nil }
func (s podStore) Resync() error        { return nil }

func (s podStore) Replace(items []any, _ string) error {
	s.p.replaced(items, s.p.lw.listed())
	return nil
}
