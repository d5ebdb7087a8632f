//go:build kubelet

package kubenodes_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// stickyPod is what checkStickyStatefulSet reads of a StatefulSet pod.
type stickyPod struct {
	Metadata struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
		PodIP string `json:"podIP"`
	} `json:"status"`
}

// checkStickyStatefulSet (issue 34 item 3), in cluster mode: a StatefulSet of
// three httpd pods, all on node0 (the other nodes cordoned while they start),
// keeps their three addresses when node0 is drained and the pods are re-created
// on node1 and node2: every node routes each moved /32 to the node its pod is on
// (`ip route show proto 201`, logged before and after), every node and a pod on
// every node reach all three, and the cluster audit balances. Scaled down to one,
// the two removed ordinals' addresses are no longer kept and no node routes them;
// deleted, none of the three is.
func (cl *cluster) checkStickyStatefulSet() {
	t := cl.T
	t.Helper()
	n0, others := cl.Nodes[0].Name, []string{cl.Nodes[1].Name, cl.Nodes[2].Name}
	t.Cleanup(func() {
		if out, err := cl.C.Kubectl("delete", "statefulset", "web", "-n", "default", "--ignore-not-found", "--wait=true", "--timeout=2m"); err != nil {
			t.Errorf("deleting StatefulSet web: %v\n%s", err, out)
		}
		for _, nd := range cl.Nodes {
			if out, err := cl.C.Kubectl("uncordon", nd.Name); err != nil {
				t.Errorf("uncordon %s: %v\n%s", nd.Name, err, out)
			}
		}
	})
	for _, n := range others {
		cl.C.MustKubectl(t, "cordon", n)
	}
	spec := httpdSpec("", "ok")
	labels := map[string]string{"app": "web"}
	sts := appsv1.StatefulSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "StatefulSet"},
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.StatefulSetSpec{
			Replicas:            new(int32(3)),
			ServiceName:         "web",
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: labels},
			Template:            corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec},
		},
	}
	b, err := json.Marshal(sts)
	if err != nil {
		t.Fatal(err)
	}
	cl.C.Apply(t, string(b))
	before := cl.waitWeb(3, nil)
	for name, p := range before {
		if p.Spec.NodeName != n0 {
			t.Fatalf("%s started on %s, want %s (the others cordoned)", name, p.Spec.NodeName, n0)
		}
	}
	cl.logProtoRoutes("before the move")

	for _, n := range others {
		cl.C.MustKubectl(t, "uncordon", n)
	}
	if out, err := cl.C.Kubectl("drain", n0, "--pod-selector", "app=web", "--ignore-daemonsets", "--force", "--timeout=3m"); err != nil {
		t.Fatalf("kubectl drain %s: %v\n%s", n0, err, out)
	}
	after := cl.waitWeb(3, before)
	cl.C.MustKubectl(t, "uncordon", n0)
	at := map[string]string{} // address -> node of its pod
	for name, p := range after {
		if p.Status.PodIP != before[name].Status.PodIP {
			t.Errorf("%s came back on %s with %s, had %s", name, p.Spec.NodeName, p.Status.PodIP, before[name].Status.PodIP)
		}
		if p.Spec.NodeName == n0 {
			t.Errorf("%s came back on the drained %s", name, n0)
		}
		t.Logf("%s: %s on %s, now on %s", name, before[name].Status.PodIP, n0, p.Spec.NodeName)
		at[p.Status.PodIP] = p.Spec.NodeName
	}
	// every node routes each moved address to its pod's node
	ipOf := map[string]string{}
	for _, nd := range cl.Nodes {
		ipOf[nd.Name] = nd.IP
	}
	for _, nd := range cl.Nodes {
		var want []string
		for addr, node := range at {
			if node != nd.Name {
				want = append(want, addr+" via "+ipOf[node]+" ")
			}
		}
		if err := cl.waitProtoRoutes(nd.Host.Netns, want, nil); err != nil {
			t.Errorf("%s: %v", nd.Name, err)
		}
	}
	cl.logProtoRoutes("after the move")
	// every node and a pod on every node reach the three
	var addrs []netip.Addr
	for addr := range at {
		addrs = append(addrs, netip.MustParseAddr(addr))
	}
	for _, nd := range cl.Nodes {
		for _, a := range addrs {
			c, err := nd.Host.Dial("tcp", net.JoinHostPort(a.String(), "8080"), 5*time.Second)
			if err != nil {
				t.Errorf("node %s to %s (on %s): %v", nd.Name, a, at[a.String()], err)
				continue
			}
			if got, err := httpGet(c); got != "ok" {
				t.Errorf("node %s to %s (on %s): %q, %v", nd.Name, a, at[a.String()], got, err)
			}
		}
		cl.startPod(nd.Name, "sticky-client-"+nd.Name, fetchScript(addrs))
	}
	for _, nd := range cl.Nodes {
		if ok, log, _ := cl.waitDone("sticky-client-" + nd.Name); !ok {
			t.Errorf("a pod on %s did not reach every StatefulSet pod:\n%s", nd.Name, log)
		}
	}

	// scale down: the removed ordinals' addresses are released everywhere
	cl.C.MustKubectl(t, "scale", "statefulset", "web", "--replicas=1")
	cl.waitWeb(1, nil)
	gone := []string{after["web-1"].Status.PodIP, after["web-2"].Status.PodIP}
	cl.waitUnkept(gone)
	for _, nd := range cl.Nodes {
		var none []string
		for _, a := range gone {
			none = append(none, a+" ")
		}
		if err := cl.waitProtoRoutes(nd.Host.Netns, nil, none); err != nil {
			t.Errorf("%s after the scale-down: %v", nd.Name, err)
		}
	}
	cl.C.MustKubectl(t, "delete", "statefulset", "web", "--wait=true", "--timeout=2m")
	cl.waitUnkept([]string{after["web-0"].Status.PodIP})
	cl.logProtoRoutes("after the StatefulSet is deleted")
}

