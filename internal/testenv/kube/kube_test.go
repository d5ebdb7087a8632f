package kubeenv_test

import (
	"os"
	"strings"
	"testing"
	"time"

	kubeenv "github.com/ipledger/ipledger/internal/testenv/kube"
)

// TestClusterComesUpAndLeavesTheHostAsItWas starts the one-node cluster, checks
// the version stamp and the node's registration, and after the cleanup that
// the kubelet's sysctls are back.
func TestClusterComesUpAndLeavesTheHostAsItWas(t *testing.T) {
	sysctls := map[string]string{}
	for _, s := range []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		b, err := os.ReadFile("/proc/sys/" + s)
		if err != nil {
			t.Fatal(err)
		}
		sysctls[s] = string(b)
	}
	t.Run("cluster", func(t *testing.T) {
		t0 := time.Now()
		c := kubeenv.Start(t, kubeenv.Options{})
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
	})
	for s, v := range sysctls {
		b, _ := os.ReadFile("/proc/sys/" + s)
		if string(b) != v {
			t.Errorf("sysctl %s is %q after the cluster, was %q", s, b, v)
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/kubepods"); err == nil {
		t.Error("kubepods cgroup left in the memory hierarchy")
	}
}
