package kubenodes_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// busyboxPod is the spec every pod of this package's tests shares: one
// container of podImage (busybox, never pulled) named container, pinned to
// node (no scheduler placement), running command, without a service-account
// token. Callers set what their pod needs beyond that (grace, restart policy,
// ports).
func busyboxPod(node, container string, command ...string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeName:                     node,
		AutomountServiceAccountToken: new(false),
		Containers: []corev1.Container{{Name: container, Image: podImage,
			ImagePullPolicy: corev1.PullNever, Command: command}},
	}
}

// podManifest is the Pod name in namespace default with labels and spec, as
// kubectl apply reads it (JSON is YAML).
func podManifest(name string, labels map[string]string, spec corev1.PodSpec) string {
	return manifest(&corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec:       spec,
	})
}

// jobManifest is the Job name in namespace default running one pod of spec
// (labelled job=NAME), never retried.
func jobManifest(name string, spec corev1.PodSpec) string {
	return manifest(&batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}},
				Spec:       spec,
			},
		},
	})
}

func manifest(obj any) string {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(fmt.Sprintf("manifest of %T: %v", obj, err)) // the API types always marshal
	}
	return string(b)
}

// httpd starts pod name on node (with labels) serving body as /index.html
// with busybox httpd on port 8080, logging each client's address; hostPort,
// if not 0, publishes 8080 on the node. It returns the pod's address once the
// pod runs.
func (cl *cluster) httpd(name, node string, labels map[string]string, body string, hostPort int) netip.Addr {
	cl.t.Helper()
	spec := busyboxPod(node, "srv", "/bin/busybox", "sh", "-c",
		fmt.Sprintf("echo %s > /tmp/index.html && exec /bin/busybox httpd -f -vv -p 8080 -h /tmp", body))
	spec.TerminationGracePeriodSeconds = new(int64(0))
	if hostPort != 0 {
		spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: int32(hostPort), Protocol: corev1.ProtocolTCP}}
	}
	cl.c.Apply(cl.t, podManifest(name, labels, spec))
	var ip netip.Addr
	if err := kubeenv.WaitFor(2*time.Minute, 500*time.Millisecond, func() (bool, error) {
		var p kubeenv.Pod
		if err := cl.c.GetJSON(&p, "pod", name, "-n", "default"); err != nil {
			return false, err
		}
		if p.Status.Phase != "Running" || p.Status.PodIP == "" {
			return false, fmt.Errorf("pod %s phase %q, address %q", name, p.Status.Phase, p.Status.PodIP)
		}
		var err error
		ip, err = netip.ParseAddr(p.Status.PodIP)
		return err == nil, err
	}); err != nil {
		out, _ := cl.c.Kubectl("describe", "pod", name)
		cl.t.Fatalf("%v\n%s", err, out)
	}
	return ip
}