// waitWeb waits until StatefulSet web has exactly n pods running with an
// address, each a different pod from its namesake in old (when given), and
// returns them by name.
func (cl *cluster) waitWeb(n int, old map[string]stickyPod) map[string]stickyPod {
	cl.T.Helper()
	var got map[string]stickyPod
	err := kubeenv.WaitFor(4*time.Minute, time.Second, func() (bool, error) {
		var l struct{ Items []stickyPod }
		if err := cl.C.GetJSON(&l, "pods", "-n", "default", "-l", "app=web"); err != nil {
			return false, err
		}
		got = map[string]stickyPod{}
		for _, p := range l.Items {
			if p.Status.Phase != "Running" || p.Status.PodIP == "" {
				return false, fmt.Errorf("pod %s phase %q address %q", p.Metadata.Name, p.Status.Phase, p.Status.PodIP)
			}
			if o, ok := old[p.Metadata.Name]; ok && o.Metadata.UID == p.Metadata.UID {
				return false, fmt.Errorf("pod %s not re-created yet", p.Metadata.Name)
			}
			got[p.Metadata.Name] = p
		}
		return len(got) == n, fmt.Errorf("%d pods of web running, want %d", len(got), n)
	})
	if err != nil {
		out, _ := cl.C.Kubectl("describe", "pods", "-l", "app=web")
		cl.T.Fatalf("%v\n%s", err, out)
	}
	return got
}

// waitProtoRoutes waits until `ip route show proto 201` in netns has a line with
// each of want and none with any of none.
func (cl *cluster) waitProtoRoutes(netns string, want, none []string) error {
	var got string
	err := kubeenv.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, error) {
		out, err := exec.Command("ip", "-n", netns, "route", "show", "proto", "201").CombinedOutput()
		if err != nil {
			return false, fmt.Errorf("ip route: %v: %s", err, out)
		}
		got = string(out)
		lines := strings.Split(got, "\n")
		for _, w := range want {
			if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
				return false, fmt.Errorf("no route %q", w)
			}
		}
		for _, w := range none {
			if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, w) }) {
				return false, fmt.Errorf("a route %q left behind", w)
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("%w; ip route show proto 201:\n%s", err, got)
	}
	return nil
}

// waitUnkept waits until no IPBlock keeps any of addrs.
func (cl *cluster) waitUnkept(addrs []string) {
	cl.T.Helper()
	err := kubeenv.WaitFor(2*time.Minute, time.Second, func() (bool, error) {
		var blocks struct {
			Items []struct {
				Spec struct {
					CIDR    string `json:"cidr"`
					Borrows []struct {
						Addr string `json:"addr"`
						For  string `json:"for"`
					} `json:"borrows"`
				} `json:"spec"`
			} `json:"items"`
		}
		if err := cl.C.GetJSON(&blocks, "ipblocks"); err != nil {
			return false, err
		}
		for _, b := range blocks.Items {
			for _, k := range b.Spec.Borrows {
				if slices.Contains(addrs, k.Addr) {
					return false, fmt.Errorf("%s still kept for %s in block %s", k.Addr, k.For, b.Spec.CIDR)
				}
			}
		}
		return true, nil
	})
	if err != nil {
		cl.T.Error(err)
	}
}

// logProtoRoutes logs every node's `ip route show proto 201`, headed by when.
func (cl *cluster) logProtoRoutes(when string) {
	for _, nd := range cl.Nodes {
		out, err := exec.Command("ip", "-n", nd.Host.Netns, "route", "show", "proto", "201").CombinedOutput()
		cl.T.Logf("%s, %s (%s): ip route show proto 201: %v\n%s", when, nd.Name, nd.IP, err, out)
	}
}
