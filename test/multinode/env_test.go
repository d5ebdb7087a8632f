// Package multinode_test proves the pod network across nodes without overlay with
// real parts only: three node network namespaces on one L2 bridge (netnodes), a real
// kube-apiserver holding their Node objects, one real ipledgerd per node running
// inside its namespace with its Kubernetes features on (--node-name, --kubeconfig),
// and pods wired by the real ipledger-veth plugin. The tests assert what users rely
// on: the routes each node holds, pods reaching each other across nodes with their
// own addresses and the outside with their node's, routes following Node deletions
// (also those made while an agent was down), a route of another owner left alone and
// reported, NetworkUnavailable cleared, a Node without podCIDR refused with the fix,
// and cluster mode's block routes on the Kubernetes datastore, and on etcd without
// Kubernetes (the nodes and their addresses from the node leases).
package multinode_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// relayPort is where each node namespace reaches the API server: a relay on the
// namespace's own loopback (127.0.0.1, which the apiserver's certificate names)
// forwards to the apiserver on the host's loopback.
const relayPort = 6443

// resync is the agents' --node-network-resync: short, so a test waits seconds.
const resync = 2 * time.Second

// network is the CNI network name of the pods (the shipped conflist's).
const network = "k8s-pod-network"

// cluster is the test's cluster: the API server, the node namespaces and the agents.
type cluster struct {
	t   *testing.T
	api *kubeenv.APIServer
	net *netnodes.Env
	// kubeconfig is every agent's: https://127.0.0.1:relayPort inside its namespace.
	kubeconfig string
	nodes      corev1client.NodeInterface
	agents     []*agentenv.Agent
	// args are each agent's flags besides those startAgent sets.
	args []string
}

// newCluster starts the API server (with the CRDs when crds is set, for cluster
// mode), n node namespaces and a relay into each; no Node object and no agent yet.
func newCluster(t *testing.T, n int, crds bool) *cluster {
	t.Helper()
	testenv.SkipIfShort(t, "needs a Kubernetes build")
	agentenv.Bin(t) // build first: the apiserver is not kept waiting
	t0 := time.Now()
	api := kubeenv.StartAPIServer(t, kubeenv.APIServerOptions{})
	t.Logf("kube-apiserver ready in %v", time.Since(t0).Round(time.Millisecond))
	cfg := api.Config()
	if crds {
		manifest, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if _, err := kubeds.InstallCRDs(ctx, cfg, manifest); err != nil {
			t.Fatal(err)
		}
		if out, err := api.Kubectl("create", "namespace", kubeds.DefaultNamespace); err != nil {
			t.Fatalf("kubectl create namespace: %v %s", err, out)
		}
	}
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, api: api, net: netnodes.New(t, n), nodes: core.Nodes(), agents: make([]*agentenv.Agent, n)}
	target := strings.TrimPrefix(api.URL, "https://")
	for _, h := range c.net.Nodes {
		relay(t, h.NS, fmt.Sprintf("127.0.0.1:%d", relayPort), target)
	}
	c.kubeconfig = agentKubeconfig(t, api.Kubeconfig)
	return c
}

// in is c reporting to t (a subtest): its helpers fail t, and what they register
// is cleaned up when t ends.
func (c *cluster) in(t *testing.T) *cluster {
	cc := *c
	cc.t = t
	return &cc
}

// agentKubeconfig writes the admin's kubeconfig pointing at the relay of the
// agent's namespace. The server name stays the apiserver's loopback address, which
// its certificate holds.
func agentKubeconfig(t *testing.T, admin string) string {
	t.Helper()
	kc, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		t.Fatal(err)
	}
	for _, cl := range kc.Clusters {
		cl.Server = fmt.Sprintf("https://127.0.0.1:%d", relayPort)
		cl.TLSServerName = "127.0.0.1"
	}
	path := filepath.Join(t.TempDir(), "agent.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// relay listens on listen inside ns and joins every connection to target, dialled
// from the test process's own (the host's) namespace, until cleanup.
func relay(t *testing.T, ns *netnodes.NS, listen, target string) {
	t.Helper()
	if err := ns.Relay(t, listen, target); err != nil {
		t.Fatal(err)
	}
}

// podCIDRs are node i's spec.podCIDRs.
func podCIDRs(i int) []netip.Prefix {
	return []netip.Prefix{
		netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i)),
		netip.MustParsePrefix(fmt.Sprintf("fd00:244:%x::/64", i)),
	}
}

