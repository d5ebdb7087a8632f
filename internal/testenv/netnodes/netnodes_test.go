package netnodes_test

import (
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// sourceSeen connects from ns to addr's ServeSource and returns the source
// address the listener saw.
func sourceSeen(t *testing.T, from *netnodes.NS, addr string) string {
	t.Helper()
	src, err := from.SourceSeen(netip.MustParseAddrPort(addr))
	if err != nil {
		t.Fatal(err)
	}
	return src.String()
}

func TestEnv(t *testing.T) {
	var names []string
	t.Run("build", func(t *testing.T) {
		env := netnodes.New(t, 2)
		n0, n1 := env.Node(0), env.Node(1)
		pod := env.AddPod(n0, "a1", netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00:244::5"))
		for _, ns := range []*netnodes.NS{env.L2, n0.NS, n1.NS, env.Outside.NS, pod.NS} {
			names = append(names, ns.Netns)
			if _, err := os.Stat("/run/netns/" + ns.Netns); err != nil {
				t.Errorf("namespace %s: %v", ns.Netns, err)
			}
		}
		if got := n1.Addrs(); got[0] != netip.MustParseAddr("10.250.0.12") || got[1] != netip.MustParseAddr("fd00:250::12") {
			t.Errorf("node1 addresses %v", got)
		}
		netnodes.ServeSource(t, env.Outside.NS, ":7000")
		// Nodes reach the outside over the L2 network, both families.
		if got := sourceSeen(t, n1.NS, "10.250.0.254:7000"); got != "10.250.0.12" {
			t.Errorf("outside saw %s, want node1's 10.250.0.12", got)
		}
		if got := sourceSeen(t, n0.NS, "[fd00:250::fe]:7000"); got != "fd00:250::11" {
			t.Errorf("outside saw %s, want node0's fd00:250::11", got)
		}
		// The pod reaches its node through its veth, both families.
		netnodes.ServeSource(t, n0.NS, ":7001")
		if got := sourceSeen(t, pod.NS, "10.250.0.11:7001"); got != "10.244.0.5" {
			t.Errorf("node0 saw %s, want the pod's 10.244.0.5", got)
		}
		if got := sourceSeen(t, pod.NS, "[fd00:250::11]:7001"); got != "fd00:244::5" {
			t.Errorf("node0 saw %s, want the pod's fd00:244::5", got)
		}
		if d := pod.Dump(); d != "" && !strings.Contains(d, "169.254.1.1") {
			t.Errorf("pod routes lack the gateway:\n%s", d)
		}
		// Without routes for it, the pod cannot reach outside: outside has no
		// route back to pod addresses.
		if c, err := pod.Dial("tcp", "10.250.0.254:7000", 500*time.Millisecond); err == nil {
			c.Close()
			t.Errorf("pod reached outside without masquerade")
		}
	})
	for _, n := range names {
		if _, err := os.Stat("/run/netns/" + n); !os.IsNotExist(err) {
			t.Errorf("namespace %s left after cleanup (%v)", n, err)
		}
	}
}
