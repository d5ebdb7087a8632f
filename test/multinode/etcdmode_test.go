package multinode_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// etcdPort is where each node namespace reaches etcd: a relay on the namespace's
// own loopback forwards to the etcd on the host's loopback.
const etcdPort = 2379

// etcdTTL is the agents' --node-lease-ttl (and --reclaim-quarantine): short, so that
// a lease expires and a block is reclaimed within seconds.
const etcdTTL = 3 * time.Second

// etcdRanges is the pool of TestEtcdMode: two /28 blocks, so that the third node
// can claim a block only after a dead node's block was reclaimed.
const etcdRanges = `[[{"subnet":"10.81.0.0/27"}]],"blockSize":28`

// newEtcdCluster starts a real etcd, n node namespaces with a relay to it in each,
// and no agent yet: cluster mode on the etcd datastore needs no Kubernetes.
func newEtcdCluster(t *testing.T, n int) (*cluster, *etcdenv.Embedded) {
	t.Helper()
	agentenv.Bin(t)
	e := etcdenv.StartEmbedded(t)
	c := &cluster{t: t, net: netnodes.New(t, n), agents: make([]*agentenv.Agent, n)}
	target := strings.TrimPrefix(e.Endpoints()[0], "http://")
	for _, h := range c.net.Nodes {
		relay(t, h.NS, fmt.Sprintf("127.0.0.1:%d", etcdPort), target)
	}
	return c, e
}

// startEtcdAgent starts node i's ipledgerd inside its namespace in cluster mode on
// etcd, without --node-ip: it publishes its default route's addresses (eth0's).
// extra flags come last (a flag given twice takes the last value).
func (c *cluster) startEtcdAgent(i int, extra ...string) *agentenv.Agent {
	c.t.Helper()
	h := c.net.Node(i)
	a := agentenv.Start(c.t, agentenv.Options{Netns: h.Netns, Args: append([]string{"--node-name", h.Name,
		"--datastore", "etcd", "--etcd-endpoints", fmt.Sprintf("http://127.0.0.1:%d", etcdPort),
		"--node-lease-ttl", etcdTTL.String(), "--reclaim-quarantine", etcdTTL.String(), "--reuse-delay", "200ms",
		"--node-network-resync", "30s"}, extra...)})
	c.agents[i] = a
	return a
}

// blockRoutes is what node i must hold for owners (block -> owner node name):
// an unreachable route on its own blocks, a route via the owner's IPv4 address on
// the blocks of the nodes in live.
func (c *cluster) blockRoutes(i int, owners map[string]string, live ...int) []route {
	var want []route
	for b, o := range owners {
		if o == c.net.Node(i).Name {
			want = append(want, route("unreachable "+b))
			continue
		}
		for _, j := range live {
			if c.net.Node(j).Name == o {
				want = append(want, route(fmt.Sprintf("%s via %s", b, c.net.Node(j).Addr4)))
			}
		}
	}
	slices.Sort(want)
	return want
}

// hostClean checks, when the test ends, that the host's own namespace holds no
// route of ipledger's protocol and that ipledger's nftables table there, if any,
// was not made or filled by this test (another process may own one from before):
// every agent ran inside its node's namespace.
func hostClean(t *testing.T) {
	t.Helper()
	table := func() (string, bool) {
		out, err := exec.Command("nft", "list", "table", "inet", "ipledger").CombinedOutput()
		return string(out), err == nil
	}
	_, before := table()
	t.Cleanup(func() {
		for _, fam := range []string{"-4", "-6"} {
			out, err := exec.Command("ip", fam, "route", "show", "proto", "201").CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("host: ip %s route show proto 201: %v %q, want nothing", fam, err, out)
			}
		}
		out, after := table()
		if after && (!before || strings.Contains(out, "10.81.")) {
			t.Errorf("host: ipledger's nftables table made or changed by this test (there before: %v):\n%s", before, out)
		}
	})
}

