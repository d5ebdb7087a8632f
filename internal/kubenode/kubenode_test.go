package kubenode_test

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

func logger(t *testing.T) *slog.Logger { return slog.New(slog.NewTextHandler(tlog{t}, nil)) }

// subs records what the watch reports.
type subs struct {
	mu         sync.Mutex
	gone, back []string
}

func (s *subs) NodeGone(n string) { s.mu.Lock(); s.gone = append(s.gone, n); s.mu.Unlock() }
func (s *subs) NodeBack(n string) { s.mu.Lock(); s.back = append(s.back, n); s.mu.Unlock() }
func (s *subs) get() (gone, back []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.gone), slices.Clone(s.back)
}

func createNode(t *testing.T, c corev1client.CoreV1Interface, name string, podCIDRs []string, ip string) {
	t.Helper()
	ctx := context.Background()
	n, err := c.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: podCIDRs, PodCIDR: first(podCIDRs)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: ip}}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	if _, err := c.Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 30s: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodeWatch runs the Node watch against a real kube-apiserver: this node's podCIDRs
// (and the errors that name the Node, the field and the fix), every node's pod CIDRs
// and InternalIPs, deletions and re-creations, and NetworkUnavailable set false
// without touching the kubelet's conditions.
func nodeWatch(t *testing.T, api *kubeenv.APIServer) {
	c, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	createNode(t, c, "node-a", []string{"10.244.1.0/24", "fd00:244:1::/64"}, "10.250.0.11")
	createNode(t, c, "node-b", []string{"10.244.2.0/24"}, "10.250.0.12")
	createNode(t, c, "node-c", nil, "10.250.0.13")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	start := func(self string) (*kubenode.Watch, *subs) {
		w, err := kubenode.New(api.Config(), self, logger(t))
		if err != nil {
			t.Fatal(err)
		}
		s := &subs{}
		w.Subscribe(s)
		w.Run(ctx)
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if !w.WaitSynced(wctx) {
			t.Fatal("the watch did not list the Nodes within 30s")
		}
		return w, s
	}
	a, subsA := start("node-a")
	got, err := a.PodCIDRs()
	want := []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:244:1::/64")}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("PodCIDRs: %v, %v; want %v", got, err, want)
	}
	nodes := a.Nodes()
	if len(nodes) != 3 || nodes[1].Name != "node-b" || !slices.Equal(nodes[1].Addrs, []netip.Addr{netip.MustParseAddr("10.250.0.12")}) ||
		!slices.Equal(nodes[1].PodCIDRs, []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}) {
		t.Fatalf("Nodes: %+v", nodes)
	}

	for _, tc := range []struct {
		self string
		want error
	}{{"node-c", kubenode.ErrNoPodCIDR}, {"node-zz", kubenode.ErrNoNode}} {
		w, _ := start(tc.self)
		if _, err := w.PodCIDRs(); !errors.Is(err, tc.want) {
			t.Fatalf("%s: PodCIDRs: %v, want %v", tc.self, err, tc.want)
		} else {
			t.Logf("%s: %v", tc.self, err)
		}
	}

	// a podCIDR given later is seen, with a change notification
	drain(a.Changed())
	n, err := c.Nodes().Get(ctx, "node-c", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.3.0/24", []string{"10.244.3.0/24"}
	if _, err := c.Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitChanged(t, a)
	eventually(t, "node-c's podCIDR seen", func() bool {
		for _, n := range a.Nodes() {
			if n.Name == "node-c" && len(n.PodCIDRs) == 1 {
				return true
			}
		}
		return false
	})

	// deleted, then registered again
	if err := c.Nodes().Delete(ctx, "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node-b reported gone", func() bool { g, _ := subsA.get(); return slices.Equal(g, []string{"node-b"}) })
	if len(a.Nodes()) != 2 {
		t.Fatalf("after the deletion: %+v", a.Nodes())
	}
	createNode(t, c, "node-b", []string{"10.244.2.0/24"}, "10.250.0.12")
	eventually(t, "node-b reported back", func() bool { _, b := subsA.get(); return slices.Equal(b, []string{"node-b"}) })

	// NetworkUnavailable=False, the kubelet's Ready condition kept
	if a.NetworkAvailable() {
		t.Fatal("NetworkAvailable before the condition was set")
	}
	if err := a.SetNetworkAvailable(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NetworkAvailable after SetNetworkAvailable", a.NetworkAvailable)
	n, err = c.Nodes().Get(ctx, "node-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var netOK, ready bool
	for _, cond := range n.Status.Conditions {
		switch cond.Type {
		case corev1.NodeNetworkUnavailable:
			netOK = cond.Status == corev1.ConditionFalse && cond.Reason == kubenode.ReasonRoutesReady
		case corev1.NodeReady:
			ready = cond.Reason == "KubeletNotReady"
		}
	}
	if !netOK || !ready {
		t.Fatalf("conditions after SetNetworkAvailable: %+v", n.Status.Conditions)
	}

	// node-a's Node created again: not available until the condition is set again
	if err := c.Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NetworkAvailable false after the deletion", func() bool { return !a.NetworkAvailable() })
	createNode(t, c, "node-a", []string{"10.244.1.0/24"}, "10.250.0.11")
	eventually(t, "node-a back", func() bool { _, err := a.PodCIDRs(); return err == nil })
	if a.NetworkAvailable() {
		t.Fatal("NetworkAvailable on a Node created again without the condition")
	}
	if err := a.SetNetworkAvailable(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, "NetworkAvailable on the Node created again", a.NetworkAvailable)
}

func drain(c <-chan struct{}) {
	for {
		select {
		case <-c:
		default:
			return
		}
	}
}

func waitChanged(t *testing.T, w *kubenode.Watch) {
	t.Helper()
	select {
	case <-w.Changed():
	case <-time.After(30 * time.Second):
		t.Fatal("no change notification within 30s")
	}
}
