//go:build kubelet

package kubenodes_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// iptables runs iptables in nd's network namespace and returns its output.
func iptables(t testing.TB, nd *kubeenv.Node, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", nd.Host.Netns, "iptables"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: iptables %v: %v\n%s", nd.Name, args, err, out)
	}
	return string(out)
}

// forwardDrop sets nd's iptables FORWARD policy to DROP, as Docker, ufw and
// firewalld leave it: TestThreeNodes does so before ipledger is installed.
func forwardDrop(t testing.TB, nd *kubeenv.Node) {
	t.Helper()
	iptables(t, nd, "-P", "FORWARD", "DROP")
	t.Logf("%s: iptables -P FORWARD DROP", nd.Name)
}

// checkForwardDrop: deploy/ipledger.yaml, unchanged, carried pod traffic
// through drop, whose FORWARD policy was DROP before ipledger was installed
// (TestThreeNodes' NodeMode checks: pod to pod across nodes both ways, pod to
// outside showing the node's address), and `iptables -S FORWARD` on it shows
// the policy kept and the jump to ipledger's accepts.
func (cl *cluster) checkForwardDrop(drop *kubeenv.Node) {
	t := cl.T
	t.Helper()
	rules := iptables(t, drop, "-S", "FORWARD")
	t.Logf("%s: iptables -S FORWARD:\n%s", drop.Name, rules)
	if !strings.Contains(rules, "-P FORWARD DROP") || !strings.Contains(rules, "-j "+masq.ForwardChain) {
		t.Errorf("%s: iptables -S FORWARD:\n%s\nwant the policy DROP kept and the jump to %s", drop.Name, rules, masq.ForwardChain)
	}
}
