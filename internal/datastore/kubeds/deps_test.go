package kubeds_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestCNIPluginsLinkNoKubernetesClient: the plugins the runtime execs once per
// CNI call (cmd/ipledger, cmd/ipledger-veth) stay lean: client-go, apimachinery
// and this package are for ipledgerd and ipledgerctl only.
func TestCNIPluginsLinkNoKubernetesClient(t *testing.T) {
	for _, cmd := range []string{"cmd/ipledger", "cmd/ipledger-veth"} {
		out, err := exec.Command(goBin(), "list", "-deps", "github.com/ipledger/ipledger/"+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", cmd, err, out)
		}
		pkgs := strings.Fields(string(out))
		if len(pkgs) < 5 {
			t.Fatalf("go list -deps %s listed only %q", cmd, pkgs)
		}
		for _, pkg := range pkgs {
			if strings.HasPrefix(pkg, "k8s.io/client-go") || strings.HasPrefix(pkg, "k8s.io/apimachinery") || strings.HasSuffix(pkg, "/internal/datastore/kubeds") {
				t.Errorf("%s links %s; the CNI plugins must not carry the Kubernetes client", cmd, pkg)
			}
		}
	}
}

// goBin is the go command: from PATH (make exports /usr/local/go/bin), else where
// this project's machines have it.
func goBin() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}
