//go:build kubelet

package kube_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// failPlugin builds test/kube/failplugin into the node's CNI bin dir as
// ipledger-testfail (a test artifact; deploy/ never installs it).
func (n *node) failPlugin(t testing.TB) {
	t.Helper()
	dst := filepath.Join(n.c.CNIBinDir, "ipledger-testfail")
	if _, err := os.Stat(dst); err == nil {
		return
	}
	cmd := exec.Command("go", "build", "-trimpath", "-o", dst, "./test/kube/failplugin")
	cmd.Dir = agentenv.RepoRoot()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build failplugin: %v\n%s", err, out)
	}
}

// withConflist changes the network the way an operator does: the ConfigMap
// of deploy/ipledger.yaml edited and applied, the DaemonSet restarted (its
// init container installs the new conflist). The original comes back when
// the test ends.
func (n *node) withConflist(t testing.TB, conflist string) {
	t.Helper()
	n.reconfigure(t, conflist)
	t.Cleanup(func() { n.reconfigure(t, "") })
}

func (n *node) reconfigure(t testing.TB, conflist string) {
	t.Helper()
	m := n.manifest
	if conflist != "" {
		start := strings.Index(m, "  ipledger.conflist: |\n")
		end := strings.Index(m[start:], "\n---")
		var b strings.Builder
		b.WriteString("  ipledger.conflist: |\n")
		for _, l := range strings.Split(strings.TrimSpace(conflist), "\n") {
			b.WriteString("    " + l + "\n")
		}
		m = m[:start] + strings.TrimSuffix(b.String(), "\n") + m[start+end:]
	}
	want := conflist
	if want == "" {
		want = `"name": "` + network + `"`
	}
	n.c.Apply(t, m)
	n.c.MustKubectl(t, "rollout", "restart", "daemonset/ipledgerd", "-n", "ipledger")
	n.c.MustKubectl(t, "rollout", "status", "daemonset/ipledgerd", "-n", "ipledger", "--timeout=2m")
	installed := filepath.Join(n.c.CNIConfDir, "10-ipledger.conflist")
	if err := kubeenv.WaitFor(time.Minute, 300*time.Millisecond, func() (bool, error) {
		b, err := os.ReadFile(installed)
		if conflist != "" {
			return err == nil && strings.TrimSpace(string(b)) == strings.TrimSpace(conflist), err
		}
		return err == nil && strings.Contains(string(b), want), err
	}); err != nil {
		t.Fatalf("conflist not installed: %v", err)
	}
	n.waitAgent(t, time.Minute)
	// containerd reloads the conflist on the directory's change event.
	time.Sleep(2 * time.Second)
}
