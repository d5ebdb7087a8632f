//go:build kubelet

// Package kube_test runs ipledger on a real one-node Kubernetes cluster
// (internal/testenv/kubeenv): the image from internal/image (what `make image`
// writes), installed by applying deploy/ipledger.yaml, and pods created by a
// real kubelet through a real containerd. One cluster serves every scenario,
// in sequence; each scenario ends with zero leases and the audit balanced.
package kube_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netenv"
)

// The node's pool in these tests: a /24 no other test here uses, on host
// routes to veths only (never routed off the machine).
const (
	poolSubnet = "10.236.0.0/24"
	poolPrefix = "10.236.0." // poolSubnet's addresses, for history
	podImage   = "ipledger.local/busybox:test"
	network    = "k8s-pod-network"
)

type node struct {
	c        *kubeenv.Cluster
	bin      string // ipledger binaries (ipledgerctl for the checks)
	sock     string // the agent's socket on the host
	stateDir string // the agent's state dir on the host
	manifest string // deploy/ipledger.yaml as applied
	metrics  int    // the agent's metrics port on the node's loopback
}

// render points a manifest from deploy/ at the test node: its host paths at
// the node's dirs (the agent's state dir at stateDir), its pool at
// poolSubnet, its metrics port at n.metrics, shorter reconcile timings.
func (n *node) render(m, stateDir string) (string, error) {
	c := n.c
	for _, r := range [][2]string{
		{"/opt/cni/bin", c.CNIBinDir},
		{"/etc/cni/net.d", c.CNIConfDir},
		{"/var/lib/ipledger", stateDir},
		{"/run/ipledger", filepath.Dir(n.sock)},
		{"unix:///run/containerd/containerd.sock", c.Containerd.Endpoint()},
		{"/run/containerd", filepath.Dir(strings.TrimPrefix(c.Containerd.Endpoint(), "unix://"))},
		{"/run/netns", c.NetnsDir},
		// this node is the host itself: its routes and netfilter rules are not the
		// test's (cluster mode would put unreachable routes of its blocks there);
		// test/kubenodes runs the node network in namespaces of its own
		{`"--node-name", "$(NODE_NAME)"]`, `"--node-name", "$(NODE_NAME)", "--routes=false", "--masquerade=false"]`},
		// the agent reaches the API server on the host's loopback: this cluster
		// runs no kube-proxy for the kubernetes Service's ClusterIP
		{"            - name: POD_NAMESPACE\n", fmt.Sprintf("            - {name: KUBERNETES_SERVICE_HOST, value: \"127.0.0.1\"}\n            - {name: KUBERNETES_SERVICE_PORT, value: \"%d\"}\n            - name: POD_NAMESPACE\n", c.APIPort())},
		{"127.0.0.1:9780", fmt.Sprintf("127.0.0.1:%d", n.metrics)},
		{"port: 9780", fmt.Sprintf("port: %d", n.metrics)},
		{`"--release-grace", "60s"`, `"--release-grace", "10s", "--reuse-delay", "2s"`},
		{`"--reconcile-interval", "30s"`, `"--reconcile-interval", "3s"`},
	} {
		if !strings.Contains(m, r[0]) {
			return "", fmt.Errorf("the manifest no longer holds %q; update this test's substitutions", r[0])
		}
		m = strings.ReplaceAll(m, r[0], r[1])
	}
	return m, nil
}

