package kubenode_test

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// reports is a Subscriber that sends what it hears on channels.
type reports struct{ gone, back chan string }

func (r reports) NodeGone(n string) { r.gone <- n }
func (r reports) NodeBack(n string) { r.back <- n }

// reportWithin bounds the wait for a report. The watch reaches the apiserver through
// an outage gate (below): while the apiserver restarts, its reconnections wait
// instead of being refused, so client-go's reflector never backs off for refused
// connections (800 ms doubling to 30 s, with jitter); only the relist after each
// restart waits its turn (0.8, 1.6, 3.2 s, at most twice that with jitter). The bound
// is for a busy machine, not a measure of speed.
const reportWithin = time.Minute

// outage holds the watch's new connections while the apiserver is being restarted,
// as a load balancer in front of several apiservers would hold or redirect them, so
// that a restart tests what the watch sees of the apiserver (its connection broken,
// its resource version too old, objects gone behind it) and not client-go's backoff.
type outage struct {
	mu   sync.Mutex
	open chan struct{} // closed while connections may pass
}

func newOutage() *outage {
	o := &outage{open: make(chan struct{})}
	close(o.open)
	return o
}

// begin holds new connections until end.
func (o *outage) begin() {
	o.mu.Lock()
	o.open = make(chan struct{})
	o.mu.Unlock()
}

// end lets the held connections and new ones through.
func (o *outage) end() {
	o.mu.Lock()
	close(o.open)
	o.mu.Unlock()
}

// dial is a rest.Config Dial: it waits for the outage to end, then dials.
func (o *outage) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	o.mu.Lock()
	open := o.open
	o.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// restart restarts the apiserver while the watch's connections are held.
func (o *outage) restart(t *testing.T, api *kubeenv.APIServer) {
	t.Helper()
	o.begin()
	defer o.end()
	if err := api.Restart(); err != nil {
		t.Fatal(err)
	}
}

func want(t *testing.T, what string, ch <-chan string, name string) {
	t.Helper()
	t0 := time.Now()
	select {
	case n := <-ch:
		if n != name {
			t.Fatalf("reported Node %q %s, want %q", n, what, name)
		}
		t.Logf("Node %q reported %s after %v", name, what, time.Since(t0).Round(time.Millisecond))
	case <-time.After(reportWithin):
		t.Fatalf("Node %q not reported %s within %v", name, what, reportWithin)
	}
}

// none checks that nothing is reported on ch for d.
func none(t *testing.T, what string, ch <-chan string, d time.Duration) {
	t.Helper()
	select {
	case n := <-ch:
		t.Fatalf("reported Node %q %s; none may be", n, what)
	case <-time.After(d):
	}
}

func addNode(t *testing.T, c corev1client.CoreV1Interface, name string) {
	t.Helper()
	if _, err := c.Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
}

func deleteNode(t *testing.T, c corev1client.CoreV1Interface, name string) {
	t.Helper()
	if err := c.Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node %s: %v", name, err)
	}
}

// TestNodeDeletionsReported runs the watch against a real kube-apiserver, as the
// block manager uses it. A Node deleted before the watch started is never reported
// and the Nodes of its first list are not reported back. A deleted Node is reported
// gone once, also when it was deleted across an apiserver restart and when it was
// deleted while the apiserver was down (removed from etcd behind it: only the
// watch's next list or a watch from its old revision can tell). A Node created
// again under a deleted one's name is reported back, also across an apiserver
// restart; one that never went is not.
func TestNodeDeletionsReported(t *testing.T) {
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	c, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node-a", "node-b", "node-c", "node-e", "node-old"} {
		addNode(t, c, n)
	}
	deleteNode(t, c, "node-old")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gate := newOutage()
	wcfg := api.Config()
	wcfg.Dial = gate.dial
	w, err := kubenode.New(wcfg, "node-c", logger(t))
	if err != nil {
		t.Fatal(err)
	}
	r := reports{gone: make(chan string, 100), back: make(chan string, 100)}
	w.Subscribe(r)
	w.Run(ctx)
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if !w.WaitSynced(sctx) {
		t.Fatal("the watch did not list the Nodes within a minute")
	}
	none(t, "back", r.back, time.Second)
	none(t, "gone", r.gone, 0)

	deleteNode(t, c, "node-a")
	want(t, "gone", r.gone, "node-a")
	addNode(t, c, "node-a") // the kubelet registers its Node again
	want(t, "back", r.back, "node-a")

	gate.restart(t, api)
	deleteNode(t, c, "node-b")
	want(t, "gone", r.gone, "node-b")
	gate.restart(t, api)
	addNode(t, c, "node-b")
	want(t, "back", r.back, "node-b")

	// node-e deleted while the apiserver is down
	gate.begin()
	api.Stop()
	ec, err := clientv3.New(clientv3.Config{Endpoints: []string{api.EtcdURL}, DialTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ec.Close()
	if dr, err := ec.Delete(ctx, "/registry/minions/node-e"); err != nil || dr.Deleted != 1 {
		t.Fatalf("deleting node-e in etcd: %+v, %v", dr, err)
	}
	if err := api.Start(); err != nil {
		t.Fatal(err)
	}
	gate.end()
	want(t, "gone", r.gone, "node-e")

	addNode(t, c, "node-d")
	want(t, "back", r.back, "node-d")
	deleteNode(t, c, "node-d")
	want(t, "gone", r.gone, "node-d")

	none(t, "gone", r.gone, 2*time.Second)
	none(t, "back", r.back, 0) // node-c never went
}
