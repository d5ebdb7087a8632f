package kubeenv_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestE2EBuilds: the e2e suite, ginkgo and agnhost build from the pinned
// release and run.
func TestE2EBuilds(t *testing.T) {
	e2e, ginkgo := kubeenv.E2ETest(t)
	out, err := exec.Command(e2e, "--list-images").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "registry.k8s.io/e2e-test-images/agnhost:") {
		t.Fatalf("e2e.test --list-images: %v\n%s", err, out)
	}
	if out, err := exec.Command(ginkgo, "version").CombinedOutput(); err != nil {
		t.Fatalf("ginkgo version: %v\n%s", err, out)
	}
	if out, err := exec.Command(kubeenv.Agnhost(t), "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "netexec") {
		t.Fatalf("agnhost --help: %v\n%s", err, out)
	}
}
