//go:build kubelet

// Package kubenodes_test runs ipledger on Kubernetes nodes that share this
// machine (kubeenv.AddNode): each node a network namespace on netnodes' bridge
// and a mount namespace of its own, with its own containerd and kubelet, one
// control plane on the host. deploy/ipledger.yaml is applied unchanged.
package kubenodes_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// cluster is the three-node environment with this package's checks as its
// methods; ns is the namespace its pod helpers (startHttpd, waitRunning,
// startPod, waitDone, logs) work in, "" for default.
type cluster struct {
	*nodesenv.Cluster
	ns string
}

// startNodes brings up the control plane and n nodes, with no pod network.
func startNodes(t testing.TB, n int) *cluster {
	return &cluster{Cluster: nodesenv.StartNodes(t, n)}
}

// namespace is the namespace of cl's pod helpers.
func (cl *cluster) namespace() string {
	if cl.ns == "" {
		return "default"
	}
	return cl.ns
}

// inNamespace is cl with its pod helpers working in namespace ns.
func (cl *cluster) inNamespace(ns string) *cluster { return &cluster{Cluster: cl.Cluster, ns: ns} }

// fetchScript is a client pod's script: it fetches http://target:8080/ from
// each target over TCP (5 s each), says which answered "ok", and fails unless
// all did.
func fetchScript(targets []netip.Addr) string {
	var script strings.Builder
	script.WriteString("rc=0; ")
	for _, a := range targets {
		// nc, not wget: Debian's static busybox wget segfaults (here on the host too).
		fmt.Fprintf(&script, "if [ \"$(printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 5 %[1]s 8080 | /bin/busybox tail -n 1)\" = ok ]; then echo %[1]s ok; else echo %[1]s FAIL; rc=1; fi; ", a)
	}
	script.WriteString("exit $rc")
	return script.String()
}

// startPod creates a pod named name on node that runs script once, and
// returns without waiting for it (waitDone does).
func (cl *cluster) startPod(node, name, script string) {
	cl.T.Helper()
	spec := nodesenv.BusyboxPod(node, "probe", "/bin/busybox", "sh", "-c", script)
	spec.RestartPolicy = corev1.RestartPolicyNever
	cl.C.Apply(cl.T, nodesenv.PodManifestIn(cl.namespace(), name, map[string]string{"app": "probe"}, spec))
}

// waitDone waits until pod name (started by startPod) has run to completion
// and reports whether it succeeded, with its log as `kubectl logs` reads it
// (through the apiserver's egress to the node's kubelet) and its address.
func (cl *cluster) waitDone(name string) (bool, string, netip.Addr) {
	cl.T.Helper()
	var phase, ip string
	if err := kubeenv.WaitFor(3*time.Minute, 500*time.Millisecond, func() (bool, error) {
		pods, err := cl.C.Pods(cl.namespace(), "app=probe")
		if err != nil {
			return false, err
		}
		for _, p := range pods {
			if p.Metadata.Name == name {
				phase, ip = p.Status.Phase, p.Status.PodIP
			}
		}
		return phase == "Succeeded" || phase == "Failed", fmt.Errorf("pod %s phase %q", name, phase)
	}); err != nil {
		out, _ := cl.C.Kubectl("describe", "pod", name, "-n", cl.namespace())
		cl.T.Fatalf("%v\n%s", err, out)
	}
	addr, _ := netip.ParseAddr(ip)
	return phase == "Succeeded", cl.logs(name), addr
}

// logs is `kubectl logs pod`: the apiserver reaches the pod's kubelet inside
// its node's namespace through the egress proxy (kubeenv's egress.go).
func (cl *cluster) logs(pod string) string {
	cl.T.Helper()
	out, err := cl.C.Kubectl("logs", pod, "-n", cl.namespace())
	if err != nil {
		cl.T.Fatalf("kubectl logs %s: %v\n%s", pod, err, out)
	}
	return out
}

// hostPortPod starts a busybox httpd pod on node answering "ok" on container
// port 8080, published on the node as hostPort, and waits until it runs.
func (cl *cluster) hostPortPod(node string, hostPort int) {
	cl.T.Helper()
	cl.httpd("hostport-"+node, node, map[string]string{"app": "hostport"}, "ok", hostPort)
}

// httpGet sends GET /index.html over c and returns the body's last line.
func httpGet(c net.Conn) (string, error) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1]), err
}