// TestEtcdMode: three agents in cluster mode on the etcd datastore, no Kubernetes:
// each publishes its node's address with its node lease and routes the other
// nodes' blocks through theirs. Pods on two nodes reach each other with their own
// addresses; a node whose agent dies keeps its routes on the others after its lease
// expired, until its block is reclaimed; the block, claimed by the third node, moves
// its route.
func TestEtcdMode(t *testing.T) {
	const nodes = 3
	c, e := newEtcdCluster(t, nodes)
	hostClean(t)
	c.dumpOnFailure()
	t0 := time.Now()
	for i := range nodes {
		c.startEtcdAgent(i)
	}
	started := time.Since(t0)

	// node0 and node2 claim the pool's two blocks; every node routes them
	pods := map[int]*pod{}
	for _, i := range []int{0, 2} {
		pods[i] = c.addPod(i, fmt.Sprintf("e%d", i), etcdRanges)
	}
	owners := c.blocks(0)
	if len(owners) != 2 {
		t.Fatalf("ipledgerctl blocks: %v, want one block of node0 and one of node2", owners)
	}
	var slowest time.Duration
	for i := range nodes {
		d := c.waitRoutes(i, c.blockRoutes(i, owners, 0, 1, 2), blockRouted)
		slowest = max(slowest, d)
	}
	routed := time.Since(t0)
	t.Logf("3 agents started in %v; every node routed both blocks %v after the first start (%v after the last ADD)",
		started.Round(time.Millisecond), routed.Round(time.Millisecond), slowest.Round(time.Millisecond))
	for i := range nodes {
		_, raw := c.routes(i)
		t.Logf("ip route show proto 201 on %s (etcd mode):\n%s", c.net.Node(i).Name, raw)
	}

	// pod to pod across nodes, with their own addresses; node1 (no pod) reaches both
	for _, p := range pods {
		serveSource(t, p.NS)
	}
	for _, tc := range []struct{ from, to *pod }{{pods[0], pods[2]}, {pods[2], pods[0]}} {
		src, err := sourceSeen(tc.from.NS, tc.to.addr(true))
		if err != nil {
			t.Fatalf("pod %s -> pod %s: %v", tc.from.name, tc.to.name, err)
		}
		if src != tc.from.addr(true) {
			t.Errorf("pod %s -> pod %s: the listener saw %s, want %s", tc.from.name, tc.to.name, src, tc.from.addr(true))
		}
		if _, err := ping(tc.from.NS, tc.to.addr(true)); err != nil {
			t.Error(err)
		}
	}
	for _, p := range pods {
		if _, err := sourceSeen(c.net.Node(1).NS, p.addr(true)); err != nil {
			t.Errorf("node1 -> pod %s: %v", p.name, err)
		}
	}

	// node2's agent dies (SIGKILL: its lease is not released); etcd expires the
	// lease; the block stays routed to node2 until it is reclaimed, then its route
	// goes on node0 and node1
	leaseKey := "/ipledger/nodes/" + c.net.Node(2).Name
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := e.Client().Watch(wctx, leaseKey)
	killed := time.Now()
	c.agents[2].Kill()
	var expired time.Time
	select {
	case resp := <-wch:
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				expired = time.Now()
			}
		}
	case <-time.After(5 * etcdTTL):
	}
	if expired.IsZero() {
		t.Fatalf("node2's lease %s not deleted by etcd within %v of the kill", leaseKey, 5*etcdTTL)
	}
	t.Logf("node2's lease expired %v after its agent was killed (TTL %v)", expired.Sub(killed).Round(time.Millisecond), etcdTTL)
	var blk2 string
	for b, o := range owners {
		if o == c.net.Node(2).Name {
			blk2 = b
		}
	}
	deadline := time.Now().Add(10 * etcdTTL)
	for {
		if _, held := c.blocks(0)[blk2]; !held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node2's block %s not reclaimed within %v", blk2, 10*etcdTTL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	reclaimed := time.Now()
	t.Logf("node2's block %s reclaimed %v after its lease expired", blk2, reclaimed.Sub(expired).Round(time.Millisecond))
	for _, i := range []int{0, 1} {
		c.waitRoutes(i, c.blockRoutes(i, owners, 0, 1), 2*etcdTTL)
		t.Logf("%s: route to node2's block gone %v after it was reclaimed", c.net.Node(i).Name, time.Since(reclaimed).Round(time.Millisecond))
	}

	// node1 claims the free block with its first pod, and the route to it moves:
	// via node1 on node0, unreachable on node1
	t1 := time.Now()
	pods[1] = c.addPod(1, "e1", etcdRanges)
	if !netip.MustParsePrefix(blk2).Contains(pods[1].addr(true)) {
		t.Fatalf("node1's pod got %v, not from the reclaimed block %s", pods[1].addrs, blk2)
	}
	moved := c.blocks(0)
	if moved[blk2] != c.net.Node(1).Name {
		t.Fatalf("ipledgerctl blocks: %v, want %s owned by node1", moved, blk2)
	}
	for _, i := range []int{0, 1} {
		c.waitRoutes(i, c.blockRoutes(i, moved, 0, 1), blockRouted)
	}
	t.Logf("block %s moved from node2 to node1: its route followed on node0 and node1 %v after node1's ADD began", blk2, time.Since(t1).Round(time.Millisecond))
	serveSource(t, pods[1].NS)
	if src, err := sourceSeen(pods[0].NS, pods[1].addr(true)); err != nil || src != pods[0].addr(true) {
		t.Errorf("pod %s -> pod %s (moved block): source %v, %v", pods[0].name, pods[1].name, src, err)
	}
}

