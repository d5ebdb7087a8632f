package kubeenv

import (
	"context"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/util/retry"
)

// Empty deletes every Node, Pod and Event and every namespace the apiserver did
// not make itself, and waits until it lists none of them: tests that share one
// apiserver (starting one costs about 25 s on a loaded 2-core machine) call it
// before each, so that each starts from what a fresh one holds. Namespaces are
// finalized by hand, as no namespace controller runs beside the apiserver.
// Custom resources, ServiceAccounts and RBAC objects are left: a test that
// needs them gone deletes them itself.
func (a *APIServer) Empty(tb testing.TB) {
	tb.Helper()
	c, err := corev1client.NewForConfig(a.Config())
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := int64(0)
	if err := c.Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		tb.Fatalf("kubeenv: empty the apiserver: Nodes: %v", err)
	}
	nss, err := c.Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		tb.Fatalf("kubeenv: empty the apiserver: namespaces: %v", err)
	}
	for _, ns := range nss.Items {
		if err := c.Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &now}, metav1.ListOptions{}); err != nil {
			tb.Fatalf("kubeenv: empty the apiserver: Pods of %s: %v", ns.Name, err)
		}
		if err := c.Events(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			tb.Fatalf("kubeenv: empty the apiserver: Events of %s: %v", ns.Name, err)
		}
		if serverNamespace(ns.Name) {
			continue
		}
		if err := c.Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			tb.Fatalf("kubeenv: empty the apiserver: namespace %s: %v", ns.Name, err)
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := c.Namespaces().Get(ctx, ns.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.Finalizers = nil
			_, err = c.Namespaces().Finalize(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil && !apierrors.IsNotFound(err) {
			tb.Fatalf("kubeenv: empty the apiserver: finalize namespace %s: %v", ns.Name, err)
		}
	}
	if err := WaitFor(time.Minute, 100*time.Millisecond, func() (bool, error) {
		nodes, err := c.Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		pods, err := c.Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		nss, err := c.Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		left := len(nodes.Items) + len(pods.Items)
		for _, ns := range nss.Items {
			if !serverNamespace(ns.Name) {
				left++
			}
		}
		return left == 0, nil
	}); err != nil {
		tb.Fatalf("kubeenv: empty the apiserver: %v", err)
	}
}

// serverNamespace: a namespace the apiserver makes itself.
func serverNamespace(name string) bool {
	return name == "default" || strings.HasPrefix(name, "kube-")
}
