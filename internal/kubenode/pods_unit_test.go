package kubenode

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	fcache "k8s.io/client-go/tools/cache/testing"

	"github.com/ipledger/ipledger/internal/clock/clocktest"
)

func pod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")}, Spec: corev1.PodSpec{NodeName: "node-a"}}
}

// fakeServer is a pod source the test can break (lists and watches fail) and an
// API server to GET pods from, which may hold pods the source does not list (as a
// field selector naming another node would miss them).
type fakeServer struct {
	src     *fcache.FakeControllerSource
	failing atomic.Bool
	mu      sync.Mutex
	extra   map[string]*corev1.Pod // by name: in the API server, not listed
	getErr  error
}

var errDown = errors.New("the API server does not answer")

func (s *fakeServer) lw() *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(_ context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if s.failing.Load() {
				return nil, errDown
			}
			return s.src.List(o)
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if s.failing.Load() {
				return nil, errDown
			}
			return s.src.Watch(o)
		},
	}
}

func (s *fakeServer) get(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.getErr != nil {
		return nil, s.getErr
	}
	if p, ok := s.extra[name]; ok {
		return p, nil
	}
	l, _ := s.src.List(metav1.ListOptions{})
	for _, it := range l.(*corev1.List).Items {
		if p, ok := it.Object.(*corev1.Pod); ok && p.Namespace == namespace && p.Name == name {
			return p, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, name)
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startPods(t *testing.T, s *fakeServer, clk *clocktest.Clock) *Pods {
	t.Helper()
	p := newPods(s.lw(), s.get, "node-a", clk, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p.Run(ctx)
	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	defer scancel()
	if !p.WaitSynced(sctx) {
		t.Fatal("the pod cache did not list within 30s")
	}
	return p
}

// TestPodsBrokenWatch: after the watch breaks, a pod created meanwhile is not
// "absent" (the cache cannot tell), for any lease; once the cache has listed
// again it is there. Before, the cache answered "not in the API" for it.
func TestPodsBrokenWatch(t *testing.T) {
	s := &fakeServer{src: fcache.NewFakeControllerSource()}
	s.src.Add(pod("a"))
	clk := clocktest.New()
	p := startPods(t, s, clk)
	if _, in, known := p.Pod("default", "a", "a-uid"); !in || !known {
		t.Fatalf("pod a: in %v known %v after the first list", in, known)
	}
	if _, in, known := p.Pod("default", "gone", "gone-uid"); in || !known {
		t.Fatalf("a pod never listed: in %v known %v, want known absent", in, known)
	}

	s.failing.Store(true)
	s.src.ResetWatch() // the watch ends; watching again fails
	waitFor(t, "the cache reports its watch broken", func() bool { return len(p.Problems()) > 0 })
	if pr := p.Problems(); !strings.Contains(pr[0], "pod watch of node node-a (spec.nodeName=node-a) broken since") {
		t.Fatalf("problems %q", pr)
	}
	clk.Advance(time.Minute)
	s.src.Add(pod("b")) // created while the watch is broken
	clk.Advance(time.Second)
	created := clk.Now() // its sandbox's lease
	for _, since := range []time.Time{{}, created} {
		if _, in, known := p.PodSince("default", "b", "b-uid", since); known {
			t.Fatalf("pod b created during the outage: in %v known %v (since %v), want unknown", in, known, since)
		}
	}
	if _, in, known := p.Pod("default", "a", "a-uid"); !in || !known {
		t.Fatal("a pod in the cache is still an answer")
	}

	clk.Advance(time.Second)
	s.failing.Store(false)
	waitFor(t, "pod b in the cache after it lists again", func() bool {
		_, in, known := p.PodSince("default", "b", "b-uid", created)
		return in && known
	})
	if pr := p.Problems(); len(pr) != 0 {
		t.Fatalf("problems %q after the list", pr)
	}
}

// TestPodsAbsentSinceLease: a pod's absence counts only when the cache listed
// after the lease was created; when it did not, the cache lists again, and then
// answers. A watch that missed a pod (its event lost) is caught by that list.
func TestPodsAbsentSinceLease(t *testing.T) {
	s := &fakeServer{src: fcache.NewFakeControllerSource()}
	clk := clocktest.New()
	p := startPods(t, s, clk)
	clk.Advance(time.Minute)
	s.src.AddDropWatch(pod("c")) // the watch never delivers it
	clk.Advance(time.Second)
	created := clk.Now()
	if _, in, known := p.PodSince("default", "c", "c-uid", created); known {
		t.Fatalf("pod c absent from a cache listed before its lease: in %v, known; want unknown", in)
	}
	clk.Advance(time.Second)
	waitFor(t, "pod c in the cache after the list its question asked for", func() bool {
		_, in, known := p.PodSince("default", "c", "c-uid", created)
		return in && known
	})
	// deleted, and the cache listed after the lease: an answer
	s.src.Delete(pod("c"))
	waitFor(t, "pod c absent, known", func() bool {
		_, in, known := p.PodSince("default", "c", "c-uid", created)
		return !in && known
	})
}

// TestPodsBlind: a READY sandbox whose pod the API server has and the cache lacks
// (the field selector names another node) makes the cache blind: no absence is an
// answer, and doctor's problems name the selector and the pod. A list that holds
// the pod ends it. A READY sandbox whose pod the API server deleted changes nothing.
func TestPodsBlind(t *testing.T) {
	s := &fakeServer{src: fcache.NewFakeControllerSource(), extra: map[string]*corev1.Pod{}}
	x := pod("x")
	x.Spec.NodeName = "worker-1"
	s.extra["x"] = x
	clk := clocktest.New()
	p := startPods(t, s, clk)
	ctx := context.Background()

	p.ReadySandbox(ctx, "default", "forced", "forced-uid") // deleted with --grace-period=0
	if pr := p.Problems(); len(pr) != 0 {
		t.Fatalf("problems %q for a pod the API server deleted", pr)
	}
	if _, _, known := p.Pod("default", "other", "other-uid"); !known {
		t.Fatal("absence not an answer though nothing is wrong")
	}

	clk.Advance(RelistEvery)
	p.ReadySandbox(ctx, "default", "x", "x-uid")
	pr := p.Problems()
	want := `pod watch blind: READY sandbox default/x (x-uid) not in the cache listed with spec.nodeName=node-a (the API binds it to "worker-1"); is --node-name the kubelet's Node name?`
	if len(pr) != 1 || pr[0] != want {
		t.Fatalf("problems %q, want %q", pr, want)
	}
	if _, _, known := p.Pod("default", "other", "other-uid"); known {
		t.Fatal("a blind cache answered an absence")
	}

	s.src.AddDropWatch(x) // now listed
	s.mu.Lock()
	delete(s.extra, "x")
	s.mu.Unlock()
	clk.Advance(RelistEvery)
	p.Pod("default", "other", "other-uid") // asks for a list
	waitFor(t, "the cache sees again after a list holding x", func() bool { return len(p.Problems()) == 0 })
	if _, _, known := p.Pod("default", "other", "other-uid"); !known {
		t.Fatal("absence not an answer after the blind pod was listed")
	}
}

// TestPodsDeleted: Deleted asks the API server: not found, or another pod under
// the name, is deleted; the pod itself, or a static pod's mirror, is not; an error
// is no answer.
func TestPodsDeleted(t *testing.T) {
	s := &fakeServer{src: fcache.NewFakeControllerSource(), extra: map[string]*corev1.Pod{}}
	s.src.Add(pod("a"))
	m := pod("static-a")
	m.Annotations = map[string]string{mirrorAnnotation: "static-uid"}
	s.src.Add(m)
	p := newPods(s.lw(), s.get, "node-a", clocktest.New(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	for _, c := range []struct {
		name, uid string
		want      bool
	}{
		{"a", "a-uid", false},
		{"a", "", false},
		{"a", "old-uid", true},
		{"nope", "nope-uid", true},
		{"static-a", "static-uid", false},
		{"static-a", "static-a-uid", false},
	} {
		if got, err := p.Deleted(ctx, "default", c.name, c.uid); err != nil || got != c.want {
			t.Errorf("Deleted(%s, %q) = %v, %v; want %v", c.name, c.uid, got, err, c.want)
		}
	}
	s.getErr = errDown
	if got, err := p.Deleted(ctx, "default", "nope", "nope-uid"); err == nil || got {
		t.Fatalf("Deleted with the API server down = %v, %v; want an error", got, err)
	}
}
