//go:build kubelet

package kube_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// apiAccess is a kustomization over the cluster overlay that only says where
// the API server is. The test cluster runs no kube-proxy, so the kubernetes
// Service's address (what the kubelet puts in KUBERNETES_SERVICE_HOST) leads
// nowhere; the agent's in-cluster config is pointed at the API server's
// loopback port instead (its certificate names 127.0.0.1). The token, the CA
// and the RBAC rights are the real ones the overlay mounts.
const apiAccess = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../cluster
patches:
  - target: {kind: DaemonSet, name: ipledgerd}
    patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata: {name: ipledgerd, namespace: ipledger}
      spec:
        template:
          spec:
            containers:
              - name: ipledgerd
                env:
                  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
                  - {name: KUBERNETES_SERVICE_PORT, value: "%s"}
`

// ipBlockList is the part of `kubectl get ipblocks -o json` the test reads.
type ipBlockList struct {
	Items []struct {
		Spec struct {
			Network string `json:"network"`
			CIDR    string `json:"cidr"`
			Owner   string `json:"owner"`
			Epoch   int64  `json:"epoch"`
			Lease   string `json:"lease"`
		} `json:"spec"`
	} `json:"items"`
}

// clusterMode: ipledger switched to cluster mode with the one command the
// README gives, `kubectl apply -k deploy/cluster` (its files as in the repo,
// host paths pointed at the test node, a fresh state dir). The agent rolls
// out Ready and serves from blocks of the cluster-wide pool claimed on the
// API: 10 pods each get an address inside an IPBlock the API says this node
// owns, `ipledgerctl blocks` agrees with the API, the leases name the pods;
// after the pods are deleted every address is released (no lease left, the
// audit and the cluster audit balance). Then node mode is applied back.
func clusterMode(t *testing.T, n *node) {
	const ns, pods = "clustermode", 10
	c := n.c
	dir := t.TempDir()
	stateDir := filepath.Join(c.Dir, "ipledger-cluster-state")
	src := filepath.Join(agentenv.RepoRoot(), "deploy", "cluster")
	if err := os.MkdirAll(filepath.Join(dir, "cluster"), 0o755); err != nil {
		t.Fatal(err)
	}
	kust, err := os.ReadFile(filepath.Join(src, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// the overlay's cluster-wide pool, pointed at the test's range
	// the overlay's conflist (its pool, the agent's socket and spool) pointed at the
	// test node, as render points the base's
	for _, r := range [][2]string{{"10.244.0.0/16", poolSubnet}, {"/run/ipledger", filepath.Dir(n.sock)}, {"/var/lib/ipledger", stateDir}} {
		if !strings.Contains(string(kust), r[0]) {
			t.Fatalf("deploy/cluster/kustomization.yaml no longer holds %q; update this test", r[0])
		}
		kust = []byte(strings.ReplaceAll(string(kust), r[0], r[1]))
	}
	base, err := os.ReadFile(filepath.Join(src, "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := n.render(string(base), stateDir)
	if err != nil {
		t.Fatalf("deploy/cluster/ipledger.yaml: %v", err)
	}
	// cluster mode's RBAC, which the overlay adds to the node-mode manifest
	rbac, err := os.ReadFile(filepath.Join(src, "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	server, err := c.Kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(strings.TrimSpace(server))
	if err != nil || u.Hostname() != "127.0.0.1" {
		t.Fatalf("API server %q: %v", server, err)
	}
	for p, b := range map[string]string{
		filepath.Join(dir, "cluster", "kustomization.yaml"): string(kust),
		filepath.Join(dir, "cluster", "ipledger.yaml"):      m,
		filepath.Join(dir, "cluster", "rbac.yaml"):          string(rbac),
		filepath.Join(dir, "access", "kustomization.yaml"):  fmt.Sprintf(apiAccess, u.Port()),
	} {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t0 := time.Now()
	c.MustKubectl(t, "apply", "-k", filepath.Join(dir, "access"))
	if out, err := c.Kubectl("rollout", "status", "-n", "ipledger", "daemonset/ipledgerd", "--timeout=110s"); err != nil {
		d, _ := c.Kubectl("describe", "pods", "-n", "ipledger")
		t.Fatalf("cluster-mode DaemonSet not rolled out: %v\n%s\n%s", err, out, d)
	}
	n.waitAgent(t, 2*time.Minute)
	// ipledgerctl blocks answers in cluster mode only.
	if err := kubeenv.WaitFor(time.Minute, 500*time.Millisecond, func() (bool, error) {
		_, degraded, err := n.blocks()
		return err == nil && !degraded, fmt.Errorf("degraded %v (%v)", degraded, err)
	}); err != nil {
		logs, _ := c.Kubectl("logs", "-n", "ipledger", "daemonset/ipledgerd", "--tail=30")
		t.Fatalf("agent not in cluster mode on the API: %v\nagent log:\n%s", err, logs)
	}
	t.Logf("kubectl apply -k deploy/cluster: agent Ready in cluster mode in %v", time.Since(t0).Round(time.Millisecond))
	// --conflist (deploy/cluster): the agent sets the network up and claims
	// the node's first block before any pod asks
	var setUp string
	if err := kubeenv.WaitFor(time.Minute, 500*time.Millisecond, func() (bool, error) {
		logs, err := c.Kubectl("logs", "-n", "ipledger", "daemonset/ipledgerd")
		for _, l := range strings.Split(logs, "\n") {
			if strings.Contains(l, `msg="network set up before its first ADD"`) {
				setUp = l
			}
		}
		return setUp != "", fmt.Errorf("the agent never said it set the network up before its first ADD (%v)", err)
	}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(setUp, "network="+network+" ") || !strings.HasSuffix(strings.TrimSpace(setUp), "blocks_claimed=1") {
		t.Fatalf("agent at start: %s; want network %s set up with one block claimed", setUp, network)
	}
	var before ipBlockList
	if err := c.GetJSON(&before, "ipblocks"); err != nil {
		t.Fatal(err)
	}
	ownedBefore := 0
	for _, b := range before.Items {
		if b.Spec.Owner == c.NodeName {
			ownedBefore++
		}
	}
	if ownedBefore != 1 {
		t.Fatalf("%s owns %d IPBlocks before its first pod, want the one claimed at start: %+v", c.NodeName, ownedBefore, before.Items)
	}

	n.namespace(t, ns)
	t1 := time.Now()
	c.Apply(t, deployment(ns, "cm", pods))
	running := n.waitRunning(t, ns, "app=cm", pods, 3*time.Minute)
	t.Logf("%d pods Running in %v", pods, time.Since(t1).Round(time.Millisecond))
	n.checkLeases(t, running)
	lease := "ipledger-" + c.NodeName
	leaseUID, err := c.Kubectl("get", "lease", "-n", "ipledger", lease, "-o", "jsonpath={.metadata.uid}")
	if err != nil || leaseUID == "" {
		t.Fatalf("node lease %s not in namespace ipledger (POD_NAMESPACE from the DaemonSet): %q %v", lease, leaseUID, err)
	}

	// The API's blocks owned by this node, and the agent's view of them.
	var bl ipBlockList
	if err := c.GetJSON(&bl, "ipblocks"); err != nil {
		t.Fatal(err)
	}
	var owned []*net.IPNet
	apiOwned := map[string]int64{}
	for _, b := range bl.Items {
		if b.Spec.Owner != c.NodeName {
			continue
		}
		_, cidr, err := net.ParseCIDR(b.Spec.CIDR)
		if err != nil {
			t.Fatalf("IPBlock cidr %q: %v", b.Spec.CIDR, err)
		}
		if b.Spec.Network != network {
			t.Errorf("IPBlock %s: network %q, want %s", b.Spec.CIDR, b.Spec.Network, network)
		}
		if b.Spec.Lease != leaseUID {
			t.Errorf("IPBlock %s: lease %q, want %q (the uid of Lease ipledger/%s)", b.Spec.CIDR, b.Spec.Lease, leaseUID, lease)
		}
		owned = append(owned, cidr)
		apiOwned[cidr.String()] = b.Spec.Epoch
	}
	if len(owned) == 0 {
		t.Fatalf("no IPBlock owned by %s: %+v", c.NodeName, bl.Items)
	}
	for _, p := range running {
		ip := net.ParseIP(p.Status.PodIP)
		in := false
		for _, b := range owned {
			in = in || b.Contains(ip)
		}
		if !in {
			t.Errorf("pod %s has %s, in no IPBlock owned by %s (%v)", p.Metadata.Name, ip, c.NodeName, sortedKeys(apiOwned))
		}
	}
	bs, degraded, err := n.blocks()
	if err != nil || degraded {
		t.Fatalf("ipledgerctl blocks: degraded %v, %v", degraded, err)
	}
	agentOwned, used := n.ownedBlocks(t, bs)
	if fmt.Sprint(sortedKeys(agentOwned)) != fmt.Sprint(sortedKeys(apiOwned)) {
		t.Errorf("ipledgerctl blocks: owned %v; the API: %v", agentOwned, apiOwned)
	}
	for b, e := range apiOwned {
		if agentOwned[b] != e {
			t.Errorf("block %s: epoch %d in ipledgerctl blocks, %d on the API", b, agentOwned[b], e)
		}
	}
	if used != pods {
		t.Errorf("ipledgerctl blocks: %d addresses used in owned blocks, want %d", used, pods)
	}
	t.Logf("%d pods, each address inside a block the API says %s owns (%v); ipledgerctl blocks agrees (used %d)", pods, c.NodeName, sortedKeys(apiOwned), used)
	if t.Failed() {
		return
	}

	t2 := time.Now()
	c.MustKubectl(t, "scale", "-n", ns, "deployment/cm", "--replicas=0")
	n.waitGone(t, ns, "app=cm", 3*time.Minute)
	settle := n.settle(t, time.Minute)
	if bs, _, err = n.blocks(); err != nil {
		t.Fatal(err)
	}
	if _, used := n.ownedBlocks(t, bs); used != 0 {
		t.Errorf("ipledgerctl blocks: %d addresses still used after the pods were deleted", used)
	}
	if out, code, err := n.ctl("cluster-audit", "--socket", n.sock); code != 0 {
		t.Errorf("cluster-audit: exit %d: %v\n%s", code, err, out)
	}
	t.Logf("pods deleted: gone in %v, every address released %v later, audit and cluster audit balanced", time.Since(t2).Round(time.Millisecond), settle.Round(time.Millisecond))

	// Back to node-local mode, as the other scenarios expect.
	c.Apply(t, n.manifest)
	if out, err := c.Kubectl("rollout", "status", "-n", "ipledger", "daemonset/ipledgerd", "--timeout=110s"); err != nil {
		t.Fatalf("node-mode DaemonSet not rolled out: %v\n%s", err, out)
	}
	n.waitAgent(t, 2*time.Minute)
	if _, _, err := n.blocks(); err == nil {
		t.Errorf("ipledgerctl blocks answered after node mode was applied back")
	}
	n.settle(t, time.Minute)
	t.Logf("deploy/ipledger.yaml applied back: node mode, ipledgerctl blocks refused, no lease, audit balanced")
}

// blocks is `ipledgerctl blocks -o json` on the node's agent (an error in
// node mode) and whether it said the node is degraded (on stderr).
func (n *node) blocks() ([]api.BlockView, bool, error) {
	cmd := exec.Command(filepath.Join(n.bin, "ipledgerctl"), "--socket", n.sock, "blocks", "-o", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, false, fmt.Errorf("ipledgerctl blocks: %v: %s", err, errb.String())
	}
	var bs []api.BlockView
	if err := json.Unmarshal(out.Bytes(), &bs); err != nil {
		return nil, false, fmt.Errorf("blocks -o json: %v: %q", err, out.String())
	}
	return bs, strings.Contains(errb.String(), "degraded"), nil
}

// ownedBlocks: the blocks the agent says it owns (CIDR -> epoch) and the
// addresses it uses in them.
func (n *node) ownedBlocks(t testing.TB, bs []api.BlockView) (map[string]int64, int) {
	t.Helper()
	owned, used := map[string]int64{}, 0
	for _, b := range bs {
		if b.State == api.BlockLost {
			t.Errorf("ipledgerctl blocks: block %s lost", b.Block)
		}
		if b.State != api.BlockOwned {
			continue
		}
		if b.Owner != n.c.NodeName {
			t.Errorf("ipledgerctl blocks: block %s owned, owner %q", b.Block, b.Owner)
		}
		owned[b.Block] = b.Epoch
		if b.Used != nil {
			used += *b.Used
		}
	}
	return owned, used
}

func sortedKeys(m map[string]int64) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