// TestThreeNodes (issues 25, 27, 35): one cluster of three kubelet nodes for
// every check that can share it, one after the other; each subtest deletes the
// pods and Services it made and stops the kube-proxy it started. Before
// ipledger is installed, node1's iptables FORWARD policy is set to DROP (as
// Docker, ufw and firewalld leave it) and stays so throughout.
//
//   - NodeMode: deploy/ipledger.yaml applied unchanged; a pod on each node
//     reaches a pod on every other node over TCP, through the routes the
//     agents program, and the server sees the client pod's own address (no NAT
//     between pods); a pod reaches the outside namespace, which sees its
//     node's address (masquerade); a hostPort pod answers on its node's
//     address, from outside and from another node; every node reaches every
//     pod; kubectl logs and exec reach every node's kubelet; ClusterIP
//     Services through kube-proxy (checkServices); kubectl ipledger over the
//     three nodes (checkPlugin, issue 27); each node on the selected containerd,
//     the conflist at the cniVersion it loads, privileged pods admitted
//     (checkRuntime); the Nodes NotReady while the agents are down, Ready once
//     they are back, pods not scheduled meanwhile (checkStatusDrivesNodes).
//   - ForwardDropNode: on node1, whose policy DROP the NodeMode checks crossed
//     both ways, `iptables -S FORWARD` shows the policy kept and the jump to
//     ipledger's accepts.
//   - ClusterMode: node mode uninstalled (the agents' ledgers removed, as on
//     a fresh node), then `kubectl apply -k deploy/cluster` (checkClusterMode),
//     a StatefulSet's pods keeping their addresses when their node is
//     drained (checkStickyStatefulSet), and a namespace whose pods take their
//     addresses from a second IPPool reaching every other pod (checkSecondPool).
//   - FlannelControl: ipledger uninstalled, flannel host-gw on the same nodes
//     passes the connectivity check, as a control: a check that fails there as
//     well as with ipledger is the environment's, not ipledger's.
//
// The subtests depend on their order (one cluster, its install changing);
// -run 'TestThreeNodes/ClusterMode' still installs node mode first.
func TestThreeNodes(t *testing.T) {
	cl := startNodes(t, 3)
	drop := cl.Nodes[1]
	forwardDrop(t, drop)
	cl.InstallIpledger()
	t.Run("NodeMode", func(t *testing.T) {
		cl := cl.in(t)
		cl.checkRuntime()
		cl.checkNetwork()
		cl.checkPlugin()
		cl.checkServices()
		cl.checkStatusDrivesNodes()
	})
	t.Run("ForwardDropNode", func(t *testing.T) { cl.in(t).checkForwardDrop(drop) })
	t.Run("ClusterMode", func(t *testing.T) {
		sub := cl.in(t)
		sub.uninstallIpledger()
		sub.removeLedgers()
		cl.ClusterMode = true // from here on, whatever the subtest's outcome
		sub.Install(true)
		sub.checkClusterMode()
		sub.checkStickyStatefulSet()
		sub.checkSecondPool()
	})
	t.Run("FlannelControl", func(t *testing.T) {
		cl := cl.in(t)
		cl.uninstallIpledger()
		cl.installFlannel()
		_, _, failed := cl.mesh()
		for _, node := range failed {
			t.Errorf("flannel: a pod on %s did not reach every other node's pod", node)
		}
	})
}

// in is the shared cluster as subtest t sees it: its failures are t's, and
// the pods and Services t made are deleted when t ends (so the next subtest
// starts from the installed network alone).
func (cl *cluster) in(t *testing.T) *cluster {
	env := *cl.Cluster
	env.T = t
	sub := &cluster{Cluster: &env, ns: cl.ns}
	t.Cleanup(sub.clean)
	return sub
}

// removeLedgers empties every node's /var/lib/ipledger (the agent's ledger,
// which an uninstall keeps on the node), the agents being gone: the next
// install starts on nodes as fresh as new ones. The directory itself stays
// (the node's mount of it).
func (cl *cluster) removeLedgers() {
	for _, nd := range cl.Nodes {
		dir := nd.HostPath("/var/lib/ipledger")
		ents, err := os.ReadDir(dir)
		if err != nil {
			cl.T.Fatal(err)
		}
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				cl.T.Fatal(err)
			}
		}
	}
}

// clean deletes the pods, Jobs and Services a test made in namespace default
// and waits until they are gone (their sandboxes torn down, their addresses
// released).
func (cl *cluster) clean() {
	t := cl.T
	t.Helper()
	if out, err := cl.C.Kubectl("delete", "pods,jobs,services", "-n", "default",
		"--field-selector", "metadata.name!=kubernetes", "--wait=true", "--timeout=3m"); err != nil {
		t.Errorf("deleting the test's pods and Services: %v\n%s", err, out)
	}
}

