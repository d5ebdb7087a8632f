package multinode_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
)

// blockRouted bounds the time from an ADD that claims a block to its route on
// every node.
const blockRouted = 5 * time.Second

// clusterRanges is cluster mode's pool: a cluster-wide range split into blocks.
const clusterRanges = `[[{"subnet":"10.80.0.0/16"}]]`

// blockViews is `ipledgerctl blocks -o json` of node i's agent.
func (c *cluster) blockViews(i int) []api.BlockView {
	c.t.Helper()
	stdout, stderr, code := agentenv.Ctl(c.t, "--socket", c.agents[i].Socket, "blocks", "-o", "json")
	if code != 0 {
		c.t.Fatalf("ipledgerctl blocks on %s exited %d: %s", c.net.Node(i).Name, code, stderr)
	}
	var bs []api.BlockView
	if err := json.Unmarshal([]byte(stdout), &bs); err != nil {
		c.t.Fatalf("ipledgerctl blocks: %v\n%s", err, stdout)
	}
	return bs
}

// blocks is node i's agent's view of the owned blocks, by CIDR.
func (c *cluster) blocks(i int) map[string]string {
	c.t.Helper()
	owned := map[string]string{}
	for _, b := range c.blockViews(i) {
		if b.Owner != "" {
			owned[b.Block] = b.Owner
		}
	}
	return owned
}

// TestClusterMode: three agents in cluster mode on the Kubernetes datastore
// (--datastore kubernetes: IPPool and IPBlock resources); pods behind node0 and
// node1 make each claim a block of the cluster-wide pool. Every node routes each
// block another node owns via the owner's address, puts an unreachable route on
// its own, and `ipledgerctl blocks` agrees with the routes.
func TestClusterMode(t *testing.T) {
	const nodes = 3
	c := newCluster(t, nodes, true)
	// the default resync: routes must follow the blocks' changes, not the resync
	c.args = []string{"--datastore", "kubernetes", "--node-network-resync", "30s"}
	for i := range nodes {
		c.createNode(i, nil)
	}
	for i := range nodes {
		c.startAgent(i)
	}
	c.dumpOnFailure()
	// no block claimed yet: no route anywhere
	time.Sleep(time.Second)
	for i := range nodes {
		if have, _ := c.routes(i); len(have) != 0 {
			t.Fatalf("%s: routes %v before any block was claimed", c.net.Node(i).Name, have)
		}
	}

	// each ADD claims a block for its node; every node routes it within
	// blockRouted, far below the resync: node2 has no pod of the network and
	// learns of the block from the datastore's watch
	var pods []*pod
	for i := range 2 {
		t1 := time.Now()
		pods = append(pods, c.addPod(i, fmt.Sprintf("c%d", i), clusterRanges))
		add := time.Since(t1)
		t1 = time.Now()
		var blk netip.Prefix
		for b, o := range c.blocks(i) {
			if p := netip.MustParsePrefix(b); o == c.net.Node(i).Name && p.Contains(pods[i].addr(true)) {
				blk = p
			}
		}
		if !blk.IsValid() {
			t.Fatalf("ipledgerctl blocks on node%d: no block of it holds its pod's %s", i, pods[i].addr(true))
		}
		for j := range nodes {
			want := route(fmt.Sprintf("%s via %s", blk, c.net.Node(i).Addr4))
			if j == i {
				want = route("unreachable " + blk.String())
			}
			c.waitRoute(j, want, blockRouted)
			t.Logf("block %s claimed by node%d (ADD took %v): on node%d %q %v after the ADD answered", blk, i, add.Round(time.Millisecond), j, want, time.Since(t1).Round(time.Millisecond))
		}
	}
	for _, p := range pods {
		serveSource(t, p.NS)
	}

	// the blocks as the agents see them: the same on every node, one per pod's node
	owners := c.blocks(0)
	for i := 1; i < nodes; i++ {
		if b := c.blocks(i); !maps.Equal(b, owners) {
			t.Fatalf("ipledgerctl blocks: %s sees %v, node0 %v", c.net.Node(i).Name, b, owners)
		}
	}
	blockOf := map[string]string{} // owner -> block
	for b, o := range owners {
		if _, dup := blockOf[o]; dup {
			t.Fatalf("node %s owns more than one block: %v", o, owners)
		}
		blockOf[o] = b
	}
	for _, p := range pods {
		name := c.net.Node(p.node).Name
		if _, ok := blockOf[name]; !ok {
			t.Fatalf("ipledgerctl blocks %v: no block of %s, which holds pod %s (%v)", owners, name, p.name, p.addrs)
		}
	}
	if len(owners) != 2 {
		t.Fatalf("ipledgerctl blocks: %v, want the blocks of node0 and node1", owners)
	}

	for i := range nodes {
		var want []route
		for b, o := range owners {
			if o == c.net.Node(i).Name {
				want = append(want, route("unreachable "+b))
				continue
			}
			for j, h := range c.net.Nodes {
				if h.Name == o {
					want = append(want, route(fmt.Sprintf("%s via %s", b, c.net.Node(j).Addr4)))
				}
			}
		}
		slices.Sort(want)
		c.waitRoutes(i, want, blockRouted)
	}
	for i := range nodes {
		_, raw := c.routes(i)
		t.Logf("ip route show proto 201 on %s (cluster mode):\n%s", c.net.Node(i).Name, raw)
	}

	for _, tc := range []struct{ from, to *pod }{{pods[0], pods[1]}, {pods[1], pods[0]}} {
		src, err := sourceSeen(tc.from.NS, tc.to.addr(true))
		if err != nil {
			t.Errorf("pod %s -> pod %s: %v", tc.from.name, tc.to.name, err)
			continue
		}
		if src != tc.from.addr(true) {
			t.Errorf("pod %s -> pod %s: the listener saw %s, want %s", tc.from.name, tc.to.name, src, tc.from.addr(true))
		}
		if _, err := ping(tc.from.NS, tc.to.addr(true)); err != nil {
			t.Error(err)
		}
	}
	for _, p := range pods {
		if _, err := sourceSeen(c.net.Node(2).NS, p.addr(true)); err != nil {
			t.Errorf("node2 -> pod %s: %v", p.name, err)
		}
	}
}