// createNode creates node i's Node object: its InternalIPs are the namespace's L2
// addresses, its podCIDRs cidrs (none: a Node the controller manager has not given
// a range yet). conditions are set in its status as created.
func (c *cluster) createNode(i int, cidrs []netip.Prefix, conditions ...corev1.NodeCondition) {
	c.t.Helper()
	h := c.net.Node(i)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.Name}}
	for _, p := range cidrs {
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, p.String())
	}
	if len(cidrs) > 0 {
		n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
	}
	for _, a := range h.Addrs() {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a.String()})
	}
	n.Status.Conditions = conditions
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	created, err := c.nodes.Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create Node %s: %v", h.Name, err)
	}
	// the apiserver keeps a Node's status as created (the kubelet registers so)
	if len(created.Status.Addresses) != len(n.Status.Addresses) || len(created.Status.Conditions) != len(conditions) {
		c.t.Fatalf("Node %s created with status %+v, want %+v", h.Name, created.Status, n.Status)
	}
}

// deleteNode deletes node i's Node object.
func (c *cluster) deleteNode(i int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.nodes.Delete(ctx, c.net.Node(i).Name, metav1.DeleteOptions{}); err != nil {
		c.t.Fatalf("delete Node %s: %v", c.net.Node(i).Name, err)
	}
}

// node reads node i's Node object.
func (c *cluster) node(i int) (*corev1.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.nodes.Get(ctx, c.net.Node(i).Name, metav1.GetOptions{})
}

// networkUnavailable is node i's NetworkUnavailable condition status ("" when it
// has none).
func (c *cluster) networkUnavailable(i int) (corev1.ConditionStatus, error) {
	n, err := c.node(i)
	if err != nil {
		return "", err
	}
	for _, cd := range n.Status.Conditions {
		if cd.Type == corev1.NodeNetworkUnavailable {
			return cd.Status, nil
		}
	}
	return "", nil
}

// startAgent starts node i's ipledgerd inside its namespace, with its Kubernetes
// features on; it is stopped by PID (SIGTERM) at cleanup.
func (c *cluster) startAgent(i int, extra ...string) *agentenv.Agent {
	c.t.Helper()
	h := c.net.Node(i)
	args := append([]string{"--node-name", h.Name, "--kubeconfig", c.kubeconfig,
		"--node-network-resync", resync.String()}, c.args...)
	a := agentenv.Start(c.t, agentenv.Options{Netns: h.Netns, Args: append(args, extra...)})
	c.agents[i] = a
	return a
}

// route is one line of `ip route show proto 201`, as "DST via ADDR" or
// "unreachable DST".
type route string

// routes lists node i's routes of ipledger's protocol, both families, sorted, as
// `ip` shows them, and the raw output.
func (c *cluster) routes(i int) ([]route, string) {
	c.t.Helper()
	var out []route
	var raw strings.Builder
	for _, fam := range []string{"-4", "-6"} {
		b, err := exec.Command("ip", fam, "-n", c.net.Node(i).Netns, "route", "show", "proto", "201").CombinedOutput()
		if err != nil {
			c.t.Fatalf("ip %s -n %s route show proto 201: %v %s", fam, c.net.Node(i).Netns, err, b)
		}
		raw.Write(b)
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 0:
			case f[0] == "unreachable" && len(f) > 1:
				out = append(out, route("unreachable "+f[1]))
			default:
				r := f[0]
				if k := slices.Index(f, "via"); k > 0 && k+1 < len(f) {
					r += " via " + f[k+1]
				}
				out = append(out, route(r))
			}
		}
	}
	slices.Sort(out)
	return out, raw.String()
}