// mesh starts a server pod on every node (its address checked against the
// node's podRange), logs each node's routes (`ip route show` with
// routeFilter), then runs a client pod on every node fetching from every other
// node's server over TCP. It returns the servers' and clients' addresses by
// node and the nodes whose client did not reach every other node's server.
func (cl *cluster) mesh(routeFilter ...string) (servers, clients map[string]netip.Addr, failed []string) {
	t := cl.T
	t.Helper()
	servers = map[string]netip.Addr{}
	for _, nd := range cl.Nodes { // created together, so that they start side by side
		cl.startHttpd("srv-"+nd.Name, nd.Name, map[string]string{"app": "srv"}, "ok", 0)
	}
	for _, nd := range cl.Nodes {
		ip := cl.waitRunning("srv-" + nd.Name)
		if cidr := cl.PodRange(nd.Name); !cidr.Contains(ip) {
			t.Fatalf("pod address %s on %s not in %s", ip, nd.Name, cidr)
		}
		servers[nd.Name] = ip
	}
	for _, nd := range cl.Nodes {
		out, err := exec.Command("ip", append([]string{"-n", nd.Host.Netns, "route", "show"}, routeFilter...)...).CombinedOutput()
		t.Logf("%s (%s): ip route show %s: %v\n%s", nd.Name, nd.IP, strings.Join(routeFilter, " "), err, out)
	}
	clients = map[string]netip.Addr{}
	for _, nd := range cl.Nodes {
		var targets []netip.Addr
		for name, ip := range servers {
			if name != nd.Name {
				targets = append(targets, ip)
			}
		}
		cl.startPod(nd.Name, "client-"+nd.Name, fetchScript(targets))
	}
	for _, nd := range cl.Nodes {
		ok, log, ip := cl.waitDone("client-" + nd.Name)
		clients[nd.Name] = ip
		t.Logf("from %s (pod %s):\n%s", nd.Name, ip, log)
		if !ok {
			failed = append(failed, nd.Name)
		}
	}
	return servers, clients, failed
}

// checkNetwork runs TestThreeNodes' checks.
func (cl *cluster) checkNetwork() {
	t := cl.T
	servers, clients, failed := cl.mesh("proto", "201") // ipledger's route protocol
	for _, node := range failed {
		t.Errorf("a pod on %s did not reach every other node's pod", node)
	}
	// Every node reaches every pod, its own and the other nodes'.
	for _, nd := range cl.Nodes {
		for name, ip := range servers {
			c, err := nd.Host.Dial("tcp", net.JoinHostPort(ip.String(), "8080"), 5*time.Second)
			if err != nil {
				t.Errorf("node %s to pod srv-%s %s: %v", nd.Name, name, ip, err)
				continue
			}
			if got, err := httpGet(c); got != "ok" {
				t.Errorf("node %s to pod srv-%s %s: %q, %v", nd.Name, name, ip, got, err)
			}
		}
	}
	// Pod to pod keeps the pod's address: each server logged every other
	// node's client by its pod address.
	for _, srv := range cl.Nodes {
		log := cl.logs("srv-" + srv.Name)
		for node, ip := range clients {
			// busybox httpd names IPv4 clients as [::ffff:A]:PORT.
			if node != srv.Name && !strings.Contains(log, "[::ffff:"+ip.String()+"]:") {
				t.Errorf("srv-%s did not see client-%s by its pod address %s:\n%s", srv.Name, node, ip, log)
			}
		}
	}
	// kubectl exec, through the apiserver's egress to each kubelet.
	for _, nd := range cl.Nodes {
		out, err := cl.C.Kubectl("exec", "srv-"+nd.Name, "--", "/bin/busybox", "cat", "/tmp/index.html")
		if err != nil || strings.TrimSpace(out) != "ok" {
			t.Errorf("kubectl exec srv-%s: %q, %v", nd.Name, out, err)
		}
	}
	// Masquerade: the outside sees each node's address, never a pod's.
	netnodes.ServeSource(t, cl.Env.Outside.NS, ":8081")
	for _, nd := range cl.Nodes {
		cl.startPod(nd.Name, "outside-"+nd.Name, fmt.Sprintf("/bin/busybox nc -w 5 %s 8081 </dev/null", netnodes.OutsideV4))
	}
	for _, nd := range cl.Nodes {
		ok, log, ip := cl.waitDone("outside-" + nd.Name)
		t.Logf("pod %s on %s reached the outside as %q", ip, nd.Name, strings.TrimSpace(log))
		if !ok || strings.TrimSpace(log) != nd.IP {
			t.Errorf("a pod on %s reached the outside as %q (ok %v), want its node's address %s", nd.Name, log, ok, nd.IP)
		}
	}
	// hostPort on node1: answered on node1's address from the outside and from
	// node0.
	const hostPort = 18080
	cl.hostPortPod("node1", hostPort)
	at := net.JoinHostPort(cl.Nodes[1].IP, fmt.Sprint(hostPort))
	for _, from := range []*netnodes.NS{cl.Env.Outside.NS, cl.Nodes[0].Host.NS} {
		var got string
		err := kubeenv.WaitFor(30*time.Second, 500*time.Millisecond, func() (bool, error) {
			c, err := from.Dial("tcp", at, 3*time.Second)
			if err != nil {
				return false, err
			}
			got, err = httpGet(c)
			return got == "ok", fmt.Errorf("answer %q: %v", got, err)
		})
		t.Logf("hostPort %s from %s: %q", at, from.Netns, got)
		if err != nil {
			t.Errorf("hostPort %s from %s: %v", at, from.Netns, err)
		}
	}
	if t.Failed() {
		for _, nd := range cl.Nodes {
			d, _ := exec.Command("nsenter", "-t", fmt.Sprint(nd.NSPID()), "--net", "--", "iptables-save", "-t", "nat").CombinedOutput()
			t.Logf("%s:\n%s\n%s", nd.Name, nd.Host.Dump(), d)
		}
	}
}

