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

	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

const podImage = "ipledger.local/busybox:test"

type cluster struct {
	t     testing.TB
	c     *kubeenv.Cluster
	env   *netnodes.Env
	nodes []*kubeenv.Node
	// clusterMode: ipledger installed from deploy/cluster (pods get
	// addresses in clusterPool, not in their Node's podCIDR).
	clusterMode bool
}

// images writes the ipledger image (as `make image` builds it) and a busybox
// image into dir.
func images(t testing.TB, dir string) []string {
	t.Helper()
	spec, err := image.IpledgerSpec(agentenv.Bin(t), "ipledger:dev")
	if err != nil {
		t.Fatal(err)
	}
	ipl := filepath.Join(dir, "ipledger.tar")
	if err := image.WriteFile(spec, ipl); err != nil {
		t.Fatal(err)
	}
	debpkg.Need(t, debpkg.BusyBox) // the pods' image
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	box := filepath.Join(dir, "busybox.tar")
	if err := image.WriteFile(image.Spec{Tag: podImage, Files: []image.File{{Path: "bin/busybox", Mode: 0o755, Data: bb}},
		Dirs: []string{"tmp", "etc", "proc", "sys", "dev"}, Entrypoint: []string{"/bin/busybox"}}, box); err != nil {
		t.Fatal(err)
	}
	return []string{ipl, box}
}

// start brings up the control plane and n nodes, applies deploy/ipledger.yaml
// unchanged and waits until every node is Ready with its agent Ready.
func start(t testing.TB, n int) *cluster { return startMode(t, n, false) }

// startMode is start, with `kubectl apply -k deploy/cluster` (cluster mode on
// the Kubernetes datastore, the overlay unchanged) when clusterMode is set.
func startMode(t testing.TB, n int, clusterMode bool) *cluster {
	t.Helper()
	return startWith(t, n, clusterMode, nil)
}

// startWith is startMode with more images (docker archives) on every node.
func startWith(t testing.TB, n int, clusterMode bool, extra []string) *cluster {
	t.Helper()
	cl := startNodesWith(t, n, extra)
	cl.install(clusterMode)
	return cl
}

// startNodes brings up the control plane and n nodes, with no pod network:
// the nodes are NotReady until one is installed.
func startNodes(t testing.TB, n int) *cluster {
	t.Helper()
	return startNodesWith(t, n, nil)
}

func startNodesWith(t testing.TB, n int, extra []string) *cluster {
	t.Helper()
	testenv.SkipIfShort(t, "needs a Kubernetes build")
	imgs := append(images(t, t.TempDir()), extra...)
	t0 := time.Now()
	c := kubeenv.StartControlPlane(t, kubeenv.Options{StartTimeout: 2 * time.Minute})
	t.Logf("control plane up in %v", time.Since(t0).Round(time.Millisecond))
	env := netnodes.New(t, n)
	cl := &cluster{t: t, c: c, env: env}
	for i := range n {
		t1 := time.Now()
		cl.nodes = append(cl.nodes, c.AddNode(t, fmt.Sprintf("node%d", i), env.Node(i), imgs...))
		t.Logf("node%d registered in %v", i, time.Since(t1).Round(time.Millisecond))
	}
	return cl
}

// installIpledger applies deploy/ipledger.yaml unchanged and waits until
// every node is Ready with its agent Ready.
func (cl *cluster) installIpledger() {
	cl.t.Helper()
	cl.install(false)
}

// install applies deploy/ipledger.yaml, or deploy/cluster with kubectl apply
// -k when clusterMode, unchanged, and waits until every node is Ready with
// its agent Ready.
func (cl *cluster) install(clusterMode bool) {
	t, c := cl.t, cl.c
	t.Helper()
	cl.clusterMode = clusterMode
	t2 := time.Now()
	what := "deploy/ipledger.yaml applied"
	if clusterMode {
		what = "deploy/cluster applied (kubectl apply -k)"
		c.MustKubectl(t, "apply", "-k", filepath.Join(agentenv.RepoRoot(), "deploy", "cluster"))
	} else {
		manifest, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		c.Apply(t, string(manifest))
	}
	cl.waitAgents(what+" unchanged", t2)
}

