//go:build kubelet

package kubenodes_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/etcdenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// The scale benchmark's knobs (issue 35), read from the environment so that
// `make bench` runs the full size and a developer a smoke size:
//
//   - IPLEDGER_SCALE_DEPLOYMENTS: N, the Deployments of scaleReplicas
//     created at once (default 50: 500 pods on the three nodes).
//   - IPLEDGER_SCALE_SYSTEMS: which pod networks, comma-separated, of
//     node, kubernetes, etcd, flannel (default all four, in that order).
//   - IPLEDGER_SCALE_ROUNDS: how many times each system is measured (default
//     1); every second round measures the systems in the reverse order, and
//     the last table pools the rounds, so that each system is measured early
//     and late on the cluster alike. Run it with -benchtime 1x: Go's
//     benchmark runner would start the whole cluster again for b.N > 1.
//   - IPLEDGER_SCALE_PPROF: a directory; when set the agents run with
//     --debug-addr and a CPU profile of each node's agent during each
//     ipledger burst is written there, IPLEDGER_SCALE_PPROF_SECONDS long
//     (default 60).
const (
	scaleReplicas = 10
	// scaleMaxPods is the kubelets' maxPods, raised from the default 110 as
	// an operator would for this density: a node mode podCIDR (/24) holds
	// 254 addresses, and the agents and flanneld take none of them.
	scaleMaxPods = 250
	// scaleDebugAddr is the agents' --debug-addr on the node's loopback.
	scaleDebugAddr = "127.0.0.1:9781"
	// scaleEtcdAddr is where each node reaches the benchmark's etcd: a relay
	// on the node's loopback to the etcd on the host's.
	scaleEtcdAddr = "127.0.0.1:23790"
)

// scaleSystems are the pod networks BenchmarkScale can measure, in its order.
var scaleSystems = []string{"node", "kubernetes", "etcd", "flannel"}

// scaleResult is what one pod network measured during one burst.
type scaleResult struct {
	name       string
	rounds     int // the rounds pooled (poolRounds), 1 for one burst
	pods       int
	startup    []time.Duration // per pod, creation to Ready
	allRunning time.Duration   // Deployments created until every pod Running
	allReady   time.Duration   // … until every pod Ready
	teardown   time.Duration   // namespace deleted until every pod and sandbox gone
	netDown    time.Duration   // namespace deleted until every pod's host veth gone
	agentCPU   time.Duration   // the agents' CPU during the burst, all nodes
	execCPU    time.Duration   // containerd's reaped children's CPU (the CNI execs), all nodes
	rss, hwm   uint64          // the agents' VmRSS after the burst and VmHWM, mean per node
	apiWrites  float64         // apiserver create/update/patch/delete on group ipledger.io
	etcdRevs   int64           // etcd revisions (-1: no etcd)
	// cniAdd and cniDel: how long containerd's CNI ADDs took during the burst
	// and its DELs during the teardown, all nodes
	cniAdd, cniDel cniHist
	// agentAdd and agentDel: the agents' own time to answer those ADDs and
	// DELs (empty for flannel, whose flanneld answers none)
	agentAdd, agentDel cniHist
	// agentWait and agentWaitDown: the time the agents' threads spent
	// runnable but waiting for a CPU (schedstat) during the burst and the
	// teardown, all nodes
	agentWait, agentWaitDown time.Duration
	// delErrors: the CNI DELs containerd counted as failed during the teardown
	delErrors float64
	// machine: the whole machine's CPU counters over the burst (nodes, control
	// plane, the benchmark); apiCPU: kube-apiserver's CPU
	machine kubeenv.CPUTimes
	apiCPU  time.Duration
}

