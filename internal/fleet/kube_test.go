package fleet

import (
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
)

// TestAPIErrForbidden: a refusal is ErrForbidden whether it comes as the API's status
// (a list) or only as the failed upgrade's text (an exec over SPDY), and keeps the
// API's message as it was.
func TestAPIErrForbidden(t *testing.T) {
	status := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "nobody" cannot list resource "pods"`))
	upgrade := errors.New(`unable to upgrade connection: pods "ipledgerd-x" is forbidden: User "viewer" cannot create resource "pods/exec" in API group "" in the namespace "ipledger"`)
	for _, err := range []error{status, upgrade} {
		got := apiErr(err)
		if !errors.Is(got, ErrForbidden) || got.Error() != err.Error() {
			t.Errorf("apiErr(%v) = %v, ErrForbidden %v", err, got, errors.Is(got, ErrForbidden))
		}
	}
	if other := errors.New("connection refused"); errors.Is(apiErr(other), ErrForbidden) {
		t.Errorf("connection refused taken for forbidden")
	}
}

// TestKubeListerOwners: the pods' controller owner reference and the DaemonSet's UID
// are read from the API objects as the DaemonSet controller writes them; a missing
// DaemonSet is ErrNoDaemonSet.
func TestKubeListerOwners(t *testing.T) {
	yes := true
	ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "ipledgerd", Namespace: "ipledger", UID: "ds-uid"}}
	owned := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ipledgerd-a", Namespace: "ipledger", Labels: map[string]string{"app": "ipledgerd"},
		OwnerReferences: []metav1.OwnerReference{
			{APIVersion: "v1", Kind: "ConfigMap", Name: "not-the-controller", UID: "cm"},
			{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ipledgerd", UID: "ds-uid", Controller: &yes},
		}}, Spec: corev1.PodSpec{NodeName: "n0"}}
	bare := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "debug", Namespace: "ipledger", Labels: map[string]string{"app": "ipledgerd"}}}
	cs := fake.NewClientset(ds, owned, bare)
	k := &kubeLister{client: cs.CoreV1(), apps: cs.AppsV1()}
	uid, err := k.DaemonSetUID(t.Context(), "ipledger", "ipledgerd")
	if err != nil || uid != "ds-uid" {
		t.Fatalf("DaemonSetUID = %q, %v", uid, err)
	}
	if _, err := k.DaemonSetUID(t.Context(), "ipledger", "other"); !errors.Is(err, ErrNoDaemonSet) {
		t.Fatalf("missing DaemonSet: %v, want ErrNoDaemonSet", err)
	}
	pods, err := k.Pods(t.Context(), "ipledger", "app=ipledgerd")
	if err != nil || len(pods) != 2 {
		t.Fatalf("pods %+v, %v", pods, err)
	}
	got := map[string]Owner{}
	for _, p := range pods {
		got[p.Name] = p.Owner
	}
	if want := (Owner{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "ipledgerd", UID: "ds-uid"}); got["ipledgerd-a"] != want || got["debug"] != (Owner{}) {
		t.Fatalf("owners %+v", got)
	}
	if !ownedBy(pods[0], "ipledgerd", uid) && !ownedBy(pods[1], "ipledgerd", uid) {
		t.Fatal("the DaemonSet's pod is not taken as its")
	}
}
