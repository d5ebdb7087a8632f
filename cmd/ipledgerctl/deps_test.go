package main

import (
	"os/exec"
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
