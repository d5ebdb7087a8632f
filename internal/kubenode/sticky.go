package kubenode

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// statefulSetOf is the name of the StatefulSet that controls pod (its controller
// ownerReference of kind StatefulSet in apps), "" when none does.
func statefulSetOf(pod *corev1.Pod) string {
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "StatefulSet" {
		return ""
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil || gv.Group != "apps" {
		return ""
	}
	return ref.Name
}

// StatefulSetOf returns the name of the StatefulSet controlling the pod ("" when
// none does): from the watch's cache, or, when the cache lacks the pod (an ADD
// right after the binding), from a GET of the pod. A pod the API server does not
// have has none. An error means the API could not be asked: the caller must not
// guess.
func (p *Pods) StatefulSetOf(ctx context.Context, namespace, name, uid string) (string, error) {
	p.mu.Lock()
	f, ok := p.lookupLocked(namespace, name, uid)
	p.mu.Unlock()
	if ok {
		return f.statefulSet, nil
	}
	pod, deleted, err := p.live(ctx, namespace, name, uid)
	if err != nil || deleted {
		return "", err
	}
	return statefulSetOf(pod), nil
}
