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
