package kubenode_test

import (
	"context"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	eventsv1client "k8s.io/client-go/kubernetes/typed/events/v1"

	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// createPod creates a Pod bound to node (no kubelet runs: spec.nodeName is set at
// creation, as the scheduler's binding would).
func createPod(t *testing.T, c corev1client.CoreV1Interface, ns, name, node string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	// the ServiceAccount admission needs the namespace's default account, which
	// no controller manager creates here
	if _, err := c.ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p, err := c.Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// podWatch runs the Pod watch of node-a against a real kube-apiserver: it sees
// node-a's pod and not node-b's, follows the phase the status reports, and tells a
// deleted pod gone; a pod's Event reaches the API, where `kubectl describe pod`
// finds it.
func podWatch(t *testing.T, api *kubeenv.APIServer) {
	c, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	a := createPod(t, c, "default", "pod-a", "node-a")
	b := createPod(t, c, "default", "pod-b", "node-b")

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pods, err := kubenode.NewPods(api.Config(), "node-a", nil, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, known := pods.Pod("default", "pod-a", string(a.UID)); known {
		t.Fatal("Pod answered before the watch ran")
	}
	pods.Run(ctx)
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if !pods.WaitSynced(wctx) {
		t.Fatal("the Pod watch did not list within 30s")
	}
	check := func(what, ns, name, uid, wantPhase string, wantIn bool) {
		t.Helper()
		eventually(t, what, func() bool {
			phase, in, known := pods.Pod(ns, name, uid)
			return known && in == wantIn && phase == wantPhase
		})
	}
	check("node-a's pod, by UID", "default", "pod-a", string(a.UID), "Pending", true)
	check("node-a's pod, by name", "default", "pod-a", "", "Pending", true)
	check("node-a's pod under another UID", "default", "pod-a", "other-uid", "", false)
	check("node-b's pod is not watched", "default", "pod-b", string(b.UID), "", false)

	a.Status.Phase = corev1.PodRunning
	if a, err = c.Pods("default").UpdateStatus(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("node-a's pod Running", "default", "pod-a", string(a.UID), "Running", true)

	ev, err := kubenode.NewEvents(ctx, api.Config(), "node-a", logger(t))
	if err != nil {
		t.Fatal(err)
	}
	const note = "address 10.1.2.3/24 of network net1 released: sandbox gone from the runtime"
	ev.PodEvent("default", "pod-a", string(a.UID), corev1.EventTypeNormal, "AddressReleased", "Release", note)
	ec, err := eventsv1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := ec.Events("default").List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == 1 {
			e := l.Items[0]
			if e.Type != "Normal" || e.Reason != "AddressReleased" || e.Action != "Release" || e.Note != note ||
				e.Regarding.Kind != "Pod" || e.Regarding.Name != "pod-a" || e.Regarding.UID != a.UID || e.ReportingController != kubenode.EventsController {
				t.Fatalf("Event %+v", e)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no Event of pod-a within 5s: %v, %v", l, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	core, err := c.Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod,involvedObject.name=pod-a,involvedObject.uid=" + string(a.UID)})
	if err != nil || len(core.Items) != 1 || core.Items[0].Message != note {
		t.Fatalf("core Events of pod-a: %+v, %v; want the one Event", core, err)
	}

	zero := int64(0)
	if err := c.Pods("default").Delete(ctx, "pod-a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	check("node-a's pod deleted", "default", "pod-a", string(a.UID), "", false)
	check("node-a's pod deleted, by name", "default", "pod-a", "", "", false)

	// A static pod: the kubelet (and the runtime, and CNI_ARGS) know it by its own
	// UID; the API shows a mirror pod under another UID, annotated with it.
	m, err := c.Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "static-node-a", Annotations: map[string]string{"kubernetes.io/config.mirror": "static-uid-1"}},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	check("a static pod, by its own UID", "kube-system", "static-node-a", "static-uid-1", "Pending", true)
	check("a static pod, by its mirror's UID", "kube-system", "static-node-a", string(m.UID), "Pending", true)
	if err := c.Pods("kube-system").Delete(ctx, "static-node-a", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	check("a static pod's mirror deleted", "kube-system", "static-node-a", "static-uid-1", "", false)
}

// podChoices: the agent reads a pod's ipledger.io annotations from the watch,
// and from a GET when the watch does not hold the pod (a pod of another node here,
// standing for one bound a moment ago), and a namespace's from a GET, on a real
// kube-apiserver; other annotations are not kept.
func podChoices(t *testing.T, api *kubeenv.APIServer) {
	c, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b",
		Annotations: map[string]string{"ipledger.io/pool": "blue", "other": "x"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	annotate := func(p *corev1.Pod) {
		p.Annotations = map[string]string{"ipledger.io/ip": "10.9.0.7", "other": "x"}
		if _, err := c.Pods(p.Namespace).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	a := createPod(t, c, "team-b", "pod-a", "node-a")
	annotate(a)
	b := createPod(t, c, "team-b", "pod-b", "node-b")
	annotate(b)
	cctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	pods, err := kubenode.NewPods(api.Config(), "node-a", nil, logger(t))
	if err != nil {
		t.Fatal(err)
	}
	pods.Run(cctx)
	if !pods.WaitSynced(cctx) {
		t.Fatal("not synced")
	}
	want := map[string]string{"ipledger.io/ip": "10.9.0.7"}
	for _, p := range []*corev1.Pod{a, b} {
		got, err := pods.Choices(ctx, p.Namespace, p.Name, string(p.UID))
		if err != nil || !maps.Equal(got, want) {
			t.Errorf("Choices(%s) = %v, %v; want %v", p.Name, got, err, want)
		}
	}
	if got, err := pods.Choices(ctx, "team-b", "nobody", ""); err != nil || got != nil {
		t.Errorf("Choices of a pod the API does not have = %v, %v; want none", got, err)
	}
	got, err := pods.NamespaceChoices(ctx, "team-b")
	if err != nil || !maps.Equal(got, map[string]string{"ipledger.io/pool": "blue"}) {
		t.Errorf("NamespaceChoices(team-b) = %v, %v", got, err)
	}
	if got, err := pods.NamespaceChoices(ctx, "default"); err != nil || got != nil {
		t.Errorf("NamespaceChoices(default) = %v, %v; want none", got, err)
	}
}