// nodeRoutes is what node self must hold in node mode: its own podCIDRs
// unreachable (self < 0: a node without podCIDR), and each other node's podCIDRs
// via that node's address of the family.
func (c *cluster) nodeRoutes(self int, others ...int) []route {
	var want []route
	if self >= 0 {
		for _, p := range podCIDRs(self) {
			want = append(want, route("unreachable "+p.String()))
		}
	}
	for _, j := range others {
		h := c.net.Node(j)
		for _, p := range podCIDRs(j) {
			via := h.Addr4
			if p.Addr().Is6() {
				via = h.Addr6
			}
			want = append(want, route(fmt.Sprintf("%s via %s", p, via)))
		}
	}
	slices.Sort(want)
	return want
}

// waitRoutes waits until node i holds exactly want and returns how long it took.
func (c *cluster) waitRoutes(i int, want []route, within time.Duration) time.Duration {
	c.t.Helper()
	t0 := time.Now()
	var have []route
	for {
		have, _ = c.routes(i)
		if slices.Equal(have, want) {
			return time.Since(t0)
		}
		if time.Since(t0) > within {
			c.t.Fatalf("%s: routes of proto 201 after %v:\n  %v\nwant\n  %v", c.net.Node(i).Name, within, have, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitRoute waits until node i holds r (among others) and returns how long it
// took.
func (c *cluster) waitRoute(i int, r route, within time.Duration) time.Duration {
	c.t.Helper()
	t0 := time.Now()
	for {
		have, _ := c.routes(i)
		if slices.Contains(have, r) {
			return time.Since(t0)
		}
		if time.Since(t0) > within {
			c.t.Fatalf("%s: no route %q of proto 201 after %v: %v", c.net.Node(i).Name, r, within, have)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// doctor runs `ipledgerctl doctor` against node i's agent and returns its output
// and exit status.
func (c *cluster) doctor(i int) (string, int) {
	c.t.Helper()
	out, errout, code := agentenv.Ctl(c.t, "--socket", c.agents[i].Socket, "doctor")
	return out + errout, code
}

// pod is a pod namespace wired by ipledger-veth behind a node.
type pod struct {
	*netnodes.NS
	name  string
	node  int
	addrs []netip.Addr
}

// addr is the pod's IPv4 (v4) or IPv6 address.
func (p *pod) addr(v4 bool) netip.Addr {
	for _, a := range p.addrs {
		if a.Is4() == v4 {
			return a
		}
	}
	return netip.Addr{}
}

// cniError is the CNI error a plugin printed.
type cniError struct {
	Code    int    `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details"`
}

// podRanges is the conflist's ipam ranges in node mode: the Node's podCIDRs.
const podRanges = `[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`

// cni execs ipledger-veth inside node i's namespace, as the container runtime
// does, for pod namespace ns, with CNI_ARGS cniArgs when given (the runtime's
// K8S_POD_* of a Kubernetes pod); it returns the plugin's stdout and exit status.
func (c *cluster) cni(i int, command, containerID string, ns *netnodes.NS, ranges string, cniArgs ...string) ([]byte, int) {
	c.t.Helper()
	bin := agentenv.Bin(c.t)
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":%q,"type":"ipledger-veth","ipam":{"type":"ipledger","socket":%q,"ranges":%s}}`,
		network, c.agents[i].Socket, ranges)
	cmd := exec.Command("ip", "netns", "exec", c.net.Node(i).Netns, filepath.Join(bin, "ipledger-veth"))
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "CNI_COMMAND=" + command, "CNI_CONTAINERID=" + containerID,
		"CNI_NETNS=/run/netns/" + ns.Netns, "CNI_IFNAME=eth0", "CNI_PATH=" + bin}
	if len(cniArgs) > 0 {
		cmd.Env = append(cmd.Env, "CNI_ARGS="+strings.Join(cniArgs, ";"))
	}
	cmd.Stdin = strings.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		c.t.Fatalf("exec ipledger-veth: %v", err)
	}
	if cmd.ProcessState.ExitCode() != 0 {
		c.t.Logf("ipledger-veth %s %s on %s exited %d: %s %s", command, containerID, c.net.Node(i).Name, cmd.ProcessState.ExitCode(), stdout.String(), stderr.String())
	}
	return stdout.Bytes(), cmd.ProcessState.ExitCode()
}

// addPodRaw makes a pod namespace and runs ADD for it behind node i (with CNI_ARGS
// cniArgs); the DEL and the namespace's removal are registered for cleanup
// whatever ADD answered.
func (c *cluster) addPodRaw(i int, name, ranges string, cniArgs ...string) (*pod, []byte, int) {
	c.t.Helper()
	ns := c.net.Namespace("p-" + name)
	cid := "cid-" + name
	p := &pod{NS: ns, name: name, node: i}
	// as a runtime does, ADD is tried again while the agent answers that its node
	// network is not ready yet (code 11: an agent just started)
	var out []byte
	var code int
	for t0 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		out, code = c.cni(i, "ADD", cid, ns, ranges, cniArgs...)
		var ce cniError
		if code == 0 || json.Unmarshal(out, &ce) != nil || ce.Code != 11 || !strings.Contains(ce.Msg, "node network not ready") || time.Since(t0) > 30*time.Second {
			break
		}
	}
	c.t.Cleanup(func() {
		if _, code := c.cni(i, "DEL", cid, ns, ranges, cniArgs...); code != 0 {
			c.t.Errorf("DEL of pod %s on %s exited %d", name, c.net.Node(i).Name, code)
		}
	})
	return p, out, code
}

// addPod makes a pod behind node i with ipledger-veth and returns it with its
// addresses (CNI_ARGS cniArgs when given).
func (c *cluster) addPod(i int, name, ranges string, cniArgs ...string) *pod {
	c.t.Helper()
	p, out, code := c.addPodRaw(i, name, ranges, cniArgs...)
	if code != 0 {
		c.t.Fatalf("ADD of pod %s on %s exited %d: %s", name, c.net.Node(i).Name, code, out)
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		c.t.Fatalf("ADD of pod %s: result %q: %v", name, out, err)
	}
	for _, ip := range res.IPs {
		pf, err := netip.ParsePrefix(ip.Address)
		if err != nil {
			c.t.Fatalf("ADD of pod %s: address %q: %v", name, ip.Address, err)
		}
		p.addrs = append(p.addrs, pf.Addr())
	}
	return p
}

// servePort is where serveSource listens.
const servePort = 8080

// serveSource answers each connection to port servePort of ns (any address,
// both families) with the source address it came from, until cleanup.
func serveSource(t *testing.T, ns *netnodes.NS) {
	t.Helper()
	netnodes.ServeSource(t, ns, fmt.Sprintf(":%d", servePort))
}

// sourceSeen connects from ns to addr's serveSource and returns the source address
// the listener saw.
func sourceSeen(from *netnodes.NS, addr netip.Addr) (netip.Addr, error) {
	return from.SourceSeen(netip.AddrPortFrom(addr, servePort))
}

// ping sends one echo request from ns to addr (busybox ping, when the machine has
// busybox) and fails unless the answer comes within 2s; ran is false when there
// is no ping to run.
func ping(ns *netnodes.NS, addr netip.Addr) (ran bool, err error) {
	bb, lerr := exec.LookPath("busybox")
	if lerr != nil {
		return false, nil
	}
	args := []string{"netns", "exec", ns.Netns, bb, "ping"}
	if addr.Is6() {
		args = append(args, "-6")
	}
	out, err := exec.Command("ip", append(args, "-c", "1", "-W", "2", addr.String())...).CombinedOutput()
	if err != nil {
		return true, fmt.Errorf("ping %s -> %s: %v %s", ns.Netns, addr, err, out)
	}
	return true, nil
}

// dumpOnFailure logs every node's addresses and routes and the agents' doctor
// when the test fails.
func (c *cluster) dumpOnFailure() {
	c.t.Cleanup(func() {
		if !c.t.Failed() {
			return
		}
		for i, h := range c.net.Nodes {
			c.t.Log(h.Dump())
			if c.agents[i] != nil && c.agents[i].PID() != 0 {
				out, code := c.doctor(i)
				c.t.Logf("doctor on %s (exit %d):\n%s", h.Name, code, out)
			}
		}
	})
}