// waitAgents waits until every node's agent and Node are Ready, what having
// been applied at t0.
func (cl *cluster) waitAgents(what string, t0 time.Time) {
	t, c, n := cl.t, cl.c, len(cl.nodes)
	t.Helper()
	if err := kubeenv.WaitFor(3*time.Minute, time.Second, func() (bool, error) {
		pods, err := c.Pods("ipledger", "app=ipledgerd")
		if err != nil {
			return false, err
		}
		readyPods := 0
		for _, p := range pods {
			if ready(p) {
				readyPods++
			}
		}
		if readyPods != n {
			return false, fmt.Errorf("%d of %d ipledgerd pods ready", readyPods, n)
		}
		return cl.nodesReady()
	}); err != nil {
		out, _ := c.Kubectl("describe", "pods", "-n", "ipledger")
		t.Fatalf("ipledger not installed: %v\n%s", err, out)
	}
	t.Logf("%s: %d agents and nodes Ready in %v", what, n, time.Since(t0).Round(time.Millisecond))
}

// nodesReady reports whether every node's Node is Ready.
func (cl *cluster) nodesReady() (bool, error) {
	for _, nd := range cl.nodes {
		st, err := cl.c.Kubectl("get", "node", nd.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if st != "True" {
			return false, fmt.Errorf("node %s Ready=%q (%v)", nd.Name, st, err)
		}
	}
	return true, nil
}

func ready(p kubeenv.Pod) bool {
	if p.Status.Phase != "Running" || p.Metadata.DeletionTimestamp != nil {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// podCIDR is the Node's spec.podCIDR.
func (cl *cluster) podCIDR(node string) netip.Prefix {
	cl.t.Helper()
	out := cl.c.MustKubectl(cl.t, "get", "node", node, "-o", "jsonpath={.spec.podCIDR}")
	p, err := netip.ParsePrefix(strings.TrimSpace(out))
	if err != nil {
		cl.t.Fatalf("node %s podCIDR %q: %v", node, out, err)
	}
	return p
}

// server starts a busybox httpd pod srv-NODE on node answering "ok" on port
// 8080 (its log names each client's address) and returns its address once it
// runs.
func (cl *cluster) server(node string) netip.Addr {
	cl.t.Helper()
	return cl.httpd("srv-"+node, node, map[string]string{"app": "srv"}, "ok", 0)
}

// fetch runs a pod on node that fetches http://target:8080/ from each target
// over TCP (5 s each) and reports whether all answered "ok", with the pod's
// log (which says which did not) and its address.
func (cl *cluster) fetch(node string, targets []netip.Addr) (bool, string, netip.Addr) {
	cl.t.Helper()
	var script strings.Builder
	script.WriteString("rc=0; ")
	for _, a := range targets {
		// nc, not wget: Debian's static busybox wget segfaults (here on the host too).
		fmt.Fprintf(&script, "if [ \"$(printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 5 %[1]s 8080 | /bin/busybox tail -n 1)\" = ok ]; then echo %[1]s ok; else echo %[1]s FAIL; rc=1; fi; ", a)
	}
	script.WriteString("exit $rc")
	return cl.runPod(node, "client-"+node, script.String())
}

// runPod runs a pod named name on node with script to completion and reports
// whether it succeeded, with its log as `kubectl logs` reads it (through the
// apiserver's egress to the node's kubelet) and its address.
func (cl *cluster) runPod(node, name, script string) (bool, string, netip.Addr) {
	cl.t.Helper()
	spec := busyboxPod(node, "probe", "/bin/busybox", "sh", "-c", script)
	spec.RestartPolicy = corev1.RestartPolicyNever
	cl.c.Apply(cl.t, podManifest(name, map[string]string{"app": "probe"}, spec))
	var phase, ip string
	if err := kubeenv.WaitFor(3*time.Minute, 500*time.Millisecond, func() (bool, error) {
		pods, err := cl.c.Pods("default", "app=probe")
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
		out, _ := cl.c.Kubectl("describe", "pod", name)
		cl.t.Fatalf("%v\n%s", err, out)
	}
	addr, _ := netip.ParseAddr(ip)
	return phase == "Succeeded", cl.logs(name), addr
}

// logs is `kubectl logs pod`: the apiserver reaches the pod's kubelet inside
// its node's namespace through the egress proxy (kubeenv's egress.go).
func (cl *cluster) logs(pod string) string {
	cl.t.Helper()
	out, err := cl.c.Kubectl("logs", pod)
	if err != nil {
		cl.t.Fatalf("kubectl logs %s: %v\n%s", pod, err, out)
	}
	return out
}

// hostPortPod starts a busybox httpd pod on node answering "ok" on container
// port 8080, published on the node as hostPort, and waits until it runs.
func (cl *cluster) hostPortPod(node string, hostPort int) {
	cl.t.Helper()
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

// TestThreeNodes (issue 25): on three kubelet nodes with deploy/ipledger.yaml
// applied unchanged,
//   - a pod on each node reaches a pod on every other node over TCP, through
//     the routes the agents program, and the server sees the client pod's own
//     address (no NAT between pods);
//   - a pod reaches the outside namespace, which sees its node's address
//     (masquerade);
//   - a hostPort pod answers on its node's address, from outside and from
//     another node;
//   - every node reaches every pod;
//   - kubectl logs and exec reach every node's kubelet;
//   - ClusterIP Services through kube-proxy (checkServices);
//   - kubectl ipledger over the three nodes (checkPlugin, issue 27);
//   - each node on the selected containerd, the conflist at the cniVersion it
//     loads, privileged pods admitted (checkRuntime);
//   - the Nodes NotReady while the agents are down, Ready once they are back,
//     pods not scheduled meanwhile (checkStatusDrivesNodes).
func TestThreeNodes(t *testing.T) {
	cl := start(t, 3)
	cl.checkRuntime()
	cl.checkNetwork()
	cl.checkPlugin()
	cl.checkServices()
	cl.checkStatusDrivesNodes()
}

// podNetwork is the range of every pod's address: kube-proxy's
// --cluster-cidr (the Nodes' podCIDRs, or the cluster-wide pool).
func (cl *cluster) podNetwork() string {
	if cl.clusterMode {
		return clusterPool.String()
	}
	return cl.c.ClusterCIDR()
}

// podRange is where node's pods get their addresses: its podCIDR, or the
// cluster-wide pool in cluster mode.
func (cl *cluster) podRange(node string) netip.Prefix {
	if cl.clusterMode {
		return clusterPool
	}
	return cl.podCIDR(node)
}

// mesh starts a server pod on every node (its address checked against the
// node's podRange), logs each node's routes (`ip route show` with
// routeFilter), then runs a client pod on every node fetching from every other
// node's server over TCP. It returns the servers' and clients' addresses by
// node and the nodes whose client did not reach every other node's server.
func (cl *cluster) mesh(routeFilter ...string) (servers, clients map[string]netip.Addr, failed []string) {
	t := cl.t
	t.Helper()
	servers = map[string]netip.Addr{}
	for _, nd := range cl.nodes {
		ip := cl.server(nd.Name)
		if cidr := cl.podRange(nd.Name); !cidr.Contains(ip) {
			t.Fatalf("pod address %s on %s not in %s", ip, nd.Name, cidr)
		}
		servers[nd.Name] = ip
	}
	for _, nd := range cl.nodes {
		out, err := exec.Command("ip", append([]string{"-n", nd.Host.Netns, "route", "show"}, routeFilter...)...).CombinedOutput()
		t.Logf("%s (%s): ip route show %s: %v\n%s", nd.Name, nd.IP, strings.Join(routeFilter, " "), err, out)
	}
	clients = map[string]netip.Addr{}
	for _, nd := range cl.nodes {
		var targets []netip.Addr
		for name, ip := range servers {
			if name != nd.Name {
				targets = append(targets, ip)
			}
		}
		ok, log, ip := cl.fetch(nd.Name, targets)
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
	t := cl.t
	servers, clients, failed := cl.mesh("proto", "201") // ipledger's route protocol
	for _, node := range failed {
		t.Errorf("a pod on %s did not reach every other node's pod", node)
	}
	// Every node reaches every pod, its own and the other nodes'.
	for _, nd := range cl.nodes {
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
	for _, srv := range cl.nodes {
		log := cl.logs("srv-" + srv.Name)
		for node, ip := range clients {
			// busybox httpd names IPv4 clients as [::ffff:A]:PORT.
			if node != srv.Name && !strings.Contains(log, "[::ffff:"+ip.String()+"]:") {
				t.Errorf("srv-%s did not see client-%s by its pod address %s:\n%s", srv.Name, node, ip, log)
			}
		}
	}
	// kubectl exec, through the apiserver's egress to each kubelet.
	for _, nd := range cl.nodes {
		out, err := cl.c.Kubectl("exec", "srv-"+nd.Name, "--", "/bin/busybox", "cat", "/tmp/index.html")
		if err != nil || strings.TrimSpace(out) != "ok" {
			t.Errorf("kubectl exec srv-%s: %q, %v", nd.Name, out, err)
		}
	}
	// Masquerade: the outside sees each node's address, never a pod's.
	netnodes.ServeSource(t, cl.env.Outside.NS, ":8081")
	for _, nd := range cl.nodes {
		ok, log, ip := cl.runPod(nd.Name, "outside-"+nd.Name,
			fmt.Sprintf("/bin/busybox nc -w 5 %s 8081 </dev/null", netnodes.OutsideV4))
		t.Logf("pod %s on %s reached the outside as %q", ip, nd.Name, strings.TrimSpace(log))
		if !ok || strings.TrimSpace(log) != nd.IP {
			t.Errorf("a pod on %s reached the outside as %q (ok %v), want its node's address %s", nd.Name, log, ok, nd.IP)
		}
	}
	// hostPort on node1: answered on node1's address from the outside and from
	// node0.
	const hostPort = 18080
	cl.hostPortPod("node1", hostPort)
	at := net.JoinHostPort(cl.nodes[1].IP, fmt.Sprint(hostPort))
	for _, from := range []*netnodes.NS{cl.env.Outside.NS, cl.nodes[0].Host.NS} {
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
		for _, nd := range cl.nodes {
			d, _ := exec.Command("nsenter", "-t", fmt.Sprint(nd.NSPID()), "--net", "--", "iptables-save", "-t", "nat").CombinedOutput()
			t.Logf("%s:\n%s\n%s", nd.Name, nd.Host.Dump(), d)
		}
	}
}

// clusterPool is deploy/cluster's cluster-wide pool.
var clusterPool = netip.MustParsePrefix("10.244.0.0/16")

type ipBlocks struct {
	Items []struct {
		Spec struct {
			CIDR  string `json:"cidr"`
			Owner string `json:"owner"`
		} `json:"spec"`
	} `json:"items"`
}

// TestThreeNodesClusterMode (issue 25): `kubectl apply -k deploy/cluster`
// unchanged on three kubelet nodes: pods get addresses from blocks of the
// cluster-wide pool, each node routes every block another node owns (as the
// IPBlocks on the API say) via that node's address and makes its own
// unreachable (never out of the default route),
// TestThreeNodes' checks, checkPlugin (with kubectl ipledger blocks) and
// checkServices pass, and the cluster audit balances (no address held on two nodes).
func TestThreeNodesClusterMode(t *testing.T) {
	cl := startMode(t, 3, true)
	cl.checkNetwork()
	cl.checkPlugin()
	cl.checkServices()
	var blocks ipBlocks
	if err := cl.c.GetJSON(&blocks, "ipblocks"); err != nil {
		t.Fatal(err)
	}
	ipOf := map[string]string{}
	for _, nd := range cl.nodes {
		ipOf[nd.Name] = nd.IP
	}
	for _, nd := range cl.nodes {
		var want []string
		for _, b := range blocks.Items {
			switch b.Spec.Owner {
			case "":
			case nd.Name:
				want = append(want, "unreachable "+b.Spec.CIDR)
			default:
				want = append(want, b.Spec.CIDR+" via "+ipOf[b.Spec.Owner])
			}
		}
		var got string
		err := kubeenv.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, error) {
			out, err := exec.Command("ip", "-n", nd.Host.Netns, "route", "show", "proto", "201").CombinedOutput()
			got = string(out)
			for _, w := range want {
				if !strings.Contains(got, w+" ") {
					return false, fmt.Errorf("no route %q: %v", w, err)
				}
			}
			return true, nil
		})
		t.Logf("%s (%s): ip route show proto 201:\n%s", nd.Name, nd.IP, got)
		if err != nil {
			t.Errorf("%s: %v", nd.Name, err)
		}
	}
	// Every node's leases against each other and against the API's blocks.
	args := []string{"cluster-audit"}
	for _, nd := range cl.nodes {
		args = append(args, "--socket", nd.HostPath("/run/ipledger/ipledger.sock"))
	}
	out, err := exec.Command(filepath.Join(agentenv.Bin(t), "ipledgerctl"), args...).CombinedOutput()
	t.Logf("ipledgerctl cluster-audit over %d nodes:\n%s", len(cl.nodes), out)
	if err != nil || !strings.Contains(string(out), fmt.Sprintf(": %d nodes,", len(cl.nodes))) {
		t.Errorf("cluster-audit: %v", err)
	}
}
