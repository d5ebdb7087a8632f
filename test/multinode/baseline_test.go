package multinode_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// TestBaselineControl is the control of TestNodeMode's connectivity checks: the
// same three nodes on the same bridge, the same checks, with the known-good
// standard plugins instead of ipledger (Debian's ptp + host-local, with ptp's ipMasq)
// and the routes between nodes added by hand as flannel's host-gw adds them. A check
// that fails here as well fails for the environment's reasons, not ipledger's.
func TestBaselineControl(t *testing.T) {
	debpkg.Need(t, debpkg.CNIPlugins, debpkg.IPTables)
	const nodes = 3
	env := netnodes.New(t, nodes)
	cidr := func(i int) netip.Prefix { return netip.MustParsePrefix(fmt.Sprintf("10.245.%d.0/24", i)) }
	for i := range nodes {
		for j := range nodes {
			if i == j {
				continue
			}
			out, err := exec.Command("ip", "-n", env.Node(i).Netns, "route", "add", cidr(j).String(), "via", env.Node(j).Addr4.String()).CombinedOutput()
			if err != nil {
				t.Fatalf("route on node%d: %v %s", i, err, out)
			}
		}
		// in the node's namespace: gone with it
		out, err := exec.Command("ip", "netns", "exec", env.Node(i).Netns, "iptables", "-t", "nat", "-A", "POSTROUTING",
			"-s", "10.245.0.0/16", "!", "-d", "10.245.0.0/16", "-j", "MASQUERADE").CombinedOutput()
		if err != nil {
			t.Fatalf("masquerade rule on node%d: %v %s", i, err, out)
		}
	}
	type bpod struct {
		ns   *netnodes.NS
		addr netip.Addr
	}
	var pods []bpod
	for i := range nodes {
		ns := env.Namespace(fmt.Sprintf("bp%d", i))
		conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"baseline","type":"ptp","ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"routes":[{"dst":"0.0.0.0/0"}],"dataDir":%q}}`,
			cidr(i), filepath.Join(t.TempDir(), "host-local"))
		id := fmt.Sprintf("baseline-%d-%d", os.Getpid(), i)
		run := func(cmd string) ([]byte, error) {
			c := exec.Command("ip", "netns", "exec", env.Node(i).Netns, "/usr/lib/cni/ptp")
			c.Env = []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + id, "CNI_NETNS=/run/netns/" + ns.Netns, "CNI_IFNAME=eth0", "CNI_PATH=/usr/lib/cni", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
			c.Stdin = strings.NewReader(conf)
			return c.Output()
		}
		out, err := run("ADD")
		if err != nil {
			t.Fatalf("ptp ADD on node%d: %v %s", i, err, out)
		}
		t.Cleanup(func() {
			if out, err := run("DEL"); err != nil {
				t.Errorf("ptp DEL on node%d: %v %s", i, err, out)
			}
		})
		var res struct {
			IPs []struct {
				Address string `json:"address"`
			} `json:"ips"`
		}
		if err := json.Unmarshal(out, &res); err != nil || len(res.IPs) != 1 {
			t.Fatalf("ptp result %s: %v", out, err)
		}
		p := netip.MustParsePrefix(res.IPs[0].Address)
		serveSource(t, ns)
		pods = append(pods, bpod{ns, p.Addr()})
	}
	serveSource(t, env.Outside.NS)
	for i, from := range pods {
		for j, to := range pods {
			if i == j {
				continue
			}
			src, err := sourceSeen(from.ns, to.addr)
			if err != nil {
				t.Errorf("baseline pod %d -> pod %d: %v", i, j, err)
			} else if src != from.addr {
				t.Errorf("baseline pod %d -> pod %d: source %s, want %s", i, j, src, from.addr)
			}
		}
		for j := range nodes {
			if _, err := sourceSeen(env.Node(j).NS, from.addr); err != nil {
				t.Errorf("baseline node%d -> pod %d: %v", j, i, err)
			}
		}
		src, err := sourceSeen(from.ns, netnodes.OutsideV4)
		if err != nil {
			t.Errorf("baseline pod %d -> outside: %v", i, err)
		} else if src != env.Node(i).Addr4 {
			t.Errorf("baseline pod %d -> outside: source %s, want node%d's %s (masqueraded)", i, src, i, env.Node(i).Addr4)
		}
	}
	t.Logf("control: ptp + host-local with host-gw routes: %d pods, pod-to-pod, node-to-pod and masqueraded pod-to-outside as TestNodeMode checks them", len(pods))
}
