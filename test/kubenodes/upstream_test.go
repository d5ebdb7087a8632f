package kubenodes_test

import (
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/e2eenv"
)

// upstream brings up three nodes with ipledger installed (cluster mode when
// clusterMode), kube-proxy on each, the e2e suite's images imported and
// CoreDNS deployed as kubeadm deploys it, and runs Kubernetes' e2e suite from
// the namespace outside the cluster with the focus given.
func upstream(t *testing.T, clusterMode bool, o e2eenv.Options) e2eenv.Report {
	t.Helper()
	dir := t.TempDir()
	imgs := append(e2eenv.Images(t, dir), e2eenv.CoreDNSImage(t, dir))
	cl := startWith(t, 3, clusterMode, imgs)
	for _, nd := range cl.nodes {
		nd.StartKubeProxy(t, cl.podNetwork())
	}
	t0 := time.Now()
	cl.c.Apply(t, e2eenv.CoreDNSManifest)
	if out, err := cl.c.Kubectl("rollout", "status", "-n", "kube-system", "deployment/coredns", "--timeout=3m"); err != nil {
		d, _ := cl.c.Kubectl("describe", "pods", "-n", "kube-system")
		t.Fatalf("CoreDNS not ready: %v\n%s\n%s", err, out, d)
	}
	t.Logf("CoreDNS ready in %v", time.Since(t0).Round(time.Millisecond))
	if err := cl.c.RelayAPI(t, cl.env.Outside.NS); err != nil {
		t.Fatal(err)
	}
	o.Kubeconfig, o.Kubectl, o.Netns, o.ClusterNodes = cl.c.Kubeconfig, cl.c.Bin+"/kubectl", cl.env.Outside.Netns, len(cl.nodes)
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	return e2eenv.Run(t, o)
}

// TestUpstreamNetworkSubset (issue 26): a small part of Kubernetes' own
// network conformance tests, so that every `make test` notices a regression
// that the full run (make conformance) would: the four Networking Granular
// Checks for pods and a Service with endpoints on several nodes, on three
// nodes with deploy/ipledger.yaml applied unchanged.
func TestUpstreamNetworkSubset(t *testing.T) {
	rep := upstream(t, false, e2eenv.Options{
		Focus: []string{
			`\[sig-network\] Networking Granular Checks: Pods should function for (intra|node)-pod communication: (http|udp) .*\[Conformance\]`,
			`\[sig-network\] Services should serve a basic endpoint from pods +\[Conformance\]`,
		},
		Procs:   2,
		Timeout: 20 * time.Minute,
	})
	for _, s := range rep.Ran() {
		t.Logf("%-6s %5.0fs %s", s.State, s.Seconds, s.Name)
		if s.State == "failed" {
			t.Errorf("upstream test failed: %s\n%s", s.Name, s.Failure)
		}
	}
	if n := rep.Count("passed"); n < 5 {
		t.Errorf("%d upstream tests passed, want the 5 focused", n)
	}
}
