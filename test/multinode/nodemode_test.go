package multinode_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// networkUnavailableTrue is the condition a cloud provider's node controller sets on
// a new Node until the node's network is set up.
func networkUnavailableTrue() corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue,
		Reason: "NoRouteCreated", Message: "set by the test as a cloud node controller does", LastTransitionTime: metav1.Now()}
}

// others is every node of 0..n-1 but self.
func others(self, n int) []int {
	var out []int
	for j := range n {
		if j != self {
			out = append(out, j)
		}
	}
	return out
}

// waitNetworkAvailable waits until node i's NetworkUnavailable condition is False
// and returns how long it took.
func (c *cluster) waitNetworkAvailable(i int, within time.Duration) time.Duration {
	c.t.Helper()
	t0 := time.Now()
	for {
		st, err := c.networkUnavailable(i)
		if err == nil && st == corev1.ConditionFalse {
			return time.Since(t0)
		}
		if time.Since(t0) > within {
			c.t.Fatalf("Node %s: NetworkUnavailable %q (err %v) after %v, want False", c.net.Node(i).Name, st, err, within)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNodeMode: three nodes in node mode (--node-name; pools usePodCidr), each with
// its Node's podCIDRs and a pod, and at the end a fourth whose Node has none. The
// subtests run in order on the one cluster, each from the state the one before left.
func TestNodeMode(t *testing.T) {
	const nodes = 3
	c := newCluster(t, nodes+1, false)
	for i := range nodes {
		c.createNode(i, podCIDRs(i), networkUnavailableTrue())
	}
	t0 := time.Now()
	for i := range nodes {
		c.startAgent(i)
	}
	started := time.Since(t0)
	c.dumpOnFailure()

	t.Run("routes", func(t *testing.T) {
		c := c.in(t)
		for i := range nodes {
			c.waitRoutes(i, c.nodeRoutes(i, others(i, nodes)...), 20*time.Second)
		}
		t.Logf("3 agents started in %v; every node held its routes %v after the first start",
			started.Round(time.Millisecond), time.Since(t0).Round(time.Millisecond))
		for i := range nodes {
			_, raw := c.routes(i)
			t.Logf("ip route show proto 201 on %s (ip -4 and ip -6):\n%s", c.net.Node(i).Name, raw)
		}
	})

	t.Run("NetworkUnavailable", func(t *testing.T) {
		c := c.in(t)
		for i := range nodes {
			c.waitNetworkAvailable(i, 20*time.Second)
		}
		t.Logf("NetworkUnavailable=False on every Node %v after the first agent started", time.Since(t0).Round(time.Millisecond))
	})

	var pods []*pod
	for i := range nodes {
		p := c.addPod(i, fmt.Sprintf("a%d", i), podRanges)
		for _, a := range p.addrs {
			if !slices.ContainsFunc(podCIDRs(i), func(pf netip.Prefix) bool { return pf.Contains(a) }) {
				t.Fatalf("pod %s on node%d got %s, outside the Node's podCIDRs %v", p.name, i, a, podCIDRs(i))
			}
		}
		if !p.addr(true).IsValid() || !p.addr(false).IsValid() {
			t.Fatalf("pod %s got %v, want one address of each family", p.name, p.addrs)
		}
		serveSource(t, p.NS)
		pods = append(pods, p)
	}
	for _, h := range c.net.Nodes {
		serveSource(t, h.NS)
	}
	serveSource(t, c.net.Outside.NS)

	t.Run("pod-to-pod", func(t *testing.T) {
		var conns, pings int
		for _, from := range pods {
			for _, to := range pods {
				if from == to {
					continue
				}
				for _, v4 := range []bool{true, false} {
					src, err := sourceSeen(from.NS, to.addr(v4))
					if err != nil {
						t.Errorf("pod %s -> pod %s: %v", from.name, to.name, err)
						continue
					}
					if src != from.addr(v4) {
						t.Errorf("pod %s -> pod %s (%s): the listener saw %s, want the pod's own %s", from.name, to.name, to.addr(v4), src, from.addr(v4))
					}
					conns++
					if ran, err := ping(from.NS, to.addr(v4)); err != nil {
						t.Error(err)
					} else if ran {
						pings++
					}
				}
			}
		}
		t.Logf("pod to pod across nodes: %d TCP connections saw the source pod's address, %d pings answered (none: no busybox)", conns, pings)
	})

	t.Run("node-to-pod", func(t *testing.T) {
		c := c.in(t)
		var conns int
		for _, h := range c.net.Nodes[:nodes] {
			for _, to := range pods {
				for _, v4 := range []bool{true, false} {
					if _, err := sourceSeen(h.NS, to.addr(v4)); err != nil {
						t.Errorf("%s -> pod %s: %v", h.Name, to.name, err)
						continue
					}
					conns++
				}
			}
		}
		t.Logf("every node to every pod: %d TCP connections", conns)
	})

	t.Run("masquerade", func(t *testing.T) {
		c := c.in(t)
		var conns int
		out := c.net.Outside
		for _, p := range pods {
			h := c.net.Node(p.node)
			for _, tc := range []struct{ dst, want netip.Addr }{{out.Addr4, h.Addr4}, {out.Addr6, h.Addr6}} {
				src, err := sourceSeen(p.NS, tc.dst)
				if err != nil {
					t.Errorf("pod %s -> outside: %v", p.name, err)
					continue
				}
				if src != tc.want {
					t.Errorf("pod %s -> outside %s: the listener saw %s, want node %s's %s", p.name, tc.dst, src, h.Name, tc.want)
					continue
				}
				conns++
			}
		}
		t.Logf("pod to outside: %d TCP connections, each seen from its node's address", conns)
	})

	t.Run("route-of-another-owner", func(t *testing.T) {
		c := c.in(t)
		if out, code := c.doctor(0); strings.Contains(out, "FAIL node network") {
			t.Fatalf("doctor on node0 before the conflict (exit %d):\n%s", code, out)
		}
		dst, via := podCIDRs(2)[0], c.net.Node(2).Addr4
		node0 := c.net.Node(0).Netns
		if out, err := exec.Command("ip", "-n", node0, "route", "add", dst.String(), "via", via.String(), "proto", "static", "metric", "100").CombinedOutput(); err != nil {
			t.Fatalf("ip route add %s proto static: %v %s", dst, err, out)
		}
		defer exec.Command("ip", "-n", node0, "route", "del", dst.String(), "proto", "static").Run()
		t1 := time.Now()
		// ipledger's own route for dst goes (the other owner's route decides)
		var want []route
		for _, r := range c.nodeRoutes(0, 1, 2) {
			if !strings.HasPrefix(string(r), dst.String()+" ") {
				want = append(want, r)
			}
		}
		d := c.waitRoutes(0, want, 4*resync)
		var out string
		var code int
		for {
			out, code = c.doctor(0)
			if strings.Contains(out, "route of another owner") || time.Since(t1) > 4*resync {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		var fail string
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "FAIL") && strings.Contains(line, dst.String()) && strings.Contains(line, "proto static") {
				fail = line
			}
		}
		if fail == "" || code != 2 {
			t.Fatalf("doctor on node0 (exit %d, want 2) has no FAIL line naming %s proto static:\n%s", code, dst, out)
		}
		t.Logf("route of another owner for %s: ipledger's route withdrawn in %v; doctor: %s", dst, d.Round(time.Millisecond), fail)
		// left alone over two more resyncs
		time.Sleep(2*resync + 500*time.Millisecond)
		b, err := exec.Command("ip", "-n", node0, "route", "show", dst.String()).CombinedOutput()
		if err != nil || !strings.Contains(string(b), "proto static") || strings.Contains(string(b), "proto 201") {
			t.Fatalf("route for %s on node0 after two resyncs: %v\n%s", dst, err, b)
		}
		if src, err := sourceSeen(pods[0].NS, pods[2].addr(true)); err != nil || src != pods[0].addr(true) {
			t.Errorf("pod a0 -> a2 through the other owner's route: %v (source %s)", err, src)
		}
		// the other owner's route gone: ipledger's comes back within a resync
		if out, err := exec.Command("ip", "-n", node0, "route", "del", dst.String(), "proto", "static").CombinedOutput(); err != nil {
			t.Fatalf("ip route del: %v %s", err, out)
		}
		d = c.waitRoutes(0, c.nodeRoutes(0, 1, 2), 3*resync)
		t.Logf("the other owner's route deleted: ipledger's route back in %v (resync %v)", d.Round(time.Millisecond), resync)
		if out, code := c.doctor(0); strings.Contains(out, "FAIL node network") {
			t.Errorf("doctor on node0 after the conflict ended (exit %d):\n%s", code, out)
		}
	})

	t.Run("Node-deleted", func(t *testing.T) {
		c := c.in(t)
		t1 := time.Now()
		c.deleteNode(2)
		c.waitRoutes(0, c.nodeRoutes(0, 1), 5*resync)
		d0 := time.Since(t1)
		c.waitRoutes(1, c.nodeRoutes(1, 0), 5*resync)
		d1 := time.Since(t1)
		t.Logf("Node node2 deleted: its routes gone from node0 in %v, from node1 in %v (from the delete; resync %v)",
			d0.Round(time.Millisecond), d1.Round(time.Millisecond), resync)
	})

	t.Run("Node-created-again", func(t *testing.T) {
		c := c.in(t)
		t1 := time.Now()
		c.createNode(2, podCIDRs(2), networkUnavailableTrue())
		for i := range nodes {
			c.waitRoutes(i, c.nodeRoutes(i, others(i, nodes)...), 5*resync)
		}
		d := time.Since(t1)
		dn := c.waitNetworkAvailable(2, 5*resync)
		t.Logf("Node node2 created again: every node's routes back in %v; its NetworkUnavailable=False %v after that", d.Round(time.Millisecond), dn.Round(time.Millisecond))
		if src, err := sourceSeen(pods[0].NS, pods[2].addr(true)); err != nil || src != pods[0].addr(true) {
			t.Errorf("pod a0 -> a2 after node2's Node came back: %v (source %s)", err, src)
		}
	})

	t.Run("Node-deleted-while-agent-down", func(t *testing.T) {
		c := c.in(t)
		c.agents[1].Kill()
		t1 := time.Now()
		c.deleteNode(2)
		d0 := c.waitRoutes(0, c.nodeRoutes(0, 1), 5*resync)
		if have, _ := c.routes(1); !slices.Equal(have, c.nodeRoutes(1, 0, 2)) {
			t.Fatalf("node1 (agent down) routes %v, want the stale ones %v", have, c.nodeRoutes(1, 0, 2))
		}
		time.Sleep(time.Second)
		t2 := time.Now()
		c.agents[1].Restart()
		up := time.Since(t2)
		d1 := c.waitRoutes(1, c.nodeRoutes(1, 0), 5*resync)
		t.Logf("node1's agent killed (SIGKILL), Node node2 deleted: node0 dropped the route in %v; node1's stale route gone %v after its restart (agent answering after %v); %v after the delete",
			d0.Round(time.Millisecond), (up + d1).Round(time.Millisecond), up.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
		if src, err := sourceSeen(pods[0].NS, pods[1].addr(false)); err != nil || src != pods[0].addr(false) {
			t.Errorf("pod a0 -> a1 after node1's restart: %v (source %s)", err, src)
		}
	})

	t.Run("Node-without-podCIDR", func(t *testing.T) {
		c := c.in(t)
		const i = nodes
		c.createNode(i, nil, networkUnavailableTrue())
		c.startAgent(i)
		// its agent routes to the others; the others route nothing to it
		c.waitRoutes(i, c.nodeRoutes(-1, 0, 1), 5*resync)
		t1 := time.Now()
		_, out, code := c.addPodRaw(i, "b3", podRanges)
		took := time.Since(t1)
		var ce cniError
		if err := json.Unmarshal(out, &ce); err != nil || code == 0 {
			t.Fatalf("ADD on node3 (no podCIDR) exited %d with %q, want a CNI error", code, out)
		}
		if ce.Code != 11 || !strings.Contains(ce.Msg, `"node3"`) || !strings.Contains(ce.Msg, "spec.podCIDRs") {
			t.Errorf("ADD on node3: CNI error %+v, want code 11 (try again later) naming Node \"node3\" and spec.podCIDRs", ce)
		}
		t.Logf("ADD on a node without podCIDR: code %d in %v: %s", ce.Code, took.Round(time.Millisecond), ce.Msg)
		dout, dcode := c.doctor(i)
		var fail string
		for _, line := range strings.Split(dout, "\n") {
			if strings.HasPrefix(line, "FAIL") && strings.Contains(line, "node3") && strings.Contains(line, "spec.podCIDRs") {
				fail = line
			}
		}
		if fail == "" || dcode != 2 {
			t.Errorf("doctor on node3 (exit %d, want 2) has no FAIL line naming the Node and spec.podCIDRs:\n%s", dcode, dout)
		}
		t.Logf("doctor on node3: %s", fail)
		// its routes are not in place (no podCIDR: nothing routes to its pods), so
		// NetworkUnavailable stays as the cloud node controller set it
		if st, err := c.networkUnavailable(i); err != nil || st != corev1.ConditionTrue {
			t.Errorf("Node node3 (no podCIDR): NetworkUnavailable %q (err %v), want True kept", st, err)
		}
		for _, j := range []int{0, 1} {
			if have, _ := c.routes(j); !slices.Equal(have, c.nodeRoutes(j, others(j, 2)...)) {
				t.Errorf("%s routes %v with node3 (no podCIDR) present", c.net.Node(j).Name, have)
			}
		}
	})
}
