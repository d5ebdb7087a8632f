package kubenode

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestStatefulSetOf: only a controller ownerReference of kind StatefulSet in the
// apps group makes a pod sticky.
func TestStatefulSetOf(t *testing.T) {
	yes, no := true, false
	ref := func(apiVersion, kind, name string, controller *bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: "u", Controller: controller}
	}
	for _, tc := range []struct {
		name string
		refs []metav1.OwnerReference
		want string
	}{
		{"StatefulSet controller", []metav1.OwnerReference{ref("apps/v1", "StatefulSet", "web", &yes)}, "web"},
		{"no owner", nil, ""},
		{"ReplicaSet", []metav1.OwnerReference{ref("apps/v1", "ReplicaSet", "web-5d8", &yes)}, ""},
		{"StatefulSet, not the controller", []metav1.OwnerReference{ref("apps/v1", "StatefulSet", "web", &no)}, ""},
		{"another group's StatefulSet", []metav1.OwnerReference{ref("apps.kruise.io/v1beta1", "StatefulSet", "web", &yes)}, ""},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", OwnerReferences: tc.refs}}
		if got := statefulSetOf(pod); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