// BenchmarkScale (issue 35, make bench): Spiderpool's IPAM benchmark's shape
// (N Deployments of 10 replicas created at once; Spiderpool's is 100 on 10
// nodes of 3 vCPU) on the three kubelet nodes, with maxPods raised to
// scaleMaxPods, for flannel host-gw as the control and ipledger in node mode,
// in cluster mode on the Kubernetes datastore and in cluster mode on etcd,
// one after the other in the same run and on the same cluster: the time until
// every pod is Running and Ready, pod startup p50/p99, the pod network's own
// share of it (containerd's timer around each CNI ADD and DEL), the agents' CPU
// per pod and memory, the CNI execs' CPU per pod and the datastore writes per
// pod. It reports, it does not assert a speed.
func BenchmarkScale(b *testing.B) {
	deployments := envInt(b, "IPLEDGER_SCALE_DEPLOYMENTS", 50)
	if deployments*scaleReplicas > 3*(scaleMaxPods-10) {
		b.Fatalf("IPLEDGER_SCALE_DEPLOYMENTS=%d: %d pods do not fit three nodes of maxPods %d; use at most %d",
			deployments, deployments*scaleReplicas, scaleMaxPods, 3*(scaleMaxPods-10)/scaleReplicas)
	}
	systems := scaleSystems
	if s := os.Getenv("IPLEDGER_SCALE_SYSTEMS"); s != "" {
		systems = strings.Split(s, ",")
		for _, name := range systems {
			if !slices.Contains(scaleSystems, name) {
				b.Fatalf("IPLEDGER_SCALE_SYSTEMS: %q is none of %v", name, scaleSystems)
			}
		}
	}
	profDir := os.Getenv("IPLEDGER_SCALE_PPROF")
	profSeconds := envInt(b, "IPLEDGER_SCALE_PPROF_SECONDS", 60)
	rounds := envInt(b, "IPLEDGER_SCALE_ROUNDS", 1) * b.N

	t0 := time.Now()
	kubeenv.FlannelBinary(b)
	cl := &cluster{Cluster: nodesenv.StartNodesMaxPods(b, 3, scaleMaxPods)}
	cs := cl.client()
	for _, nd := range cl.Nodes {
		n, err := cs.CoreV1().Nodes().Get(context.Background(), nd.Name, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if got := n.Status.Capacity.Pods().Value(); got != scaleMaxPods {
			b.Fatalf("node %s: capacity.pods %d, want the maxPods %d the benchmark set", nd.Name, got, scaleMaxPods)
		}
	}
	var ec *etcdenv.Embedded
	if slices.Contains(systems, "etcd") {
		ec = etcdenv.StartEmbedded(b)
		target := strings.TrimPrefix(ec.Endpoints()[0], "http://")
		for _, nd := range cl.Nodes {
			if err := nd.Host.Relay(b, scaleEtcdAddr, target); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Logf("cluster of 3 nodes (maxPods %d) up in %v; %d Deployments × %d replicas per system", scaleMaxPods,
		time.Since(t0).Round(time.Millisecond), deployments, scaleReplicas)
	var all []scaleResult
	for i := range rounds {
		order := slices.Clone(systems)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		var rs []scaleResult
		for _, sys := range order {
			t1 := time.Now()
			ns := fmt.Sprintf("scale-%s-%d", sys, i)
			var r scaleResult
			if sys == "flannel" {
				cl.installFlannel()
				r = cl.burst(cs, sys, "flanneld", ns, deployments, nil, func() int64 { return -1 })
				cl.uninstallFlannel()
			} else {
				cl.installScale(sys, profDir != "")
				var prof func(context.Context)
				if profDir != "" {
					prof = func(ctx context.Context) {
						cl.profile(ctx, filepath.Join(profDir, fmt.Sprintf("%s-%d", sys, i)), profSeconds)
					}
				}
				rev := func() int64 { return -1 }
				if sys == "etcd" {
					rev = func() int64 { return etcdRevision(b, ec) }
				}
				r = cl.burst(cs, sys, "ipledgerd", ns, deployments, prof, rev)
				cl.uninstallIpledger()
				cl.removeLedgers()
			}
			rs = append(rs, r)
			b.Logf("%s measured in %v", sys, time.Since(t1).Round(time.Second))
		}
		b.Logf("round %d of %d (%v):\n%s", i+1, rounds, order, scaleTable(rs))
		all = append(all, rs...)
	}
	pooled := poolRounds(b, all)
	if rounds > 1 {
		b.Logf("the %d rounds pooled:\n%s", rounds, scaleTable(pooled))
	}
	for _, r := range pooled {
		b.ReportMetric(pct(r.startup, .99).Seconds(), r.name+"-p99-s")
	}
	b.Logf("benchmark took %v", time.Since(t0).Round(time.Second))
}

// envInt is the positive integer in environment variable name, or def.
func envInt(tb testing.TB, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// installScale installs ipledger as system (node, kubernetes or etcd) from
// deploy/ through kustomize, unchanged but for the agent's flags: etcd mode is
// deploy/cluster with --datastore=etcd (the last --datastore wins) and the
// relay to the benchmark's etcd; debug adds --debug-addr.
func (cl *cluster) installScale(system string, debug bool) {
	t := cl.T
	t.Helper()
	base := filepath.Join(agentenv.RepoRoot(), "deploy", "cluster")
	var args []string
	switch system {
	case "node":
		base = filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml")
	case "etcd":
		args = append(args, "--datastore=etcd", "--etcd-endpoints=http://"+scaleEtcdAddr)
	}
	if debug {
		args = append(args, "--debug-addr="+scaleDebugAddr)
	}
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, base) // kustomize takes no absolute resource
	if err != nil {
		t.Fatal(err)
	}
	var k strings.Builder
	fmt.Fprintf(&k, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [%q]\n", rel)
	if len(args) > 0 {
		k.WriteString("patches:\n  - target: {group: apps, version: v1, kind: DaemonSet, name: ipledgerd, namespace: ipledger}\n    patch: |-\n")
		for _, a := range args {
			fmt.Fprintf(&k, "      - {op: add, path: /spec/template/spec/containers/0/command/-, value: %q}\n", a)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := cl.C.Kubectl("kustomize", "--load-restrictor=LoadRestrictionsNone", dir)
	if err != nil {
		t.Fatalf("kubectl kustomize: %v\n%s", err, out)
	}
	t0 := time.Now()
	cl.ClusterMode = system != "node"
	cl.C.Apply(t, out)
	cl.WaitAgents(fmt.Sprintf("ipledger (%s, agent flags %v)", system, args), t0)
}

// burst creates deployments Deployments of scaleReplicas sleeping busybox
// pods at once in a new namespace ns, waits until every pod is Ready, and
// deletes the namespace. prof, when not nil, runs beside the burst; rev is
// the datastore's revision (-1: none).
func (cl *cluster) burst(cs *kubernetes.Clientset, name, agent, ns string, deployments int, prof func(context.Context), rev func() int64) scaleResult {
	t := cl.T
	t.Helper()
	ctx := context.Background()
	r := scaleResult{name: name, rounds: 1, pods: deployments * scaleReplicas}
	var pids, ctrd []int
	for _, nd := range cl.Nodes {
		ps, ct := agentPIDs(nd, agent), agentPIDs(nd, "containerd")
		if len(ps) != 1 || len(ct) != 1 {
			t.Fatalf("%s: %d %s and %d containerd processes in its namespaces", nd.Name, len(ps), agent, len(ct))
		}
		pids, ctrd = append(pids, ps[0]), append(ctrd, ct[0])
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A watch that resumes from its last resourceVersion when the apiserver
	// closes it (a plain one closed after 3 of 500 pods under load).
	list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Pods(ns).Watch(ctx, o)
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var profDone sync.WaitGroup
	if prof != nil {
		pctx, cancel := context.WithCancel(ctx)
		defer cancel()
		profDone.Go(func() { prof(pctx) })
	}
	veths0 := cl.hostVeths()
	cni0 := cl.containerdScrape()
	ours := name != "flannel"
	var aadd0 cniHist
	if ours {
		aadd0, _ = cl.agentHists()
	}
	wait0 := runWait(t, pids)
	api := []int{cl.C.APIServerPID()}
	machine0, api0 := kubeenv.MachineCPU(t), cpuOf(t, api)
	cpu0, exec0 := cpuOf(t, pids)*time.Duration(len(pids)), childCPU(t, ctrd)
	writes0, rev0 := apiWrites(t, cs), rev()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, deployments)
	for d := range deployments {
		wg.Go(func() {
			_, err := cs.AppsV1().Deployments(ns).Create(ctx, scaleDeployment(fmt.Sprintf("dep-%03d", d)), metav1.CreateOptions{})
			if err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	added, running, ready := map[string]time.Time{}, map[string]time.Time{}, map[string]time.Time{}
	deadline := time.After(20 * time.Minute)
	for len(ready) < r.pods || len(running) < r.pods {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("%s: pod watch closed with %d of %d pods Ready", name, len(ready), r.pods)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			now := time.Now()
			if _, seen := added[p.Name]; !seen {
				added[p.Name] = now
			}
			if _, seen := running[p.Name]; !seen && p.Status.Phase == corev1.PodRunning {
				running[p.Name] = now
			}
			if _, seen := ready[p.Name]; !seen && podReady(p) {
				ready[p.Name] = now
			}
		case <-deadline:
			t.Fatalf("%s: %d of %d pods Running, %d Ready after 20 minutes", name, len(running), r.pods, len(ready))
		}
	}
	for _, at := range running {
		r.allRunning = max(r.allRunning, at.Sub(start))
	}
	for p, at := range ready {
		r.allReady = max(r.allReady, at.Sub(start))
		r.startup = append(r.startup, at.Sub(added[p]))
	}
	slices.Sort(r.startup)
	r.agentCPU = cpuOf(t, pids)*time.Duration(len(pids)) - cpu0
	r.execCPU = childCPU(t, ctrd) - exec0
	r.agentWait = runWait(t, pids) - wait0
	r.machine, r.apiCPU = kubeenv.MachineCPU(t).Since(machine0), cpuOf(t, api)-api0
	r.apiWrites = apiWrites(t, cs) - writes0
	if r0 := rev(); r0 >= 0 {
		r.etcdRevs = r0 - rev0
	} else {
		r.etcdRevs = -1
	}
	r.rss, r.hwm = rssOf(t, pids), memOf(t, pids, "VmHWM:")
	cni1 := cl.containerdScrape()
	r.cniAdd = cni1.add.minus(t, cni0.add)
	var aadd1, adel1 cniHist
	if ours {
		aadd1, adel1 = cl.agentHists()
		r.agentAdd = aadd1.minus(t, aadd0)
	}
	wait1 := runWait(t, pids)
	if r.cniAdd.count < float64(r.pods) {
		t.Fatalf("%s: containerd timed %.0f CNI ADDs (%s, set_up_pod) during a burst of %d pods", name, r.cniAdd.count, cniOpMetric, r.pods)
	}
	profDone.Wait()
	t.Logf("%s: %d pods Running in %v, Ready in %v (p50 %v, p99 %v)", name, r.pods, r.allRunning.Round(time.Millisecond),
		r.allReady.Round(time.Millisecond), pct(r.startup, .5).Round(time.Millisecond), pct(r.startup, .99).Round(time.Millisecond))
	t1 := time.Now()
	netDown := make(chan time.Duration, 1)
	stop := make(chan struct{})
	go func() { netDown <- cl.waitVeths(veths0, t1, stop) }()
	deleteNamespace(t, cs, ns)
	cl.waitSandboxesGone(ns)
	r.teardown = time.Since(t1)
	cni2 := cl.containerdScrape()
	r.cniDel = cni2.del.minus(t, cni1.del)
	r.delErrors = cni2.delErrors - cni1.delErrors
	r.agentWaitDown = runWait(t, pids) - wait1
	if ours {
		_, adel2 := cl.agentHists()
		r.agentDel = adel2.minus(t, adel1)
	}
	if r.cniDel.count < float64(r.pods) {
		t.Fatalf("%s: containerd timed %.0f CNI DELs (%s, tear_down_pod) while %d pods were deleted", name, r.cniDel.count, cniOpMetric, r.pods)
	}
	// Every sandbox is gone, and its network namespace with it: a pod's veth
	// still on a node now was left behind by the pod network.
	select {
	case r.netDown = <-netDown:
	case <-time.After(30 * time.Second):
		close(stop)
		t.Fatalf("%s: 30 s after every sandbox of %s was removed, the nodes have %v veths; %v before the burst", name, ns, cl.hostVeths(), veths0)
	}
	return r
}

// hostVeths is the number of veth interfaces in each node's network namespace:
// the node's own uplink and one host side per pod, with either pod network.
func (cl *cluster) hostVeths() []int {
	cl.T.Helper()
	n, err := cl.vethCounts()
	if err != nil {
		cl.T.Fatal(err)
	}
	return n
}

func (cl *cluster) vethCounts() ([]int, error) {
	var n []int
	for _, nd := range cl.Nodes {
		h, err := nodeNetlink(nd)
		if err != nil {
			return nil, err
		}
		// A dump that links changed under (the teardown deletes hundreds) is
		// incomplete: read again until one is whole.
		links, err := h.LinkList()
		for tries := 1; errors.Is(err, netlink.ErrDumpInterrupted) && tries < 100; tries++ {
			links, err = h.LinkList()
		}
		h.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: links: %w", nd.Name, err)
		}
		c := 0
		for _, l := range links {
			if l.Type() == "veth" {
				c++
			}
		}
		n = append(n, c)
	}
	return n, nil
}

// nodeNetlink is a netlink handle in nd's network namespace; the caller
// closes it. It returns errors rather than failing the test: waitVeths calls
// it from a goroutine of its own.
func nodeNetlink(nd *kubeenv.Node) (*netlink.Handle, error) {
	ns, err := netns.GetFromPid(nd.NSPID())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", nd.Name, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("%s: netlink: %w", nd.Name, err)
	}
	return h, nil
}

// waitVeths waits until no node has more veths than before (want): every pod's
// host side is deleted, its network torn down. It returns the time since t1,
// or 0 when stop closes first.
func (cl *cluster) waitVeths(want []int, t1 time.Time, stop <-chan struct{}) time.Duration {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return 0
		case <-tick.C:
		}
		got, err := cl.vethCounts()
		if err != nil {
			cl.T.Error(err)
			return 0
		}
		down := true
		for i := range got {
			down = down && got[i] <= want[i]
		}
		if down {
			return time.Since(t1)
		}
	}
}

// poolRounds joins the rounds' results of each system, in the order of their
// first appearance: startup times and CPU are pooled over all pods, wall
// times and memory are the means of the rounds.
func poolRounds(tb testing.TB, rs []scaleResult) []scaleResult {
	var out []scaleResult
	for _, r := range rs {
		i := slices.IndexFunc(out, func(o scaleResult) bool { return o.name == r.name })
		if i < 0 {
			out = append(out, scaleResult{name: r.name, etcdRevs: -1})
			i = len(out) - 1
		}
		o := &out[i]
		o.rounds += r.rounds
		o.pods += r.pods
		o.startup = append(o.startup, r.startup...)
		o.allRunning += r.allRunning
		o.allReady += r.allReady
		o.teardown += r.teardown
		o.netDown += r.netDown
		o.agentCPU += r.agentCPU
		o.execCPU += r.execCPU
		o.rss += r.rss
		o.hwm += r.hwm
		o.apiWrites += r.apiWrites
		o.cniAdd = o.cniAdd.plus(tb, r.cniAdd)
		o.cniDel = o.cniDel.plus(tb, r.cniDel)
		o.agentAdd = o.agentAdd.plus(tb, r.agentAdd)
		o.agentDel = o.agentDel.plus(tb, r.agentDel)
		o.agentWait += r.agentWait
		o.agentWaitDown += r.agentWaitDown
		o.delErrors += r.delErrors
		o.machine.Total += r.machine.Total
		o.machine.Idle += r.machine.Idle
		o.apiCPU += r.apiCPU
		if r.etcdRevs >= 0 {
			o.etcdRevs = max(o.etcdRevs, 0) + r.etcdRevs
		}
	}
	for i := range out {
		o, k := &out[i], out[i].rounds
		slices.Sort(o.startup)
		o.allRunning /= time.Duration(k)
		o.allReady /= time.Duration(k)
		o.teardown /= time.Duration(k)
		o.netDown /= time.Duration(k)
		o.rss /= uint64(k)
		o.hwm /= uint64(k)
	}
	return out
}

// waitSandboxesGone waits until no node's runtime keeps a sandbox of
// namespace ns: the pods leave the API before their sandboxes are stopped and
// removed (and their CNI DELs run), and the next system's burst or the
// uninstall must not share the nodes with that work.
func (cl *cluster) waitSandboxesGone(ns string) {
	t := cl.T
	t.Helper()
	ctx := context.Background()
	for _, nd := range cl.Nodes {
		c, err := cri.Dial(ctx, nd.Endpoint(), 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		err = kubeenv.WaitFor(15*time.Minute, 2*time.Second, func() (bool, error) {
			sbs, err := c.ListSandboxes(ctx)
			if err != nil {
				return false, err
			}
			n := 0
			for _, sb := range sbs {
				if sb.Namespace == ns {
					n++
				}
			}
			return n == 0, fmt.Errorf("%s: %d sandboxes of namespace %s left", nd.Name, n, ns)
		})
		c.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// scaleDeployment is one of the burst's Deployments: scaleReplicas sleeping
// busybox pods, no placement of its own (the scheduler's default spreading).
func scaleDeployment(name string) *appsv1.Deployment {
	replicas := int32(scaleReplicas)
	labels := map[string]string{"app": name}
	zero := int64(0)
	no := false
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &zero,
					AutomountServiceAccountToken:  &no,
					Containers: []corev1.Container{{Name: "sleep", Image: nodesenv.PodImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/bin/busybox", "sleep", "3600"}}},
				},
			},
		},
	}
}

// childCPU is the CPU time (cutime + cstime) of the children pids have
// reaped, summed: for containerd, the CNI plugins it ran (and the shims'
// start commands, the same number per pod whatever the network).
func childCPU(tb testing.TB, pids []int) time.Duration {
	tb.Helper()
	var sum time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			tb.Fatal(err)
		}
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		cu, _ := strconv.ParseUint(f[13], 10, 64)
		cs, _ := strconv.ParseUint(f[14], 10, 64)
		sum += time.Duration(cu+cs) * time.Second / 100 // USER_HZ
	}
	return sum
}

// memOf is the mean of the /proc/PID/status field (in kB) of pids, in bytes.
func memOf(tb testing.TB, pids []int, field string) uint64 {
	tb.Helper()
	var sum uint64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err != nil {
			tb.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, field); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				sum += kb << 10
			}
		}
	}
	return sum / uint64(len(pids))
}

