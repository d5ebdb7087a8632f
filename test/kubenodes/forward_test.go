package kubenodes_test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// TestForwardDropNode: one of three nodes has the iptables FORWARD policy DROP
// (as Docker, ufw and firewalld leave it), set before ipledger is installed;
// deploy/ipledger.yaml, unchanged, still carries pod traffic through it: pod to
// pod across nodes both ways, and pod to outside from that node, which shows the
// outside the node's address. `iptables -S` on it shows the accepts.
func TestForwardDropNode(t *testing.T) {
	cl := startNodes(t, 3)
	drop := cl.nodes[1]
	iptables := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("ip", append([]string{"netns", "exec", drop.Host.Netns, "iptables"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: iptables %v: %v\n%s", drop.Name, args, err, out)
		}
		return string(out)
	}
	iptables("-P", "FORWARD", "DROP")
	t.Logf("%s: iptables -P FORWARD DROP", drop.Name)
	cl.installIpledger()

	_, _, failed := cl.mesh("proto", "201")
	for _, node := range failed {
		t.Errorf("a pod on %s did not reach every other node's pod (FORWARD DROP on %s)", node, drop.Name)
	}
	netnodes.ServeSource(t, cl.env.Outside.NS, ":8081")
	ok, log, ip := cl.runPod(drop.Name, "outside-"+drop.Name, fmt.Sprintf("/bin/busybox nc -w 5 %s 8081 </dev/null", netnodes.OutsideV4))
	t.Logf("pod %s on %s reached the outside as %q", ip, drop.Name, strings.TrimSpace(log))
	if !ok || strings.TrimSpace(log) != drop.IP {
		t.Errorf("a pod on %s (FORWARD DROP) reached the outside as %q (ok %v), want its node's address %s", drop.Name, log, ok, drop.IP)
	}
	rules := iptables("-S", "FORWARD")
	t.Logf("%s: iptables -S FORWARD:\n%s", drop.Name, rules)
	if !strings.Contains(rules, "-P FORWARD DROP") || !strings.Contains(rules, "-j "+masq.ForwardChain) {
		t.Errorf("%s: iptables -S FORWARD:\n%s\nwant the policy DROP kept and the jump to %s", drop.Name, rules, masq.ForwardChain)
	}
}
