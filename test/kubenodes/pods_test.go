//go:build kubelet

package kubenodes_test

import (
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// httpd starts pod name on node (with labels) serving body as /index.html
// with busybox httpd on port 8080, logging each client's address; hostPort,
// if not 0, publishes 8080 on the node. It returns the pod's address once the
// pod runs.
func (cl *cluster) httpd(name, node string, labels map[string]string, body string, hostPort int) netip.Addr {
	cl.T.Helper()
	cl.startHttpd(name, node, labels, body, hostPort)
	return cl.waitRunning(name)
}

// httpdSpec is the spec of every httpd pod here: busybox httpd on port 8080
// serving body as /index.html and logging each client's address, on node
// ("" for the scheduler's choice), stopped at once when deleted.
func httpdSpec(node, body string) corev1.PodSpec {
	spec := nodesenv.BusyboxPod(node, "srv", "/bin/busybox", "sh", "-c",
		fmt.Sprintf("echo %s > /tmp/index.html && exec /bin/busybox httpd -f -vv -p 8080 -h /tmp", body))
	spec.TerminationGracePeriodSeconds = new(int64(0))
	return spec
}

// startHttpd creates httpd's pod and returns without waiting for it.
func (cl *cluster) startHttpd(name, node string, labels map[string]string, body string, hostPort int) {
	cl.T.Helper()
	spec := httpdSpec(node, body)
	if hostPort != 0 {
		spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: int32(hostPort), Protocol: corev1.ProtocolTCP}}
	}
	cl.C.Apply(cl.T, nodesenv.PodManifestIn(cl.namespace(), name, labels, spec))
}

// waitRunning waits until pod name runs and returns its address.
func (cl *cluster) waitRunning(name string) netip.Addr {
	cl.T.Helper()
	var ip netip.Addr
	if err := kubeenv.WaitFor(2*time.Minute, 500*time.Millisecond, func() (bool, error) {
		var p kubeenv.Pod
		if err := cl.C.GetJSON(&p, "pod", name, "-n", cl.namespace()); err != nil {
			return false, err
		}
		if p.Status.Phase != "Running" || p.Status.PodIP == "" {
			return false, fmt.Errorf("pod %s phase %q, address %q", name, p.Status.Phase, p.Status.PodIP)
		}
		var err error
		ip, err = netip.ParseAddr(p.Status.PodIP)
		return err == nil, err
	}); err != nil {
		out, _ := cl.C.Kubectl("describe", "pod", name, "-n", cl.namespace())
		cl.T.Fatalf("%v\n%s", err, out)
	}
	return ip
}