// apiWrites is the apiserver's count of write requests (create, update,
// patch, delete, apply) to ipledger's resources (group ipledger.io), from its
// /metrics.
func apiWrites(tb testing.TB, cs *kubernetes.Clientset) float64 {
	tb.Helper()
	raw, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "apiserver_request_total{") || !strings.Contains(l, `group="ipledger.io"`) {
			continue
		}
		if !strings.Contains(l, `verb="POST"`) && !strings.Contains(l, `verb="PUT"`) && !strings.Contains(l, `verb="PATCH"`) &&
			!strings.Contains(l, `verb="DELETE"`) && !strings.Contains(l, `verb="APPLY"`) &&
			!strings.Contains(l, `verb="CREATE"`) && !strings.Contains(l, `verb="UPDATE"`) {
			continue
		}
		v, err := strconv.ParseFloat(l[strings.LastIndexByte(l, ' ')+1:], 64)
		if err != nil {
			tb.Fatalf("apiserver metrics: %q: %v", l, err)
		}
		sum += v
	}
	return sum
}

// etcdRevision is the benchmark etcd's current revision: each write
// transaction adds one.
func etcdRevision(tb testing.TB, ec *etcdenv.Embedded) int64 {
	tb.Helper()
	resp, err := ec.Client().Get(context.Background(), "bench-revision-probe")
	if err != nil {
		tb.Fatal(err)
	}
	return resp.Header.Revision
}

