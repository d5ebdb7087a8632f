//go:build kubelet

// Package kubeupstream_test runs a subset of Kubernetes' own network
// conformance tests on three kubelet nodes with ipledger installed
// (internal/testenv/nodesenv): a package of its own, so that it fits go test's
// default timeout beside another kubelet package.
package kubeupstream_test

import (
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/e2eenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// TestUpstreamNetworkSubset (issue 26): a small part of Kubernetes' own
// network conformance tests, so that every `make test` notices a regression
// that the full run (make conformance) would: the four Networking Granular
// Checks for pods and a Service with endpoints on several nodes, on three
// nodes with deploy/ipledger.yaml applied unchanged.
func TestUpstreamNetworkSubset(t *testing.T) {
	rep := nodesenv.Upstream(t, nodesenv.Setup{}, e2eenv.Options{
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