type ipBlocks struct {
	Items []struct {
		Spec struct {
			CIDR  string `json:"cidr"`
			Owner string `json:"owner"`
		} `json:"spec"`
	} `json:"items"`
}

// checkClusterMode (issue 25): with `kubectl apply -k deploy/cluster`
// installed unchanged on three kubelet nodes, pods get addresses from blocks of the cluster-wide pool, each node routes
// every block another node owns (as the IPBlocks on the API say) via that
// node's address and makes its own unreachable (never out of the default
// route), TestThreeNodes' checks, checkPlugin (with kubectl ipledger blocks)
// and checkServices pass, and the cluster audit balances (no address held on
// two nodes).
func (cl *cluster) checkClusterMode() {
	cl.T.Helper()
	cl.checkNetwork()
	cl.checkPlugin()
	cl.checkServices()
	cl.checkBlockRoutes()
	cl.logProtoRoutes("cluster mode")
	// Every node's leases against each other and against the API's blocks.
	cl.clusterAudit()
}

// checkBlockRoutes: each node routes every block another node owns (every
// pool's, as the IPBlocks on the API say) via that node's address, and makes
// its own unreachable.
func (cl *cluster) checkBlockRoutes() {
	t := cl.T
	t.Helper()
	var blocks ipBlocks
	if err := cl.C.GetJSON(&blocks, "ipblocks"); err != nil {
		t.Fatal(err)
	}
	ipOf := map[string]string{}
	for _, nd := range cl.Nodes {
		ipOf[nd.Name] = nd.IP
	}
	for _, nd := range cl.Nodes {
		var want []string
		for _, b := range blocks.Items {
			switch b.Spec.Owner {
			case "":
			case nd.Name:
				want = append(want, "unreachable "+b.Spec.CIDR+" ")
			default:
				want = append(want, b.Spec.CIDR+" via "+ipOf[b.Spec.Owner]+" ")
			}
		}
		if err := cl.waitProtoRoutes(nd.Host.Netns, want, nil); err != nil {
			t.Errorf("%s: %v", nd.Name, err)
		}
	}
}

// clusterAudit runs ipledgerctl cluster-audit over every node's agent and
// fails unless it balances (no address held on two nodes, every lease in a
// block its node owns).
func (cl *cluster) clusterAudit() {
	t := cl.T
	t.Helper()
	args := []string{"cluster-audit"}
	for _, nd := range cl.Nodes {
		args = append(args, "--socket", nd.HostPath("/run/ipledger/ipledger.sock"))
	}
	out, err := exec.Command(filepath.Join(agentenv.Bin(t), "ipledgerctl"), args...).CombinedOutput()
	t.Logf("ipledgerctl cluster-audit over %d nodes:\n%s", len(cl.Nodes), out)
	if err != nil || !strings.Contains(string(out), fmt.Sprintf(": %d nodes,", len(cl.Nodes))) {
		t.Errorf("cluster-audit: %v", err)
	}
}