// profile writes a CPU profile of seconds of each node's agent (through its
// --debug-addr) to prefix-NODE.pprof.
func (cl *cluster) profile(ctx context.Context, prefix string, seconds int) {
	if err := os.MkdirAll(filepath.Dir(prefix), 0o755); err != nil {
		cl.T.Error(err)
		return
	}
	var wg sync.WaitGroup
	for _, nd := range cl.Nodes {
		wg.Go(func() {
			hc := &http.Client{Transport: &http.Transport{DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
				return nd.Host.Dial(network, addr, 5*time.Second)
			}}}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", scaleDebugAddr, seconds), nil)
			resp, err := hc.Do(req)
			if err != nil {
				cl.T.Errorf("%s: profile: %v", nd.Name, err)
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || resp.StatusCode != http.StatusOK {
				cl.T.Errorf("%s: profile: %s %v: %s", nd.Name, resp.Status, err, body[:min(len(body), 200)])
				return
			}
			path := prefix + "-" + nd.Name + ".pprof"
			if err := os.WriteFile(path, body, 0o644); err != nil {
				cl.T.Error(err)
				return
			}
			cl.T.Logf("%s: CPU profile of %d s written to %s", nd.Name, seconds, path)
		})
	}
	wg.Wait()
}

// scaleTable is the Markdown table of rs, flannel's column (when measured)
// first and each other system's ratio to it.
func scaleTable(rs []scaleResult) string {
	rs = slices.Clone(rs)
	slices.SortStableFunc(rs, func(a, b scaleResult) int {
		return strings.Compare(strconv.FormatBool(a.name != "flannel"), strconv.FormatBool(b.name != "flannel"))
	})
	var base *scaleResult
	for i := range rs {
		if rs[i].name == "flannel" {
			base = &rs[i]
		}
	}
	title := map[string]string{"flannel": "flannel host-gw " + kubeenv.FlannelVersion, "node": "ipledger node mode",
		"kubernetes": "ipledger cluster mode, Kubernetes datastore", "etcd": "ipledger cluster mode, etcd datastore"}
	var s strings.Builder
	pooled := ""
	if rs[0].rounds > 1 {
		pooled = fmt.Sprintf(", %d rounds pooled", rs[0].rounds)
	}
	fmt.Fprintf(&s, "| %d Deployments × %d replicas at once, 3 kubelet nodes, Kubernetes %s%s |", rs[0].pods/rs[0].rounds/scaleReplicas, scaleReplicas, kubeenv.Version, pooled)
	sep := "|---|"
	for _, r := range rs {
		fmt.Fprintf(&s, " %s |", title[r.name])
		sep += "---:|"
		if base != nil && r.name != "flannel" {
			fmt.Fprintf(&s, " / flannel |")
			sep += "---:|"
		}
	}
	s.WriteString("\n" + sep + "\n")
	row := func(label string, f func(scaleResult) float64, format func(float64) string) {
		fmt.Fprintf(&s, "| %s |", label)
		for _, r := range rs {
			v := f(r)
			fmt.Fprintf(&s, " %s |", format(v))
			if base != nil && r.name != "flannel" {
				if b := f(*base); b > 0 && v >= 0 {
					fmt.Fprintf(&s, " %.2f× |", v/b)
				} else {
					s.WriteString(" – |")
				}
			}
		}
		s.WriteString("\n")
	}
	secs := func(v float64) string { return fmtDur(time.Duration(v * float64(time.Second))) }
	dur := func(f func(scaleResult) time.Duration) func(scaleResult) float64 {
		return func(r scaleResult) float64 { return f(r).Seconds() }
	}
	// a figure of an agent timer (its mean or a quantile), -1 (shown as –)
	// where the agent answers none
	agentStat := func(f func(scaleResult) cniHist, stat func(cniHist) time.Duration) func(scaleResult) float64 {
		return func(r scaleResult) float64 {
			if h := f(r); h.count > 0 {
				return stat(h).Seconds()
			}
			return -1
		}
	}
	agentMean := func(f func(scaleResult) cniHist) func(scaleResult) float64 { return agentStat(f, cniHist.mean) }
	agentQuantile := func(f func(scaleResult) cniHist, q float64) func(scaleResult) float64 {
		return agentStat(f, func(h cniHist) time.Duration { return h.quantile(q) })
	}
	secsOrNone := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return secs(v)
	}
	mib := func(v float64) string { return fmt.Sprintf("%.1f MiB", v/(1<<20)) }
	num := func(v float64) string {
		if v < 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f", v)
	}
	row("all pods Running (wall, from the Deployments' creation)", dur(func(r scaleResult) time.Duration { return r.allRunning }), secs)
	row("all pods Ready (wall)", dur(func(r scaleResult) time.Duration { return r.allReady }), secs)
	row("pod startup p50 (creation → Ready)", dur(func(r scaleResult) time.Duration { return pct(r.startup, .5) }), secs)
	row("pod startup p99", dur(func(r scaleResult) time.Duration { return pct(r.startup, .99) }), secs)
	row("pod network setup, mean (containerd's timer around the CNI ADD)", dur(func(r scaleResult) time.Duration { return r.cniAdd.mean() }), secs)
	row("pod network setup p99 (interpolated in the timer's buckets)", dur(func(r scaleResult) time.Duration { return r.cniAdd.quantile(.99) }), secs)
	row("CNI ADDs per pod (above 1: sandboxes set up again)", func(r scaleResult) float64 { return r.cniAdd.count / float64(r.pods) }, num)
	row("agent's answer to an ADD, mean (its own timer; flanneld answers none)", agentMean(func(r scaleResult) cniHist { return r.agentAdd }), secsOrNone)
	row("agent's answer to an ADD, p50 (interpolated in its buckets, 0.5 ms to 10 s)", agentQuantile(func(r scaleResult) cniHist { return r.agentAdd }, .5), secsOrNone)
	row("agent's answer to an ADD, p99", agentQuantile(func(r scaleResult) cniHist { return r.agentAdd }, .99), secsOrNone)
	row("agent's run-queue wait per pod during the burst (schedstat; flanneld runs outside the pods' cgroups, ipledgerd is a pod of 20m CPU request)", dur(func(r scaleResult) time.Duration { return r.agentWait / time.Duration(r.pods) }), secs)
	row("agent CPU per pod (flanneld or ipledgerd, all nodes, during the burst)", dur(func(r scaleResult) time.Duration { return r.agentCPU / time.Duration(r.pods) }), secs)
	row("CNI exec CPU per pod (containerd's reaped children, all nodes)", dur(func(r scaleResult) time.Duration { return r.execCPU / time.Duration(r.pods) }), secs)
	row("agent + CNI exec CPU per pod", dur(func(r scaleResult) time.Duration { return (r.agentCPU + r.execCPU) / time.Duration(r.pods) }), secs)
	row("kube-apiserver CPU per pod during the burst", dur(func(r scaleResult) time.Duration { return r.apiCPU / time.Duration(r.pods) }), secs)
	// the share says whether the machine was saturated, not what the pods cost
	row("the machine's CPUs busy during the burst (/proc/stat)", func(r scaleResult) float64 { return r.machine.Busy() }, func(v float64) string { return fmt.Sprintf("%.0f%%", 100*v) })
	row("agent VmRSS after the burst (per node)", func(r scaleResult) float64 { return float64(r.rss) }, mib)
	row("agent VmHWM, peak RSS (per node)", func(r scaleResult) float64 { return float64(r.hwm) }, mib)
	row("apiserver writes to ipledger.io per pod", func(r scaleResult) float64 { return r.apiWrites / float64(r.pods) }, num)
	row("etcd revisions per pod", func(r scaleResult) float64 {
		if r.etcdRevs < 0 {
			return -1
		}
		return float64(r.etcdRevs) / float64(r.pods)
	}, num)
	row("pod network teardown, mean (containerd's timer around the CNI DEL)", dur(func(r scaleResult) time.Duration { return r.cniDel.mean() }), secs)
	row("CNI DELs per pod (above 1: the runtime tore down again)", func(r scaleResult) float64 { return r.cniDel.count / float64(r.pods) }, num)
	row("failed CNI DELs per pod (containerd's error count)", func(r scaleResult) float64 { return r.delErrors / float64(r.pods) }, num)
	row("agent's answer to a DEL, mean", agentMean(func(r scaleResult) cniHist { return r.agentDel }), secsOrNone)
	row("agent's run-queue wait per pod during the teardown", dur(func(r scaleResult) time.Duration { return r.agentWaitDown / time.Duration(r.pods) }), secs)
	row("every pod's host veth gone after their namespace's deletion (wall)", dur(func(r scaleResult) time.Duration { return r.netDown }), secs)
	row("all pods and their sandboxes gone (wall; the kubelet removes sandboxes in its minutely GC)", dur(func(r scaleResult) time.Duration { return r.teardown }), secs)
	return s.String()
}

