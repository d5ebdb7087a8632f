//go:build kubelet

package kubenodes_test

import (
	"fmt"
	"os"
	"time"

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
