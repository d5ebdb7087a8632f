package agent_test

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestAnnotationsOnOneAPIServer runs the tests of pod and namespace
// annotations against one real kube-apiserver, emptied before each (kubeenv's
// Empty): starting one costs about 25 s on a loaded 2-core machine.
func TestAnnotationsOnOneAPIServer(t *testing.T) {
	srv := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	t.Run("NodeMode", func(t *testing.T) { srv.Empty(t); annotatedAdds(t, srv) })
	t.Run("ClusterModePools", func(t *testing.T) { srv.Empty(t); annotatedPoolsClusterMode(t, srv) })
}

// annotatedAdds: in node mode, with the pod watch on a real kube-apiserver, a
// pod's ipledger.io/ip gets it that address, recorded as requested; each choice
// that cannot be honoured fails the ADD with an error naming the annotation and
// the fix, records the same as a Warning Event on the pod, and allocates nothing;
// a pool asked for by the namespace is refused in node mode.
func annotatedAdds(t *testing.T, srv *kubeenv.APIServer) {
	c, err := corev1client.NewForConfig(srv.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Annotations: map[string]string{"ipledger.io/pool": "blue"}}},
	} {
		if _, err := c.Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	pod := func(ns, name string, ann map[string]string) api.Pod {
		p, err := c.Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return api.Pod{Namespace: ns, Name: name, UID: string(p.UID)}
	}
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	pods, err := kubenode.NewPods(srv.Config(), "node-a", nil, ledgertest.TestLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	pods.Run(wctx)
	ev := &recordedEvents{}
	s, l := podServer(t, agent.Config{Pods: pods, Choices: pods, Events: ev})

	plain := addForPod(t, s, "plain", pod("team-a", "plain", nil))
	if plain.Why != agent.WhyDefault {
		t.Errorf("plain pod: why %q, want %q", plain.Why, agent.WhyDefault)
	}
	asked := addForPod(t, s, "asked", pod("team-a", "asked", map[string]string{"ipledger.io/ip": "10.250.0.77"}))
	if len(asked.IPs) != 1 || asked.IPs[0] != "10.250.0.77/24" || asked.Why != "requested by ipledger.io/ip" {
		t.Errorf("annotated pod got %v why %q, want 10.250.0.77/24 requested by ipledger.io/ip", asked.IPs, asked.Why)
	}
	ev.take()

	for _, tc := range []struct {
		name    string
		ns      string
		ann     map[string]string
		exclude []string
		words   []string
	}{
		{"held by another pod", "team-a", map[string]string{"ipledger.io/ip": "10.250.0.77"}, nil, []string{"ipledger.io/ip on pod team-a/", "10.250.0.77", "held by pod team-a/asked", "remove the annotation"}},
		{"outside every range", "team-a", map[string]string{"ipledger.io/ip": "10.9.9.9"}, nil, []string{"ipledger.io/ip on pod team-a/", "outside every range"}},
		{"reserved", "team-a", map[string]string{"ipledger.io/ip": "10.250.0.80"}, []string{"10.250.0.80/30"}, []string{"ipledger.io/ip on pod team-a/", "reserved"}},
		{"does not parse", "team-a", map[string]string{"ipledger.io/ip": "ten.0.0.1"}, nil, []string{"ipledger.io/ip on pod team-a/", "not an IPv4 or IPv6 address"}},
		{"pool on the pod in node mode", "team-a", map[string]string{"ipledger.io/pool": "blue"}, nil, []string{"ipledger.io/pool on pod team-a/", "node mode", "remove the annotation"}},
		{"pool on the namespace in node mode", "team-b", nil, nil, []string{"ipledger.io/pool on namespace team-b", "node mode"}},
		{"pool name that does not parse", "team-a", map[string]string{"ipledger.io/pool": "Blue!"}, nil, []string{"ipledger.io/pool on pod team-a/", "DNS label"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			p := pod(tc.ns, name, tc.ann)
			before := len(l.Leases(""))
			ps, _ := l.Pool("net")
			r := addReq(t, name)
			r.Pod, r.Exclude = p, tc.exclude
			resp := s.Handle(ctx, r)
			if resp.Error == nil || resp.Error.Code != api.CodeInvalid {
				t.Fatalf("ADD answered %+v, want an invalid-config error", resp)
			}
			for _, w := range tc.words {
				if !strings.Contains(resp.Error.Msg, w) {
					t.Errorf("error %q lacks %q", resp.Error.Msg, w)
				}
			}
			got := ev.take()
			if len(got) != 1 || got[0].name != name || got[0].typ != "Warning" || got[0].reason != agent.ReasonAddressChoiceRefused || got[0].note != resp.Error.Msg {
				t.Errorf("events %+v, want one Warning %s on the pod saying the error", got, agent.ReasonAddressChoiceRefused)
			}
			after, _ := l.Pool("net")
			if n := len(l.Leases("")); n != before || after.Allocs != ps.Allocs {
				t.Errorf("a refused ADD allocated: %d leases before, %d after; allocations %d, %d", before, n, ps.Allocs, after.Allocs)
			}
		})
	}
}
