package kubeenv

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestControllersFlagKnownToRelease asks the built kube-controller-manager of
// the selected release which controllers it has: every controller the
// cluster turns off must be one of them (v1.37.2 refused v1.36's
// "-service-lb-controller,-cloud-node-lifecycle" and exited at start).
func TestControllersFlagKnownToRelease(t *testing.T) {
	if got := (Release{}).controllersFlag(); got != "*" {
		t.Errorf("no cloud controllers: --controllers %q, want *", got)
	}
	if got := (Release{CloudControllers: []string{"a", "b"}}).controllersFlag(); got != "*,-a,-b" {
		t.Errorf("--controllers %q, want *,-a,-b", got)
	}
	bin := Binaries(t)
	out, err := exec.Command(filepath.Join(bin, "kube-controller-manager"), "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("kube-controller-manager --help: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`All controllers: ([a-z0-9, -]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("kube-controller-manager %s --help lists no controllers:\n%s", Version, out)
	}
	known := map[string]bool{}
	for _, c := range strings.Split(string(m[1]), ",") {
		known[strings.TrimSpace(c)] = true
	}
	if !known["daemonset-controller"] {
		t.Fatalf("parsed %d controllers without daemonset-controller: %q", len(known), m[1])
	}
	for _, c := range Current.CloudControllers {
		if !known[c] {
			t.Errorf("release %s: CloudControllers names %q, which its kube-controller-manager does not have (it would refuse to start)", Version, c)
		}
	}
}