// busyboxImage writes a docker-archive holding Debian's static busybox.
func busyboxImage(t testing.TB, dir string) string {
	t.Helper()
	if _, err := os.Stat("/bin/busybox"); err != nil {
		out, err := exec.Command("apt-get", "install", "-y", "-qq", "busybox-static").CombinedOutput()
		if err != nil {
			t.Fatalf("install busybox-static: %v\n%s", err, out)
		}
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "busybox.tar")
	spec := image.Spec{Tag: podImage, Files: []image.File{{Path: "bin/busybox", Mode: 0o755, Data: bb}},
		Dirs: []string{"tmp", "etc", "proc", "sys", "dev"}, Entrypoint: []string{"/bin/busybox"}}
	if err := image.WriteFile(spec, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// startNode brings up the cluster and installs ipledger the way a user does:
// import the image, apply deploy/ipledger.yaml (its host paths pointed at the
// test node's dirs, its pool at poolSubnet, shorter reconcile timings).
func startNode(t testing.TB) *node {
	t.Helper()
	testenv.SkipIfShort(t, "needs a Kubernetes build") // before the image is built
	t0 := time.Now()
	bin := agentenv.Bin(t)
	dir := t.TempDir()
	spec, err := image.IpledgerSpec(bin, "ipledger:dev")
	if err != nil {
		t.Fatal(err)
	}
	imgTar := filepath.Join(dir, "ipledger-image.tar")
	if err := image.WriteFile(spec, imgTar); err != nil {
		t.Fatal(err)
	}
	kubeBin := kubeenv.Binaries(t)
	t.Logf("binaries and images ready in %v (Kubernetes %s in %s)", time.Since(t0).Round(time.Millisecond), kubeenv.Version, kubeBin)
	t1 := time.Now()
	c := kubeenv.Start(t, kubeenv.Options{Images: []string{imgTar, busyboxImage(t, dir)}})
	t.Logf("cluster up in %v", time.Since(t1).Round(time.Millisecond))
	n := &node{c: c, bin: bin, stateDir: filepath.Join(c.Dir, "ipledger-state"), sock: filepath.Join(c.Dir, "ipledger-run", "ipledger.sock")}
	raw, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if n.metrics, err = netenv.FreePort(); err != nil {
		t.Fatal(err)
	}
	m, err := n.render(string(raw), n.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	n.manifest = m
	t2 := time.Now()
	c.Apply(t, m)
	if err := kubeenv.WaitFor(2*time.Minute, 500*time.Millisecond, func() (bool, error) {
		pods, err := c.Pods("ipledger", "app=ipledgerd")
		if err != nil {
			return false, err
		}
		if len(pods) != 1 || !pods[0].Ready() {
			return false, fmt.Errorf("%d ipledgerd pods, ready %v", len(pods), len(pods) == 1 && pods[0].Ready())
		}
		st, err := c.Kubectl("get", "node", c.NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return st == "True", fmt.Errorf("node Ready=%q (%v)", st, err)
	}); err != nil {
		out, _ := c.Kubectl("describe", "pods", "-n", "ipledger")
		t.Fatalf("ipledger not installed: %v\n%s\nkubelet:\n%s", err, out, c.Log("kubelet", 30))
	}
	t.Logf("deploy/ipledger.yaml applied: agent Ready and node Ready in %v", time.Since(t2).Round(time.Millisecond))
	for _, f := range []string{filepath.Join(c.CNIBinDir, "ipledger"), filepath.Join(c.CNIBinDir, "ipledger-veth"), filepath.Join(c.CNIConfDir, "10-ipledger.conflist")} {
		fi, err := os.Lstat(f)
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("the installer did not write %s: %v", f, err)
		}
	}
	return n
}

// readyPods lists the pods of ns matching selector that are Ready.
func (n *node) readyPods(ns, selector string) ([]kubeenv.Pod, error) {
	all, err := n.c.Pods(ns, selector)
	if err != nil {
		return nil, err
	}
	var out []kubeenv.Pod
	for _, p := range all {
		if p.Ready() {
			out = append(out, p)
		}
	}
	return out, nil
}

// ctl runs ipledgerctl against the node's agent; it returns stdout and the exit code.
func (n *node) ctl(args ...string) (string, int, error) {
	cmd := exec.Command(filepath.Join(n.bin, "ipledgerctl"), append([]string{"--socket", n.sock}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return out.String(), ee.ExitCode(), fmt.Errorf("ipledgerctl %s: exit %d: %s", strings.Join(args, " "), ee.ExitCode(), errb.String())
	}
	if err != nil {
		return "", -1, err
	}
	return out.String(), 0, nil
}

func (n *node) leases() ([]api.LeaseView, error) {
	out, _, err := n.ctl("leases", "-o", "json")
	if err != nil {
		return nil, err
	}
	var ls []api.LeaseView
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		return nil, fmt.Errorf("leases -o json: %v: %q", err, out)
	}
	return ls, nil
}

func (n *node) audit() (api.Audit, int, error) {
	out, code, err := n.ctl("audit", "-o", "json")
	var a api.Audit
	if code == 0 || code == 1 {
		if jerr := json.Unmarshal([]byte(out), &a); jerr != nil {
			return a, code, fmt.Errorf("audit -o json: %v: %q", jerr, out)
		}
		return a, code, nil
	}
	return a, code, err
}

// settle waits until the node has no leases, then checks the audit balances.
func (n *node) settle(t testing.TB, timeout time.Duration) time.Duration {
	t.Helper()
	d, left := n.drain(t, timeout)
	if left > 0 {
		t.FailNow()
	}
	return d
}

// drain waits until the node has no leases and then checks the audit
// balances; it returns how long the wait took and how many leases were left
// at the timeout (an error of t, described, when not 0).
func (n *node) drain(t testing.TB, timeout time.Duration) (time.Duration, int) {
	t.Helper()
	t0 := time.Now()
	var last []api.LeaseView
	if err := kubeenv.WaitFor(timeout, 500*time.Millisecond, func() (bool, error) {
		ls, err := n.leases()
		last = ls
		return err == nil && len(ls) == 0, err
	}); err != nil {
		t.Errorf("leases left: %v: %s", err, describeLeases(last))
		return time.Since(t0), len(last)
	}
	d := time.Since(t0)
	a, code, err := n.audit()
	if err != nil || code != 0 || !a.OK || a.Leaked != 0 || a.DoubleAssigned != 0 || a.Live != 0 {
		t.Fatalf("audit after settling: exit %d err %v: %+v", code, err, a)
	}
	return d, 0
}

func describeLeases(ls []api.LeaseView) string {
	var b strings.Builder
	for _, l := range ls {
		fmt.Fprintf(&b, "\n  %s/%s %.12s %v sandbox=%s suspect=%q", l.Namespace, l.Name, l.ContainerID, l.IPs, l.Sandbox, l.Suspect)
	}
	return b.String()
}

// deployment renders a Deployment of busybox pods sleeping.
func deployment(ns, name string, replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[2]s, namespace: %[1]s}
spec:
  replicas: %[3]d
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata: {labels: {app: %[2]s}}
    spec:
      terminationGracePeriodSeconds: 1
      automountServiceAccountToken: false
      enableServiceLinks: false
      containers:
      - name: main
        image: %[4]s
        imagePullPolicy: Never
        command: ["/bin/busybox", "sleep", "100000"]
`, ns, name, replicas, podImage)
}

func (n *node) namespace(t testing.TB, ns string) {
	t.Helper()
	if _, err := n.c.Kubectl("create", "namespace", ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := n.c.Kubectl("delete", "namespace", ns, "--wait=false"); err != nil {
			t.Log(err)
		}
	})
}

// waitRunning waits until want pods match selector, all Ready with an address.
func (n *node) waitRunning(t testing.TB, ns, selector string, want int, timeout time.Duration) []kubeenv.Pod {
	t.Helper()
	var pods []kubeenv.Pod
	err := kubeenv.WaitFor(timeout, time.Second, func() (bool, error) {
		all, err := n.c.Pods(ns, selector)
		if err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range all {
			if p.Ready() && p.Status.PodIP != "" {
				pods = append(pods, p)
			}
		}
		return len(pods) == want && len(all) == want, fmt.Errorf("%d of %d pods ready (%d listed)", len(pods), want, len(all))
	})
	if err != nil {
		out, _ := n.c.Kubectl("get", "events", "-n", ns, "--sort-by=.lastTimestamp")
		t.Fatalf("pods %s in %s: %v\nevents:\n%s", selector, ns, err, tail(out, 30))
	}
	return pods
}

func (n *node) waitGone(t testing.TB, ns, selector string, timeout time.Duration) {
	t.Helper()
	if err := kubeenv.WaitFor(timeout, time.Second, func() (bool, error) {
		all, err := n.c.Pods(ns, selector)
		return err == nil && len(all) == 0, fmt.Errorf("%d pods left (%v)", len(all), err)
	}); err != nil {
		t.Fatalf("pods %s in %s not gone: %v", selector, ns, err)
	}
}

// checkLeases: every pod's address is leased to that pod (namespace, name,
// uid), distinct, in the pool, and no lease is held by anything else.
func (n *node) checkLeases(t testing.TB, pods []kubeenv.Pod) {
	t.Helper()
	n.checkLeasesIn(t, pods, poolSubnet)
}

// checkLeasesIn is checkLeases for a network whose pool is subnet.
func (n *node) checkLeasesIn(t testing.TB, pods []kubeenv.Pod, subnet string) {
	t.Helper()
	ls, err := n.leases()
	if err != nil {
		t.Fatal(err)
	}
	byIP := map[string]api.LeaseView{}
	for _, l := range ls {
		for _, c := range l.IPs {
			ip, _, _ := net.ParseCIDR(c)
			if prev, dup := byIP[ip.String()]; dup {
				t.Errorf("address %s leased twice: %s/%s and %s/%s", ip, prev.Namespace, prev.Name, l.Namespace, l.Name)
			}
			byIP[ip.String()] = l
		}
	}
	_, pool, _ := net.ParseCIDR(subnet)
	seen := map[string]string{}
	for _, p := range pods {
		ip := p.Status.PodIP
		if other, dup := seen[ip]; dup {
			t.Errorf("pods %s and %s both have %s", other, p.Metadata.Name, ip)
		}
		seen[ip] = p.Metadata.Name
		if !pool.Contains(net.ParseIP(ip)) {
			t.Errorf("pod %s has %s, outside the pool %s", p.Metadata.Name, ip, subnet)
		}
		l, ok := byIP[ip]
		if !ok {
			t.Errorf("pod %s's address %s is not in the ledger", p.Metadata.Name, ip)
			continue
		}
		if l.Name != p.Metadata.Name || l.Namespace != p.Metadata.Namespace || l.UID != p.Metadata.UID {
			t.Errorf("address %s: pod %s/%s (%s), ledger says %s/%s (%s)", ip, p.Metadata.Namespace, p.Metadata.Name, p.Metadata.UID, l.Namespace, l.Name, l.UID)
		}
	}
	if len(ls) != len(pods) {
		t.Errorf("%d leases for %d pods:%s", len(ls), len(pods), describeLeases(ls))
	}
}

// pingFromNode pings each address once from the node (bounded: one echo,
// two-second wait) with the host's busybox.
func pingFromNode(t testing.TB, ips []string) {
	t.Helper()
	for _, ip := range ips {
		if out, err := exec.Command("/bin/busybox", "ping", "-c", "1", "-W", "2", ip).CombinedOutput(); err != nil {
			t.Errorf("node -> pod %s: %v\n%s", ip, err, out)
		}
	}
}

// pingFromPod pings ip from inside a pod (kubectl exec through the kubelet
// and the runtime): one echo with a two-second wait, at most three tries; on
// failure the host's view of both ends is logged.
func (n *node) pingFromPod(t testing.TB, p kubeenv.Pod, ip string) {
	t.Helper()
	var out string
	var err error
	for try := 1; try <= 3; try++ {
		out, err = n.c.Kubectl("exec", "-n", p.Metadata.Namespace, p.Metadata.Name, "--", "/bin/busybox", "ping", "-c", "1", "-W", "2", ip)
		if err == nil {
			if try > 1 {
				t.Logf("pod %s -> %s answered at try %d", p.Metadata.Name, ip, try)
			}
			return
		}
	}
	t.Errorf("pod %s (%s) -> %s: %v\n%s\nhost view:\n%s", p.Metadata.Name, p.Status.PodIP, ip, err, out, hostView(p.Status.PodIP, ip))
}

// hostView describes the host's routes, neighbours and per-veth sysctls for
// the given pod addresses (diagnostics only).
func hostView(ips ...string) string {
	var b strings.Builder
	for _, ip := range ips {
		out, _ := exec.Command("ip", "route", "get", ip).CombinedOutput()
		fmt.Fprintf(&b, "route %s: %s", ip, out)
		out, _ = exec.Command("ip", "neigh", "show", ip).CombinedOutput()
		fmt.Fprintf(&b, "neigh %s: %s\n", ip, strings.TrimSpace(string(out)))
		f := strings.Fields(string(out))
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "dev" {
				for _, k := range []string{"forwarding", "proxy_arp", "rp_filter"} {
					v, _ := os.ReadFile("/proc/sys/net/ipv4/conf/" + f[i+1] + "/" + k)
					fmt.Fprintf(&b, "  %s %s=%s", f[i+1], k, strings.TrimSpace(string(v)))
				}
				b.WriteString("\n")
			}
		}
	}
	for _, k := range []string{"ip_forward", "conf/all/forwarding", "conf/all/rp_filter", "conf/all/proxy_arp"} {
		v, _ := os.ReadFile("/proc/sys/net/ipv4/" + k)
		fmt.Fprintf(&b, "%s=%s ", k, strings.TrimSpace(string(v)))
	}
	out, _ := exec.Command("iptables", "-w", "5", "-S", "FORWARD").CombinedOutput()
	fmt.Fprintf(&b, "\niptables FORWARD: %s", out)
	return b.String()
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func podIPs(pods []kubeenv.Pod) []string {
	var ips []string
	for _, p := range pods {
		ips = append(ips, p.Status.PodIP)
	}
	sort.Strings(ips)
	return ips
}

// TestKubernetesNode: ipledger installed from deploy/ipledger.yaml on a real
// node, then each scenario in turn.
func TestKubernetesNode(t *testing.T) {
	n := startNode(t)
	t.Run("Churn", func(t *testing.T) { churn(t, n) })
	t.Run("Seed004ContainerdRestarts", func(t *testing.T) { seed004(t, n) })
	t.Run("Seed002CrashLoopingSandboxes", func(t *testing.T) { seed002(t, n) })
	t.Run("Seed000Jobs", func(t *testing.T) { seed000(t, n) })
	t.Run("Seed001ChainedTeardownFails", func(t *testing.T) { seed001(t, n) })
	t.Run("Issue10744TeardownSkipped", func(t *testing.T) { teardownSkip(t, n) })
	t.Run("AgentDeleted", func(t *testing.T) { agentDeleted(t, n) })
	t.Run("ClusterMode", func(t *testing.T) { clusterMode(t, n) })
}
