package kubeenv_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kubeenv "github.com/ipledger/ipledger/internal/testenv/kube"
)

// TestClusterComesUpAndLeavesTheHostAsItWas starts the one-node cluster, checks
// the version stamp and the node's registration, and once it is stopped (still
// holding the host-wide lock) that the kubelet's sysctls are back and no
// kubepods cgroup is left.
func TestClusterComesUpAndLeavesTheHostAsItWas(t *testing.T) {
	t0 := time.Now()
	var c *kubeenv.Cluster
	c = kubeenv.Start(t, kubeenv.Options{AfterRestore: func() {
		for s, v := range c.SysctlsBefore() {
			b, _ := os.ReadFile("/proc/sys/" + s)
			if strings.TrimSpace(string(b)) != v {
				t.Errorf("sysctl %s is %q after the cluster, was %q", s, b, v)
			}
		}
		if left, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods"); len(left) > 0 {
			t.Errorf("kubepods cgroups left: %v", left)
		}
		ents, _ := os.ReadDir("/var/log/containers")
		for _, e := range ents {
			if target, err := os.Readlink(filepath.Join("/var/log/containers", e.Name())); err == nil && strings.HasPrefix(target, c.Dir+"/") {
				t.Errorf("kubelet's log link left: %s -> %s", e.Name(), target)
			}
		}
	}})
	t.Logf("cluster up (node registered) in %v", time.Since(t0).Round(time.Millisecond))
	out := c.MustKubectl(t, "version", "-o", "json")
	if strings.Count(out, `"gitVersion": "`+kubeenv.Version+`"`) != 2 {
		t.Fatalf("kubectl version does not report %s for client and server:\n%s", kubeenv.Version, out)
	}
	// No CNI config yet: the node is registered but not Ready.
	out = c.MustKubectl(t, "get", "node", c.NodeName, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
	if out != "False" && out != "Unknown" {
		t.Fatalf("node Ready=%q without a CNI config", out)
	}
}
