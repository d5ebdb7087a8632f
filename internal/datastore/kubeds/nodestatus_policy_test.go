package kubeds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestAgentPatchesOnlyItsOwnNodeStatus: deploy/ipledger.yaml applied to a real
// kube-apiserver (its RBAC and its ValidatingAdmissionPolicy, unchanged). The agent's
// ServiceAccount token, bound to its pod on node-x as the kubelet requests it, may
// patch node-x's status (the NetworkUnavailable condition, as the agent does) and is
// refused node-y's, naming the rule; a token of the same ServiceAccount bound to no
// pod (so to no node) is refused both; the admin is not matched. Without the policy
// the ClusterRole alone lets every agent patch every Node's status.
func TestAgentPatchesOnlyItsOwnNodeStatus(t *testing.T) {
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	if out, err := api.KubectlIn(manifest(t), "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply -f deploy/ipledger.yaml: %v\n%s", err, out)
	}
	admin, err := corev1client.NewForConfig(api.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for _, n := range []string{"node-x", "node-y"} {
		if _, err := admin.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// the agent's pod as the DaemonSet's would be, bound to node-x (no kubelet here:
	// the object is what the token is bound to)
	var sa *corev1.ServiceAccount
	if err := kubeenv.WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
		sa, err = admin.ServiceAccounts("ipledger").Get(ctx, "ipledgerd", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("ServiceAccount ipledger/ipledgerd: %v", err)
	}
	pod, err := admin.Pods("ipledger").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "ipledgerd-x"},
		Spec: corev1.PodSpec{NodeName: "node-x", ServiceAccountName: sa.Name,
			Containers: []corev1.Container{{Name: "ipledgerd", Image: "ipledger:dev"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := func(bound *authenticationv1.BoundObjectReference) string {
		t.Helper()
		tr, err := admin.ServiceAccounts("ipledger").CreateToken(ctx, "ipledgerd", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: bound}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	agentX := clientFor(t, api, token(&authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}))
	unbound := clientFor(t, api, token(nil))

	patch := func(c corev1client.CoreV1Interface, node, reason string) error {
		body := fmt.Sprintf(`{"status":{"conditions":[{"type":"NetworkUnavailable","status":"False","reason":%q,"message":"test"}]}}`, reason)
		_, err := c.Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(body), metav1.PatchOptions{}, "status")
		return err
	}
	// the policy is enforced once the apiserver has loaded it (its informer): wait
	// for the first refusal, then everything else is asserted once
	var refused error
	if err := kubeenv.WaitFor(time.Minute, 250*time.Millisecond, func() (bool, error) {
		refused = patch(agentX, "node-y", "ByAnotherAgent")
		return refused != nil, nil
	}); err != nil {
		t.Fatalf("node-x's agent patched node-y's status for a minute: the policy is not enforced")
	}
	if !apierrors.IsForbidden(refused) || !strings.Contains(refused.Error(), "ipledgerd may patch the status of its own Node only: this token is for node node-x, not node-y") {
		t.Fatalf("node-x's agent patching node-y: %v, want Forbidden naming both nodes", refused)
	}
	if err := patch(agentX, "node-x", "RouteCreated"); err != nil {
		t.Fatalf("node-x's agent patching its own Node's status: %v", err)
	}
	if err := patch(unbound, "node-x", "Unbound"); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no node (not bound to a scheduled pod)") {
		t.Fatalf("a token bound to no pod patching node-x: %v, want Forbidden", err)
	}
	if err := patch(admin, "node-y", "Admin"); err != nil {
		t.Fatalf("the admin patching node-y: %v (the policy must match the agents only)", err)
	}
	for node, want := range map[string]string{"node-x": "RouteCreated", "node-y": "Admin"} {
		n, err := admin.Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeNetworkUnavailable {
				got = c.Reason
			}
		}
		if got != want {
			t.Errorf("%s's NetworkUnavailable reason %q, want %q", node, got, want)
		}
	}
	// and the agent's token still reads what it needs
	if _, err := agentX.Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("the agent listing Nodes: %v", err)
	}
}

// clientFor is a client of api authenticated by a bearer token alone.
func clientFor(t *testing.T, api *kubeenv.APIServer, token string) corev1client.CoreV1Interface {
	t.Helper()
	admin := api.Config()
	cfg := &rest.Config{Host: admin.Host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAFile: admin.CAFile}}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
