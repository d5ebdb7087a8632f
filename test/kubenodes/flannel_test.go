//go:build kubelet

package kubenodes_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// flannelConf is the conflist written into each node's /etc/cni/net.d when
// flannel is the pod network: what flannel's own CNI plugin delegates to (the
// standard bridge as the pods' default gateway, no masquerade, with
// host-local on the node's podCIDR), and portmap. host-local keeps its leases in its default dataDir,
// the node's own /var/lib/cni.
const flannelConf = "10-flannel.conflist"

func flannelConflist(podCIDR string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "cbr0",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "isDefaultGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podCIDR)
}

// installFlannel runs flanneld (kube subnet manager, host-gw) on every node,
// then writes each node's conflist on its podCIDR, and waits until every Node
// is Ready.
func (cl *cluster) installFlannel() {
	t := cl.T
	t.Helper()
	t0 := time.Now()
	for _, nd := range cl.Nodes {
		nd.StartFlannel(t, kubeenv.FlannelHostGW(cl.C.ClusterCIDR()))
	}
	for _, nd := range cl.Nodes {
		conf := flannelConflist(cl.PodCIDR(nd.Name).String())
		if err := os.WriteFile(nd.HostPath("/etc/cni/net.d/"+flannelConf), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := kubeenv.WaitFor(3*time.Minute, time.Second, cl.NodesReady); err != nil {
		t.Fatalf("flannel not installed: %v", err)
	}
	t.Logf("flanneld %s (host-gw) on %d nodes and nodes Ready in %v", kubeenv.FlannelVersion, len(cl.Nodes), time.Since(t0).Round(time.Millisecond))
}

// uninstallFlannel takes flannel off every node as an operator who switches
// pod networks would: flanneld stopped, its conflist removed, and what it and
// the bridge plugin left in the node's network deleted: the cni0 bridge, the
// host-gw routes to the other nodes' podCIDRs, and flanneld's iptables chains
// (FLANNEL-*). The next pod network starts on a node as it was before.
func (cl *cluster) uninstallFlannel() {
	t := cl.T
	t.Helper()
	cidr := netip.MustParsePrefix(cl.C.ClusterCIDR())
	for _, nd := range cl.Nodes {
		nd.StopFlannel()
		if err := os.Remove(nd.HostPath("/etc/cni/net.d/" + flannelConf)); err != nil {
			t.Fatal(err)
		}
		h, err := nodeNetlink(nd)
		if err != nil {
			t.Fatal(err)
		}
		if l, err := h.LinkByName("cni0"); err == nil {
			if err := h.LinkDel(l); err != nil {
				t.Fatalf("%s: deleting cni0: %v", nd.Name, err)
			}
		} else if !errors.As(err, new(netlink.LinkNotFoundError)) {
			t.Fatalf("%s: cni0: %v", nd.Name, err)
		}
		rs, err := h.RouteList(nil, netlink.FAMILY_V4)
		if err != nil {
			t.Fatalf("%s: routes: %v", nd.Name, err)
		}
		for _, r := range rs {
			if r.Dst == nil {
				continue
			}
			if p, ok := netip.AddrFromSlice(r.Dst.IP.To4()); ok && cidr.Contains(p) {
				if err := h.RouteDel(&r); err != nil {
					t.Fatalf("%s: deleting flannel's route %s: %v", nd.Name, r, err)
				}
			}
		}
		h.Close()
		script := `set -e
for table in filter nat mangle; do
  iptables-save -t "$table" | grep -v -- 'FLANNEL' | iptables-restore -T "$table"
done
! iptables-save | grep -q FLANNEL`
		if out, err := exec.Command("nsenter", "-t", strconv.Itoa(nd.NSPID()), "--net", "--mount", "--", "sh", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("%s: removing flanneld's iptables chains: %v\n%s", nd.Name, err, strings.TrimSpace(string(out)))
		}
	}
}
