package cniplugin

import (
	"os/exec"
	"strings"
	"testing"
)

// TestIPAMPluginLinksNoCNILibrary: the IPAM plugin binary, exec'd for every pod's ADD
// and DEL, links neither the CNI library (whose package init this package exists to
// avoid) nor the packages only it pulled in (regexp). Its tests and libcni tests link
// the library as the reference.
func TestIPAMPluginLinksNoCNILibrary(t *testing.T) {
	out, err := exec.Command(goBin(), "list", "-deps", "github.com/ipledger/ipledger/cmd/ipledger").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	pkgs := strings.Fields(string(out))
	if len(pkgs) < 5 {
		t.Fatalf("go list -deps listed only %q", pkgs)
	}
	for _, pkg := range pkgs {
		if strings.HasPrefix(pkg, "github.com/containernetworking/") || pkg == "regexp" {
			t.Errorf("cmd/ipledger links %s; the plugin's start must not pay for its package init", pkg)
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