// TestPoolRounds: the pooled table's figures are the rounds' pods and CPU
// summed (so per pod is over every pod), their startups and CNI timings merged,
// and their wall times and memory averaged; systems stay in the order they
// first appear.
func TestPoolRounds(t *testing.T) {
	s := time.Second
	got := poolRounds(t, []scaleResult{
		{name: "node", rounds: 1, pods: 10, startup: []time.Duration{3 * s, 5 * s}, allRunning: 10 * s, allReady: 11 * s, teardown: 40 * s, netDown: 8 * s,
			agentCPU: 100 * time.Millisecond, execCPU: 200 * time.Millisecond, rss: 30 << 20, hwm: 32 << 20, apiWrites: 0, etcdRevs: -1,
			cniAdd: cniHist{bounds: []float64{1}, cum: []float64{9}, count: 10, sum: 5}, agentDel: cniHist{bounds: []float64{1}, cum: []float64{10}, count: 10, sum: 1},
			agentWait: 2 * s, agentWaitDown: s, delErrors: 1},
		{name: "etcd", rounds: 1, pods: 10, startup: []time.Duration{2 * s}, allRunning: 9 * s, etcdRevs: 7},
		{name: "etcd", rounds: 1, pods: 10, startup: []time.Duration{1 * s}, allRunning: 11 * s, etcdRevs: 5},
		{name: "node", rounds: 1, pods: 10, startup: []time.Duration{4 * s}, allRunning: 20 * s, allReady: 21 * s, teardown: 60 * s, netDown: 10 * s,
			agentCPU: 300 * time.Millisecond, execCPU: 400 * time.Millisecond, rss: 34 << 20, hwm: 36 << 20, apiWrites: 2, etcdRevs: -1,
			cniAdd: cniHist{bounds: []float64{1}, cum: []float64{10}, count: 10, sum: 3}, agentDel: cniHist{bounds: []float64{1}, cum: []float64{9}, count: 10, sum: 2},
			agentWait: 4 * s, agentWaitDown: 3 * s, delErrors: 2},
	})
	want := []scaleResult{
		{name: "node", rounds: 2, pods: 20, startup: []time.Duration{3 * s, 4 * s, 5 * s}, allRunning: 15 * s, allReady: 16 * s, teardown: 50 * s, netDown: 9 * s,
			agentCPU: 400 * time.Millisecond, execCPU: 600 * time.Millisecond, rss: 32 << 20, hwm: 34 << 20, apiWrites: 2, etcdRevs: -1,
			cniAdd: cniHist{bounds: []float64{1}, cum: []float64{19}, count: 20, sum: 8}, agentDel: cniHist{bounds: []float64{1}, cum: []float64{19}, count: 20, sum: 3},
			agentWait: 6 * s, agentWaitDown: 4 * s, delErrors: 3},
		{name: "etcd", rounds: 2, pods: 20, startup: []time.Duration{1 * s, 2 * s}, allRunning: 10 * s, etcdRevs: 12},
	}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Fatalf("pooled:\n%+v\nwant\n%+v", got, want)
	}
	if h := strings.SplitN(scaleTable(got), "\n", 2)[0]; !strings.Contains(h, "| 1 Deployments × 10 replicas at once") || !strings.Contains(h, ", 2 rounds pooled |") {
		t.Fatalf("table header %q: want the Deployments of one round and the rounds pooled", h)
	}
}
