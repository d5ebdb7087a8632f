//go:build kubelet

package kubenodes_test

import (
	"net/netip"
	"strings"

	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// bluePool is the range of checkSecondPool's IPPool blue: the second pool's
// range the conformance run uses too (one range kube-proxy's CIDR covers).
var bluePool = nodesenv.SecondPool

// checkSecondPool (issue 34 item 1), in cluster mode: an IPPool blue beside
// deploy/cluster's pool, and a namespace blue annotated ipledger.io/pool=blue.
// A pod of blue on every node gets an address of blue's range, each node
// routes blue's blocks to their owners as it does the default pool's
// (checkBlockRoutes), and pods of the two pools reach each other across nodes
// both ways: a client of blue on every node fetches from every other node's
// server of both pools, and a client of default on every node from every
// other node's server of blue. Every blue server saw the default pool's
// clients by their own pod addresses (a pool's range is a pod range no node
// masquerades), and the cluster audit balances.
func (cl *cluster) checkSecondPool() {
	t := cl.T
	t.Helper()
	cl.C.Apply(t, nodesenv.PoolManifest("blue", bluePool, 28))
	cl.C.Apply(t, nodesenv.NamespaceManifest("blue", map[string]string{nodesenv.PoolAnnotation: "blue"}))
	t.Cleanup(func() {
		// the namespace's pods first (their addresses released), then the pool
		if out, err := cl.C.Kubectl("delete", "namespace", "blue", "--wait=true", "--timeout=3m"); err != nil {
			t.Errorf("deleting namespace blue: %v\n%s", err, out)
		}
		if out, err := cl.C.Kubectl("delete", "ippool", "blue", "--wait=true", "--timeout=1m"); err != nil {
			t.Errorf("deleting IPPool blue: %v\n%s", err, out)
		}
	})
	blue, dflt := cl.inNamespace("blue"), cl.inNamespace("default")
	for _, nd := range cl.Nodes { // created together, so that they start side by side
		blue.startHttpd("bsrv-"+nd.Name, nd.Name, map[string]string{"app": "bsrv"}, "ok", 0)
		dflt.startHttpd("dsrv-"+nd.Name, nd.Name, map[string]string{"app": "dsrv"}, "ok", 0)
	}
	blueSrv, dfltSrv := map[string]netip.Addr{}, map[string]netip.Addr{}
	for _, nd := range cl.Nodes {
		blueSrv[nd.Name] = blue.waitRunning("bsrv-" + nd.Name)
		dfltSrv[nd.Name] = dflt.waitRunning("dsrv-" + nd.Name)
		if ip := blueSrv[nd.Name]; !bluePool.Contains(ip) {
			t.Errorf("pod blue/bsrv-%s on %s has %s, want an address of IPPool blue (%s)", nd.Name, nd.Name, ip, bluePool)
		}
		if ip := dfltSrv[nd.Name]; !nodesenv.ClusterPool.Contains(ip) {
			t.Errorf("pod default/dsrv-%s on %s has %s, want an address of the default pool (%s)", nd.Name, nd.Name, ip, nodesenv.ClusterPool)
		}
	}
	t.Logf("IPPool blue's servers %v, the default pool's %v", blueSrv, dfltSrv)
	cl.checkBlockRoutes()
	cl.logProtoRoutes("two pools")
	for _, nd := range cl.Nodes {
		var fromBlue, fromDefault []netip.Addr
		for name := range blueSrv {
			if name != nd.Name {
				fromBlue = append(fromBlue, blueSrv[name], dfltSrv[name])
				fromDefault = append(fromDefault, blueSrv[name])
			}
		}
		blue.startPod(nd.Name, "bclient-"+nd.Name, fetchScript(fromBlue))
		dflt.startPod(nd.Name, "dclient-"+nd.Name, fetchScript(fromDefault))
	}
	clients := map[string]netip.Addr{}
	for _, nd := range cl.Nodes {
		for _, c := range []struct {
			cl         *cluster
			name, what string
		}{{blue, "bclient-" + nd.Name, "both pools"}, {dflt, "dclient-" + nd.Name, "IPPool blue"}} {
			ok, log, ip := c.cl.waitDone(c.name)
			t.Logf("%s/%s on %s (%s):\n%s", c.cl.namespace(), c.name, nd.Name, ip, log)
			if !ok {
				t.Errorf("%s/%s on %s did not reach every other node's server of %s", c.cl.namespace(), c.name, nd.Name, c.what)
			}
			if c.cl == dflt {
				clients[nd.Name] = ip
			}
		}
	}
	// Between pools the servers see the clients' own addresses: no masquerade.
	for _, srv := range cl.Nodes {
		log := blue.logs("bsrv-" + srv.Name)
		for node, ip := range clients {
			// busybox httpd names IPv4 clients as [::ffff:A]:PORT.
			if node != srv.Name && !strings.Contains(log, "[::ffff:"+ip.String()+"]:") {
				t.Errorf("blue/bsrv-%s did not see default/dclient-%s by its pod address %s:\n%s", srv.Name, node, ip, log)
			}
		}
	}
	cl.clusterAudit()
	// the default namespace's pods go with the subtest (clean); blue's with its namespace
}
