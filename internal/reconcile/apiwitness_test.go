package reconcile

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// cutProxy forwards TCP connections to target until cut: then it closes every
// connection it carries and each new one at once, as a host that lost its route
// to the API server would see, until restored.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]bool
}

func startProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = true, true
		p.mu.Unlock()
		go func() { io.Copy(up, c); up.Close(); c.Close() }()
		go func() { io.Copy(c, up); up.Close(); c.Close() }()
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
		p.conns = map[net.Conn]bool{}
	}
}

// untilDone writes to t's log until the test is done, then drops: the pod cache's
// goroutines may log while they stop.
type untilDone struct {
	mu     sync.Mutex
	t      *testing.T
	closed bool
}

func (w *untilDone) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(string(p))
	}
	return len(p), nil
}

func (w *untilDone) done() { w.mu.Lock(); w.closed = true; w.mu.Unlock() }

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // the reflector backs off up to 30 s between tries
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 2 minutes: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestAPIWitnessStaleWhileCut runs the reconciler with a real kube-apiserver as
// its second witness, reached through a connection the test cuts, as an agent
// whose host lost its route to the API server. While the watch is broken, pods are
// created and their sandboxes go NOTREADY (one whose namespace was not recorded,
// one still holding its address): the cache lacks them, and before, that read as
// "pod deleted from the API", so the first lease was released and the second's
// interface removed after the grace. Now nothing is released until the cache has
// listed again; then the pods are there and nothing is released either; once they
// are deleted, both go, the API server confirming it.
func TestAPIWitnessStaleWhileCut(t *testing.T) {
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	c, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(api.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := startProxy(t, u.Host)
	cfg := api.Config()
	cfg.Host = "https://" + proxy.ln.Addr().String()

	f := newFixture(t, nil)
	lw := &untilDone{t: t}
	t.Cleanup(lw.done)
	pods, err := kubenode.NewPods(cfg, "node-a", f.clk, slog.New(slog.NewTextHandler(lw, nil)))
	if err != nil {
		t.Fatal(err)
	}
	f.r.o.API = pods
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pods.Run(ctx)
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !pods.WaitSynced(sctx) {
		t.Fatal("the pod cache did not list within a minute")
	}
	f.clk.Advance(time.Minute)

	proxy.setCut(true)
	waitUntil(t, "the pod cache sees its watch broken", func() bool { return len(pods.Problems()) > 0 })
	t.Logf("doctor: %q", pods.Problems())
	if _, err := c.ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	uids := map[string]string{}
	for _, name := range []string{"unrec", "strand"} {
		p, err := c.Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[name] = string(p.UID)
	}
	f.clk.Advance(time.Second)
	if _, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("unrec"), Pod: ledger.Pod{Namespace: "default", Name: "unrec", UID: uids["unrec"]}, Ranges: ranges}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.l.Allocate(ledger.AllocateRequest{Key: key("strand"), Pod: ledger.Pod{Namespace: "default", Name: "strand", UID: uids["strand"]}, NetNS: ledger.NetNS{Path: "/ns/strand", Dev: 4, Ino: 6}, Ranges: ranges}); err != nil {
		t.Fatal(err)
	}
	f.rt.set("unrec", cri.StateNotReady)
	f.rt.set("strand", cri.StateNotReady)
	f.ns.set("/ns/strand", NSAddrPresent)

	kept := func(when string) {
		t.Helper()
		if n := f.rounds(40); n != 0 || !f.held("unrec") || !f.held("strand") || len(f.ns.reclaimed) != 0 {
			t.Fatalf("%s: released %d, reclaimed %v", when, n, f.ns.reclaimed)
		}
	}
	kept("watch broken")

	proxy.setCut(false)
	waitUntil(t, "the pod cache lists again and holds the new pods", func() bool {
		_, in, known := pods.PodSince("default", "unrec", uids["unrec"], time.Time{})
		return in && known && len(pods.Problems()) == 0
	})
	kept("watch fresh, pods Pending")

	zero := int64(0)
	for _, name := range []string{"unrec", "strand"} {
		if err := c.Pods("default").Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the pod cache sees the pods deleted", func() bool {
		_, in, known := pods.PodSince("default", "strand", uids["strand"], time.Time{})
		return !in && known
	})
	f.untilReleased("unrec", 20)
	f.untilReleased("strand", 20)
	if len(f.ns.reclaimed) != 1 || f.ns.reclaimed[0] != "/ns/strand" {
		t.Fatalf("reclaimed %v", f.ns.reclaimed)
	}
}
