package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestInstalledBinariesLinkNoTestCode: the binaries under cmd/ (what operators
// install) link neither the benchmark harness nor the test environment.
func TestInstalledBinariesLinkNoTestCode(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/ipledger/ipledger/cmd/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/...: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.Contains(pkg, "/internal/testenv") || strings.Contains(pkg, "/internal/bench") {
			t.Errorf("an installed binary links %s; move the code that needs it out of cmd/", pkg)
		}
	}
}

// TestPluginsLinkNoLedger: the CNI plugins speak the protocol (internal/api) only. The
// ledger's types change with its storage; the protocol's change only on purpose, and
// a plugin exec'd on every pod start does not carry the ledger's code.
func TestPluginsLinkNoLedger(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/ipledger/ipledger/cmd/ipledger", "github.com/ipledger/ipledger/cmd/ipledger-veth").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/ipledger ./cmd/ipledger-veth: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "github.com/ipledger/ipledger/internal/ledger" {
			t.Errorf("a plugin links %s; give the protocol its own type (internal/api) and map it in internal/ledgerview or the agent", pkg)
		}
	}
}

// TestAgentLinksNoClientset: ipledgerd talks to the API groups it uses through
// REST clients of its own (internal/kubenode's builtinScheme). client-go's
// typed clients, tools/events and tools/record register every API group of
// Kubernetes: linked, they make the agent's binary half again as large and
// its resident memory about 8 MiB larger, on every node.
func TestAgentLinksNoClientset(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/ipledger/ipledger/cmd/ipledgerd").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps ./cmd/ipledgerd: %v\n%s", err, out)
	}
	pkgs := strings.Fields(string(out))
	if !slices.Contains(pkgs, "k8s.io/client-go/rest") {
		t.Fatalf("go list -deps ./cmd/ipledgerd does not list k8s.io/client-go/rest: %q", pkgs)
	}
	for _, pkg := range pkgs {
		if pkg == "k8s.io/client-go/kubernetes" || strings.HasPrefix(pkg, "k8s.io/client-go/kubernetes/") ||
			pkg == "k8s.io/client-go/tools/events" || pkg == "k8s.io/client-go/tools/record" {
			t.Errorf("ipledgerd links %s; reach the API group through a REST client of internal/kubenode (restClient)", pkg)
		}
	}
}
