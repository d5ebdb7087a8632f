package kubenode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"
)

// reports is a Subscriber that sends what it hears on channels.
type reports struct{ gone, back chan string }

func (r reports) NodeGone(n string) { r.gone <- n }
func (r reports) NodeBack(n string) { r.back <- n }

func node(name string) *corev1.Node { return nodeUID(name, types.UID(name+"-1")) }

func nodeUID(name string, uid types.UID) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}}
}

// got waits for name on ch.
func got(t *testing.T, what string, ch <-chan string, name string) {
	t.Helper()
	select {
	case n := <-ch:
		if n != name {
			t.Fatalf("reported Node %q %s, want %q", n, what, name)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("Node %q not reported %s within 30s", name, what)
	}
}

// quiet checks that nothing is reported for d.
func quiet(t *testing.T, r reports, d time.Duration) {
	t.Helper()
	select {
	case n := <-r.gone:
		t.Fatalf("reported Node %q gone; none may be", n)
	case n := <-r.back:
		t.Fatalf("reported Node %q back; none may be", n)
	case <-time.After(d):
	}
}

// TestRelistReports drives the informer from a fake source that can drop watch
// events and break the watch, so that the informer lists again (the watch's
// revision is gone) and learns of changes from the list alone: a Node missing from
// it comes as a DeletedFinalStateUnknown and is reported gone, a new one is
// reported back, one deleted and created again meanwhile is not reported, and
// nothing is reported while the list fails.
func TestRelistReports(t *testing.T) {
	src := fcache.NewFakeControllerSource()
	for _, n := range []string{"node-a", "node-b", "node-c", "node-e"} {
		src.Add(node(n))
	}
	var failing atomic.Bool
	errDown := errors.New("the API server does not answer")
	lw := &cache.ListWatch{
		ListWithContextFunc: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if failing.Load() {
				return nil, errDown
			}
			return src.List(o)
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if failing.Load() {
				return nil, errDown
			}
			return src.Watch(o)
		},
	}
	w, err := newWatch(nil, lw, "node-a", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r := reports{gone: make(chan string, 10), back: make(chan string, 10)}
	w.Subscribe(r)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.Run(ctx)
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !w.WaitSynced(sctx) {
		t.Fatal("the watch did not list the Nodes within 30s")
	}
	quiet(t, r, 500*time.Millisecond) // the first list reports nothing

	// watch events
	src.Delete(node("node-b"))
	got(t, "gone", r.gone, "node-b")
	src.Add(node("node-b"))
	got(t, "back", r.back, "node-b")

	// changes the watch does not deliver; then the watch breaks and its revision
	// is gone: the informer lists again
	src.DeleteDropWatch(node("node-c"))
	src.AddDropWatch(node("node-d"))
	src.DeleteDropWatch(node("node-a"))
	src.AddDropWatch(nodeUID("node-a", "node-a-2"))
	src.ResetWatch()
	got(t, "gone", r.gone, "node-c")
	got(t, "back", r.back, "node-d")
	quiet(t, r, 500*time.Millisecond) // node-a: deleted and back, no net change

	// the list fails for a while: nothing is reported; a deletion meanwhile is
	// reported once it answers again
	failing.Store(true)
	src.DeleteDropWatch(node("node-e"))
	src.ResetWatch()
	quiet(t, r, 2*time.Second)
	failing.Store(false)
	got(t, "gone", r.gone, "node-e")
	quiet(t, r, 500*time.Millisecond)
}

// TestSyncedWhenTheHandlerHasEveryNode: the watch is synced only once its handler
// has taken every Node of the first list, not when the informer's cache has them:
// with the handler held, Synced stays false (a second after the informer's cache
// synced; the old code turned true within its 100 ms poll), and once released,
// Nodes answers every Node the moment Synced is true.
func TestSyncedWhenTheHandlerHasEveryNode(t *testing.T) {
	src := fcache.NewFakeControllerSource()
	const n = 50
	for i := range n {
		src.Add(node(fmt.Sprintf("node-%02d", i)))
	}
	w, err := newWatch(nil, src, "node-00", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	w.beforeEvent = func() { <-release }
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	w.Run(ctx)
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !cache.WaitForCacheSync(sctx.Done(), w.informer.HasSynced) {
		t.Fatal("the informer did not list the Nodes within 30s")
	}
	held, hcancel := context.WithTimeout(ctx, time.Second)
	defer hcancel()
	if w.WaitSynced(held) {
		t.Errorf("synced with the handler held: Nodes answers %d of %d", len(w.Nodes()), n)
	}
	close(release)
	if !w.WaitSynced(sctx) {
		t.Fatal("not synced within 30s after the handler was released")
	}
	if got := len(w.Nodes()); got != n {
		t.Errorf("synced with %d Nodes known, want %d", got, n)
	}
}
