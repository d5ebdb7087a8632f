package kubeenv_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestE2EBuilds: the e2e suite, ginkgo and agnhost build from the pinned
// release and run, and the suite asks for the image tags kubeenv.Current
// records for it (e2eenv builds its images under those references).
func TestE2EBuilds(t *testing.T) {
	e2e, ginkgo := kubeenv.E2ETest(t)
	out, err := exec.Command(e2e, "--list-images").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "registry.k8s.io/e2e-test-images/agnhost:") {
		t.Fatalf("e2e.test --list-images: %v\n%s", err, out)
	}
	im := kubeenv.Current.Images
	for _, ref := range []string{
		"registry.k8s.io/e2e-test-images/agnhost:" + im.Agnhost,
		"registry.k8s.io/e2e-test-images/busybox:" + im.Busybox,
		"registry.k8s.io/pause:" + im.Pause,
		"registry.k8s.io/e2e-test-images/glibc-dns-testing:" + im.GlibcDNS,
		"registry.k8s.io/e2e-test-images/regression-issue-74839:" + im.Regression74839,
		"registry.k8s.io/build-image/distroless-iptables:" + im.DistrolessIptables,
	} {
		if !strings.Contains(string(out), ref+"\n") {
			t.Errorf("e2e.test of %s does not list %s: fix kubeenv.Releases from its test/utils/image/manifest.go", kubeenv.Version, ref)
		}
	}
	if out, err := exec.Command(ginkgo, "version").CombinedOutput(); err != nil {
		t.Fatalf("ginkgo version: %v\n%s", err, out)
	}
	if out, err := exec.Command(kubeenv.Agnhost(t), "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "netexec") {
		t.Fatalf("agnhost --help: %v\n%s", err, out)
	}
}
