package kubenode_test

import (
	"context"
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

// want waits a minute for name on ch, reported as what.
// reportWithin bounds the wait for a report. After three apiserver restarts
// in a row the informer's watch backs off (client-go's reflector, up to 30 s
// between tries, with jitter) before its relist finds a Node deleted behind
// the apiserver's back.
const reportWithin = 2 * time.Minute

func want(t *testing.T, what string, ch <-chan string, name string) {
	t.Helper()
	select {
	case n := <-ch:
		if n != name {
			t.Fatalf("reported Node %q %s, want %q", n, what, name)
		}
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
	w, err := kubenode.New(api.Config(), "node-c", logger(t))
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

	if err := api.Restart(); err != nil {
		t.Fatal(err)
	}
	deleteNode(t, c, "node-b")
	want(t, "gone", r.gone, "node-b")
	if err := api.Restart(); err != nil {
		t.Fatal(err)
	}
	addNode(t, c, "node-b")
	want(t, "back", r.back, "node-b")

	// node-e deleted while the apiserver is down
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
	want(t, "gone", r.gone, "node-e")

	addNode(t, c, "node-d")
	want(t, "back", r.back, "node-d")
	deleteNode(t, c, "node-d")
	want(t, "gone", r.gone, "node-d")

	none(t, "gone", r.gone, 2*time.Second)
	none(t, "back", r.back, 0) // node-c never went
}
