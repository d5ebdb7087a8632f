package fleet

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	appsv1client "k8s.io/client-go/kubernetes/typed/apps/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"
)

// Connect is the client of the kubeconfig cfg names (as kubectl loads it: --kubeconfig,
// else KUBECONFIG, else ~/.kube/config; --context, --as, ... over it).
func Connect(cfg clientcmd.ClientConfig) (*Client, error) {
	rc, err := cfg.ClientConfig()
	if err != nil {
		return nil, err
	}
	rc.UserAgent = "kubectl-ipledger"
	cs, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	apps, err := appsv1client.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &Client{Lister: &kubeLister{client: cs, apps: apps}, Exec: &podExec{config: rc, client: cs}}, nil
}

// kubeLister lists through the API server.
type kubeLister struct {
	client corev1client.CoreV1Interface
	apps   appsv1client.AppsV1Interface
}

var _ Lister = (*kubeLister)(nil)

func (k *kubeLister) Nodes(ctx context.Context) ([]string, error) {
	l, err := k.client.Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, apiErr(err)
	}
	names := make([]string, 0, len(l.Items))
	for _, n := range l.Items {
		names = append(names, n.Name)
	}
	return names, nil
}

func (k *kubeLister) Pods(ctx context.Context, namespace, selector string) ([]Pod, error) {
	l, err := k.client.Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, apiErr(err)
	}
	pods := make([]Pod, 0, len(l.Items))
	for _, p := range l.Items {
		pod := Pod{Name: p.Name, Node: p.Spec.NodeName, Phase: string(p.Status.Phase),
			Created: p.CreationTimestamp.Time, Deleting: p.DeletionTimestamp != nil}
		if ref := metav1.GetControllerOf(&p); ref != nil {
			pod.Owner = Owner{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: string(ref.UID)}
		}
		pods = append(pods, pod)
	}
	return pods, nil
}

func (k *kubeLister) DaemonSetUID(ctx context.Context, namespace, name string) (string, error) {
	ds, err := k.apps.DaemonSets(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", fmt.Errorf("%w: %w", ErrNoDaemonSet, err)
	}
	if err != nil {
		return "", apiErr(err)
	}
	return string(ds.UID), nil
}

// podExec runs commands in pods as kubectl exec does: over a websocket (the v5
// streaming protocol), falling back to SPDY for an API server or proxy that does
// not upgrade to one.
type podExec struct {
	config *rest.Config
	client corev1client.CoreV1Interface
}

var _ Exec = (*podExec)(nil)

func (p *podExec) Exec(ctx context.Context, namespace, pod, container string, cmd []string) ([]byte, []byte, int, error) {
	req := p.client.RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(p.config, "POST", req.URL())
	if err != nil {
		return nil, nil, 0, err
	}
	ws, err := remotecommand.NewWebSocketExecutor(p.config, "GET", req.URL().String())
	if err != nil {
		return nil, nil, 0, err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, nil, 0, err
	}
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	var exit utilexec.ExitError
	switch {
	case err == nil:
		return stdout.Bytes(), stderr.Bytes(), 0, nil
	case errors.As(err, &exit) && exit.Exited():
		return stdout.Bytes(), stderr.Bytes(), exit.ExitStatus(), nil
	}
	return stdout.Bytes(), stderr.Bytes(), 0, apiErr(err)
}

// apiErr marks an error the API's authorization gave as ErrForbidden. An exec's
// refusal arrives as the failed upgrade's message (SPDY does not keep the API's
// status), so its text is read too.
func apiErr(err error) error {
	if apierrors.IsForbidden(err) || strings.Contains(err.Error(), " is forbidden: ") {
		return forbidden{err}
	}
	return err
}

// forbidden is an error that is ErrForbidden, with the API's message alone.
type forbidden struct{ err error }

func (f forbidden) Error() string   { return f.err.Error() }
func (f forbidden) Unwrap() []error { return []error{ErrForbidden, f.err} }
