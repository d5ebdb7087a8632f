//go:build kubelet

package kubenodes_test

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// probeScript connects to each target (ip:port) up to tries times, a second
// apart, sending an HTTP request; it prints "TARGET ANSWER" for the first
// answer (the backend pod's name) or "TARGET FAIL", and exits 1 if any failed.
func probeScript(targets []string, tries int) string {
	var b strings.Builder
	b.WriteString("rc=0; ")
	for _, t := range targets {
		host, port, _ := strings.Cut(t, ":")
		fmt.Fprintf(&b, "a=; i=0; while [ $i -lt %[3]d ]; do a=\"$(printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 %[1]s %[2]s | /bin/busybox tail -n 1)\"; case \"$a\" in echo-*) break;; esac; i=$((i+1)); /bin/busybox sleep 1; done; ", host, port, tries)
		fmt.Fprintf(&b, "case \"$a\" in echo-*) echo %[1]s \"$a\" after $i retries;; *) echo %[1]s FAIL; rc=1;; esac; ", t)
	}
	b.WriteString("exit $rc")
	return b.String()
}

// service creates a ClusterIP Service name on port 80 for the pods labelled
// selector (k=v), target port 8080, and returns its ClusterIP.
func (cl *cluster) service(name, selector string) string {
	cl.T.Helper()
	k, v, _ := strings.Cut(selector, "=")
	cl.C.Apply(cl.T, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default}
spec:
  type: ClusterIP
  selector: {%s: %s}
  ports: [{port: 80, targetPort: 8080, protocol: TCP}]
`, name, k, v))
	ip := strings.TrimSpace(cl.C.MustKubectl(cl.T, "get", "service", name, "-o", "jsonpath={.spec.clusterIP}"))
	if ip == "" {
		cl.T.Fatalf("service %s has no ClusterIP", name)
	}
	return ip
}

// podNetns is the name (in the node's /run/netns) of the network namespace
// holding addr, found by asking each of the node's pod namespaces.
func podNetns(t testing.TB, nd *kubeenv.Node, addr string) string {
	t.Helper()
	ents, _ := os.ReadDir(nd.HostPath("/run/netns"))
	for _, e := range ents {
		out, _ := exec.Command("nsenter", "-t", fmt.Sprint(nd.NSPID()), "--mount", "--",
			"ip", "netns", "exec", e.Name(), "ip", "-4", "-o", "addr", "show").CombinedOutput()
		if strings.Contains(string(out), " "+addr+"/") {
			return e.Name()
		}
	}
	t.Fatalf("%s: no namespace in %s holds %s", nd.Name, nd.HostPath("/run/netns"), addr)
	return ""
}

// checkServices (issue 25): with kube-proxy on every node, a ClusterIP
// Service whose endpoints are on other nodes answers from a pod on each node
// and from each node itself, and a pod reaches itself through its own Service
// (hairpin: out of its veth, DNAT back to itself on the node).
func (cl *cluster) checkServices() {
	t, n := cl.T, len(cl.Nodes)
	t0 := time.Now()
	for _, nd := range cl.Nodes {
		nd.StartKubeProxy(t, cl.PodNetwork())
		t.Cleanup(nd.StopKubeProxy) // the next test on the cluster starts its own
	}
	t.Logf("kube-proxy healthy on %d nodes in %v", n, time.Since(t0).Round(time.Millisecond))
	for _, nd := range cl.Nodes {
		// The kubernetes Service is the relay's: kube-proxy must leave it alone
		// (no endpoints: it would reject the node's new connections to it).
		out, err := exec.Command("nsenter", "-t", fmt.Sprint(nd.NSPID()), "--net", "--", "iptables-save").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: iptables-save: %v\n%s", nd.Name, err, out)
		}
		if strings.Contains(string(out), kubeenv.APIServiceIP+"/32") {
			t.Errorf("%s: kube-proxy has rules for the relay's %s:\n%s", nd.Name, kubeenv.APIServiceIP, out)
		}
	}
	// Endpoints on node1 and node2: from node0 both are remote.
	svc := cl.service("echo", "app=echo")
	self := cl.service("echo-node1", "echo=node1")
	// remote[n]: a Service whose one endpoint is on a node other than n.
	remote := map[string]string{"node0": self, "node1": cl.service("echo-node2", "echo=node2"), "node2": self}
	want := map[string]string{"node0": "echo-node1", "node1": "echo-node2", "node2": "echo-node1"}
	podIP := map[string]string{}
	for _, node := range []string{"node1", "node2"} {
		cl.startHttpd("echo-"+node, node, map[string]string{"app": "echo", "echo": node}, "echo-"+node, 0)
	}
	for _, node := range []string{"node1", "node2"} {
		podIP[node] = cl.waitRunning("echo-" + node).String()
	}
	t.Logf("service echo %s -> echo-node1 %s, echo-node2 %s; echo-node1 %s, echo-node2 %s", svc, podIP["node1"], podIP["node2"], self, remote["node1"])
	probeIP := map[string]netip.Addr{}
	t1 := time.Now()
	for _, nd := range cl.Nodes { // side by side
		cl.startPod(nd.Name, "probe-"+nd.Name, probeScript([]string{svc + ":80", remote[nd.Name] + ":80"}, 30))
	}
	for _, nd := range cl.Nodes {
		ok, log, ip := cl.waitDone("probe-" + nd.Name)
		probeIP[nd.Name] = ip
		t.Logf("from a pod on %s (%v after the three were created):\n%s", nd.Name, time.Since(t1).Round(time.Millisecond), log)
		if !ok || !strings.Contains(log, remote[nd.Name]+":80 "+want[nd.Name]+" ") {
			t.Errorf("a pod on %s did not reach every service (%s through %s)", nd.Name, want[nd.Name], remote[nd.Name])
		}
	}
	for _, nd := range cl.Nodes {
		t1 := time.Now()
		out, err := exec.Command("nsenter", "-t", fmt.Sprint(nd.NSPID()), "--net", "--mount", "--uts", "--",
			"/bin/busybox", "sh", "-c", probeScript([]string{svc + ":80", remote[nd.Name] + ":80"}, 30)).CombinedOutput()
		t.Logf("from node %s (%v):\n%s", nd.Name, time.Since(t1).Round(time.Millisecond), out)
		if err != nil || !strings.Contains(string(out), remote[nd.Name]+":80 "+want[nd.Name]+" ") {
			t.Errorf("node %s did not reach every service (%s through %s): %v", nd.Name, want[nd.Name], remote[nd.Name], err)
		}
	}
	// A pod's address survives a ClusterIP: echo-node1 (the one endpoint of
	// Service self) logged probe-node0 and probe-node2 by their pod
	// addresses. kube-proxy masquerades Service traffic from outside its
	// --cluster-cidr, so this fails when that does not cover the pods (in
	// cluster mode: the pool, not the Nodes' podCIDRs).
	echoLog := cl.logs("echo-node1")
	for _, node := range []string{"node0", "node2"} {
		if ip := probeIP[node]; !strings.Contains(echoLog, "[::ffff:"+ip.String()+"]:") {
			t.Errorf("echo-node1 did not see probe-%s by its pod address %s through service %s (masqueraded?):\n%s", node, ip, self, echoLog)
		}
	}
	// Hairpin: echo-node1 through the Service whose only endpoint it is.
	node1 := cl.Nodes[1]
	ns := podNetns(t, node1, podIP["node1"])
	t1 = time.Now()
	out, err := exec.Command("nsenter", "-t", fmt.Sprint(node1.NSPID()), "--mount", "--",
		"ip", "netns", "exec", ns, "/bin/busybox", "sh", "-c", probeScript([]string{self + ":80"}, 30)).CombinedOutput()
	t.Logf("from pod echo-node1 (netns %s) through its own service (%v):\n%s", ns, time.Since(t1).Round(time.Millisecond), out)
	if err != nil || !strings.Contains(string(out), self+":80 echo-node1 ") {
		t.Errorf("pod echo-node1 did not reach itself through service %s: %v", self, err)
	}
	// The hairpin is masqueraded to the node's address, not to the relay's
	// APIServiceIP on its loopback.
	if ct, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/nf_conntrack", node1.NSPID())); err == nil {
		for _, l := range strings.Split(string(ct), "\n") {
			if strings.Contains(l, "dst="+self+" ") {
				t.Logf("node1 conntrack: %s", l)
				if !strings.Contains(l, "dst="+node1.IP+" ") {
					t.Errorf("hairpin not masqueraded to node1's address %s: %s", node1.IP, l)
				}
			}
		}
	}
	var errs []string
	for _, l := range strings.Split(cl.Nodes[0].Log("kube-proxy", 400), "\n") {
		if strings.HasPrefix(l, "E") || strings.HasPrefix(l, "W") {
			errs = append(errs, l)
		}
	}
	t.Logf("node0 kube-proxy warnings and errors:\n%s", strings.Join(errs, "\n"))
	if t.Failed() {
		for _, nd := range cl.Nodes {
			d, _ := exec.Command("nsenter", "-t", fmt.Sprint(nd.NSPID()), "--net", "--", "iptables-save", "-t", "nat").CombinedOutput()
			t.Logf("%s:\n%s\n%s", nd.Name, nd.Host.Dump(), d)
		}
	}
}