// TestEtcdRollout: a DaemonSet rollout on the etcd datastore, one node's agent
// stopped gracefully (SIGTERM: it releases its node lease), kept down for longer
// than the lease's TTL, and started again, while pods on the other nodes ping that
// node's pod (bounded pings at an interval, throughout): no packet is lost, and
// the other nodes keep their route to its block the whole time (routes follow
// block ownership, not the lease; the quarantine is longer than the outage).
func TestEtcdRollout(t *testing.T) {
	const nodes = 3
	c, _ := newEtcdCluster(t, nodes)
	hostClean(t)
	c.dumpOnFailure()
	quarantine := 10 * etcdTTL
	for i := range nodes {
		c.startEtcdAgent(i, "--reclaim-quarantine", quarantine.String())
	}
	pods := map[int]*pod{}
	for _, i := range []int{0, 2} {
		pods[i] = c.addPod(i, fmt.Sprintf("r%d", i), etcdRanges)
	}
	owners := c.blocks(0)
	if len(owners) != 2 {
		t.Fatalf("ipledgerctl blocks: %v, want one block of node0 and one of node2", owners)
	}
	for i := range nodes {
		c.waitRoutes(i, c.blockRoutes(i, owners, 0, 1, 2), blockRouted)
	}

	// pings from pod r0 (node0) and from node1 to pod r2 (node2), every 100ms
	// through the whole rollout and until replies come back after it; at most
	// count of them
	const count, interval = 250, 100 * time.Millisecond
	type pinger struct {
		what string
		cmd  *exec.Cmd
		out  testenv.Buffer
	}
	target := pods[2].addr(true)
	var pingers []*pinger
	for _, from := range []struct {
		what string
		ns   string
	}{{"pod r0 on node0", pods[0].Netns}, {"node1", c.net.Node(1).Netns}} {
		p := &pinger{what: from.what + " -> pod r2 on node2"}
		p.cmd = exec.Command("ip", "netns", "exec", from.ns, "busybox", "ping", "-c", fmt.Sprint(count), "-i", fmt.Sprint(interval.Seconds()), "-W", "2", target.String())
		p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("busybox ping: %v", err)
		}
		pingers = append(pingers, p)
	}
	t.Cleanup(func() {
		for _, p := range pingers {
			if p.cmd.ProcessState == nil {
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
		}
	})
	began := time.Now()
	time.Sleep(time.Second) // traffic flows before the rollout begins

	stopped := time.Now()
	if err := c.agents[2].Stop(); err != nil {
		t.Fatalf("node2's agent: SIGTERM: %v", err)
	}
	down := 2 * etcdTTL
	t.Logf("node2's agent stopped gracefully in %v; down for %v (lease TTL %v, quarantine %v)", time.Since(stopped).Round(time.Millisecond), down, etcdTTL, quarantine)
	time.Sleep(down)
	for _, i := range []int{0, 1} {
		if have, want := c.routesNow(i), c.blockRoutes(i, owners, 0, 1, 2); !slices.Equal(have, want) {
			t.Errorf("%s: routes %v after node2's agent was down %v, want %v kept", c.net.Node(i).Name, have, down, want)
		}
	}
	c.agents[2].Restart()
	for i := range nodes {
		c.waitRoutes(i, c.blockRoutes(i, owners, 0, 1, 2), blockRouted)
	}
	done := time.Now()
	t.Logf("rollout of node2's agent (stop, %v down, start, routes synced) took %v", down, done.Sub(stopped).Round(time.Millisecond))
	// the echo requests sent up to the rollout's end: every one of them must be
	// answered; the pings stop (SIGINT) once a reply to a later one came back
	covered := int(done.Sub(began)/interval) + 1
	for _, p := range pingers {
		for {
			seqs := pingReplies(p.out.String())
			if slices.ContainsFunc(seqs, func(s int) bool { return s >= covered+2 }) {
				break
			}
			if len(seqs) >= count || time.Since(done) > 10*time.Second {
				t.Fatalf("%s: no reply past echo request %d (the rollout's end) within 10s; the pings ran past their window of %v or stopped:\n%s",
					p.what, covered, time.Duration(count)*interval, p.out.String())
			}
			time.Sleep(interval)
		}
		p.cmd.Process.Signal(syscall.SIGINT)
		err := p.cmd.Wait()
		out := p.out.String()
		tx, rx, ok := pingStats(out)
		if !ok {
			t.Fatalf("%s: no ping statistics (%v):\n%s", p.what, err, out)
		}
		got := map[int]bool{}
		for _, s := range pingReplies(out) {
			got[s] = true
		}
		var missing []int
		for s := range covered {
			if !got[s] {
				missing = append(missing, s)
			}
		}
		t.Logf("%s: %d packets transmitted, %d received; the %d sent during the rollout all answered unless listed: %v", p.what, tx, rx, covered, missing)
		if len(missing) > 0 {
			t.Errorf("%s: echo requests %v of the %d sent during the rollout unanswered:\n%s", p.what, missing, covered, out)
		}
	}
}

// pingReplies reads the sequence numbers of busybox ping's replies ("64 bytes
// from A: seq=N ttl=T time=X ms").
func pingReplies(out string) []int {
	var seqs []int
	for _, line := range strings.Split(out, "\n") {
		_, rest, ok := strings.Cut(line, ": seq=")
		if !ok || !strings.Contains(line, " bytes from ") {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(rest, "%d", &n); err == nil {
			seqs = append(seqs, n)
		}
	}
	return seqs
}

// pingStats reads busybox ping's "N packets transmitted, M packets received".
func pingStats(out string) (tx, rx int, ok bool) {
	for _, line := range strings.Split(out, "\n") {
		if n, _ := fmt.Sscanf(line, "%d packets transmitted, %d packets received", &tx, &rx); n == 2 {
			return tx, rx, true
		}
	}
	return 0, 0, false
}

// routesNow is node i's routes of ipledger's protocol now.
func (c *cluster) routesNow(i int) []route {
	r, _ := c.routes(i)
	return r
}
