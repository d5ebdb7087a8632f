//go:build kubelet

package kubenodes_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/nodesenv"
)

// Benchmark sizes (issue 25): pods started at once over the three nodes,
// Node objects in the large cluster (the three kubelets' and the rest created
// through the API only), rounds of one Node joining and leaving.
const (
	benchPods   = 300
	benchNodes  = 100
	benchRounds = 5
	idleWindow  = 30 * time.Second
)

// result is what one pod network measured.
type result struct {
	name        string
	meshOK      bool
	meshFailed  []string
	startup     []time.Duration // per pod, creation to Ready
	startupWall time.Duration   // first creation to the last pod Ready
	startupCPU  time.Duration   // agent CPU during the startup, mean per agent
	teardown    time.Duration   // deletion of the pods until all are gone
	join3       []time.Duration
	leave3      []time.Duration
	join100     []time.Duration
	leave100    []time.Duration
	fill        time.Duration // 97 Nodes created until every route is on every node
	fillCPU     time.Duration
	drain       time.Duration // 97 Nodes deleted until their routes are gone everywhere
	idle3       usage
	idle100     usage
}

// usage is the agents' mean CPU time over idleWindow and mean VmRSS after it.
type usage struct {
	cpu time.Duration
	rss uint64 // bytes
}

// BenchmarkFlannel (issue 25, make bench): ipledger (deploy/ipledger.yaml
// applied unchanged) and flannel host-gw (flanneld per node, bridge +
// host-local) one after the other on the same three kubelet nodes, in one
// run: the connectivity check, pod startup, route convergence as Nodes join
// and leave, and the agents' CPU and memory with 3 and with 100 Nodes. Not a
// timed test: it reports, it does not assert a speed.
func BenchmarkFlannel(b *testing.B) {
	t0 := time.Now()
	kubeenv.FlannelBinary(b) // built (or cached) before anything is measured
	cl := startNodes(b, 3)
	cs := cl.client()
	b.Logf("cluster of 3 nodes up in %v", time.Since(t0).Round(time.Millisecond))
	for i := 0; i < b.N; i++ {
		t1 := time.Now()
		cl.InstallIpledger()
		ipl := cl.measure(cs, "ipledger", "ipledgerd", fmt.Sprintf("ipl-%d", i))
		cl.uninstallIpledger()
		b.Logf("ipledger measured and uninstalled in %v", time.Since(t1).Round(time.Second))
		t2 := time.Now()
		cl.installFlannel()
		fl := cl.measure(cs, "flannel", "flanneld", fmt.Sprintf("fl-%d", i))
		for _, nd := range cl.Nodes {
			nd.StopFlannel()
		}
		b.Logf("flannel measured in %v", time.Since(t2).Round(time.Second))
		b.Logf("\n%s", table(ipl, fl))
		b.ReportMetric(float64(pct(ipl.startup, .5).Milliseconds()), "ipledger-p50-ms")
		b.ReportMetric(float64(pct(fl.startup, .5).Milliseconds()), "flannel-p50-ms")
	}
	b.Logf("benchmark took %v", time.Since(t0).Round(time.Second))
}

// client is a clientset of the cluster's admin, with room for the bursts the
// benchmark sends (97 Nodes at once).
func (cl *cluster) client() *kubernetes.Clientset {
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.C.Kubeconfig)
	if err != nil {
		cl.T.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 500, 1000
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		cl.T.Fatal(err)
	}
	return cs
}

// uninstallIpledger is the manifest's uninstall: kubectl delete -f
// deploy/ipledger.yaml (kubectl delete -k deploy/cluster in cluster mode),
// then `ipledgerd uninstall-cni` on every node (its conflist, plugins, routes
// and masquerade rules).
func (cl *cluster) uninstallIpledger() {
	t := cl.T
	t.Helper()
	del := []string{"delete", "-f", filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml")}
	if cl.ClusterMode {
		del = []string{"delete", "-k", filepath.Join(agentenv.RepoRoot(), "deploy", "cluster")}
	}
	cl.C.MustKubectl(t, append(del, "--wait=true", "--timeout=3m")...)
	if err := kubeenv.WaitFor(2*time.Minute, time.Second, func() (bool, error) {
		for _, nd := range cl.Nodes {
			if pids := agentPIDs(nd, "ipledgerd"); len(pids) > 0 {
				return false, fmt.Errorf("ipledgerd still running on %s: %v", nd.Name, pids)
			}
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(agentenv.Bin(t), "ipledgerd")
	for _, nd := range cl.Nodes {
		out, err := exec.Command("nsenter", "-t", strconv.Itoa(nd.NSPID()), "--net", "--mount", "--uts", "--",
			bin, "uninstall-cni", "--cni-bin-dir", "/opt/cni/bin", "--cni-conf-dir", "/etc/cni/net.d").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: ipledgerd uninstall-cni: %v\n%s", nd.Name, err, out)
		}
		t.Logf("%s: ipledgerd uninstall-cni:\n%s", nd.Name, out)
	}
	cl.ClusterMode = false
}

// measure runs every measurement against the installed pod network, whose
// agent is the process named agent on each node.
func (cl *cluster) measure(cs *kubernetes.Clientset, name, agent, ns string) result {
	t := cl.T
	t.Helper()
	r := result{name: name}
	_, _, r.meshFailed = cl.mesh()
	r.meshOK = len(r.meshFailed) == 0
	cl.C.MustKubectl(t, "delete", "pods", "-n", "default", "--all", "--grace-period=0", "--wait=true", "--timeout=3m")
	pids := make([]int, len(cl.Nodes))
	for i, nd := range cl.Nodes {
		ps := agentPIDs(nd, agent)
		if len(ps) != 1 {
			t.Fatalf("%s: %d %s processes in its namespaces: %v", nd.Name, len(ps), agent, ps)
		}
		pids[i] = ps[0]
	}
	cpu0 := cpuOf(t, pids)
	r.startup, r.startupWall, r.teardown = cl.podStartup(cs, ns)
	r.startupCPU = cpuOf(t, pids) - cpu0
	t.Logf("%s: %d pods Ready in %v (p50 %v), gone in %v", name, benchPods, r.startupWall.Round(time.Millisecond),
		pct(r.startup, .5).Round(time.Millisecond), r.teardown.Round(time.Millisecond))
	time.Sleep(10 * time.Second) // the deletions' last updates settle
	r.idle3 = idle(t, pids)
	r.join3, r.leave3 = cl.joinLeave(cs, "join3")
	var fakes []fakeNode
	for i := range benchNodes - len(cl.Nodes) {
		fakes = append(fakes, fakeNode{name: fmt.Sprintf("fake-%03d", i),
			ip: netip.AddrFrom4([4]byte{10, 250, 0, byte(101 + i)}), cidr: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 236, byte(100 + i), 0}), 24)})
	}
	cpu0 = cpuOf(t, pids)
	start := time.Now()
	parallel(fakes, func(f fakeNode) error { return f.create(cs) })
	var err error
	if r.fill, err = cl.waitRoutes(start, 3*time.Minute, fakes, true); err != nil {
		t.Errorf("%s: %v", name, err)
	}
	r.fillCPU = cpuOf(t, pids) - cpu0
	time.Sleep(10 * time.Second)
	r.idle100 = idle(t, pids)
	r.join100, r.leave100 = cl.joinLeave(cs, "join100")
	start = time.Now()
	parallel(fakes, func(f fakeNode) error { return f.delete(cs) })
	if r.drain, err = cl.waitRoutes(start, 3*time.Minute, fakes, false); err != nil {
		t.Errorf("%s: %v", name, err)
	}
	return r
}

// fakeNode is a Node object only, never a kubelet: created through the API
// with its podCIDR, its InternalIP on the nodes' L2 network, the annotations
// flanneld would have written on its own Node (kube subnet manager, host-gw)
// and a NoSchedule taint.
type fakeNode struct {
	name string
	ip   netip.Addr
	cidr netip.Prefix
}

func (f fakeNode) create(cs *kubernetes.Clientset) error {
	const pre = "flannel.alpha.coreos.com/"
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: f.name, Labels: map[string]string{"bench.ipledger/fake": "true"},
			Annotations: map[string]string{pre + "kube-subnet-manager": "true", pre + "backend-type": "host-gw",
				pre + "backend-data": "null", pre + "public-ip": f.ip.String()}},
		Spec: corev1.NodeSpec{PodCIDR: f.cidr.String(), PodCIDRs: []string{f.cidr.String()},
			Taints: []corev1.Taint{{Key: "bench.ipledger/fake", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: f.ip.String()}}},
	}
	_, err := cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
	return err
}

func (f fakeNode) delete(cs *kubernetes.Clientset) error {
	return cs.CoreV1().Nodes().Delete(context.Background(), f.name, metav1.DeleteOptions{})
}

// parallel runs fn over fs with 8 workers. An error is printed; the Nodes it
// left out then fail the caller's waitRoutes.
func parallel(fs []fakeNode, fn func(fakeNode) error) {
	var wg sync.WaitGroup
	ch := make(chan fakeNode)
	for range 8 {
		wg.Go(func() {
			for f := range ch {
				if err := fn(f); err != nil {
					fmt.Fprintf(os.Stderr, "bench: node %s: %v\n", f.name, err)
				}
			}
		})
	}
	for _, f := range fs {
		ch <- f
	}
	close(ch)
	wg.Wait()
}

// joinLeave: benchRounds times, a Node joins (created with its podCIDR) and
// the time until every node routes its podCIDR via its address is taken; then
// it is deleted and the time until no node routes it any more.
func (cl *cluster) joinLeave(cs *kubernetes.Clientset, prefix string) (join, leave []time.Duration) {
	t := cl.T
	for k := range benchRounds {
		f := fakeNode{name: fmt.Sprintf("%s-%d", prefix, k), ip: netip.AddrFrom4([4]byte{10, 250, 0, byte(220 + k)}),
			cidr: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 236, byte(220 + k), 0}), 24)}
		t0 := time.Now()
		if err := f.create(cs); err != nil {
			t.Fatal(err)
		}
		d, err := cl.waitRoutes(t0, time.Minute, []fakeNode{f}, true)
		if err != nil {
			t.Errorf("%s: %v", f.name, err)
			d = -1
		}
		join = append(join, d)
		time.Sleep(time.Second)
		t1 := time.Now()
		if err := f.delete(cs); err != nil {
			t.Fatal(err)
		}
		if d, err = cl.waitRoutes(t1, time.Minute, []fakeNode{f}, false); err != nil {
			t.Errorf("%s deleted: %v", f.name, err)
			d = -1
		}
		leave = append(leave, d)
		time.Sleep(time.Second)
	}
	return join, leave
}

// waitRoutes polls every node's main table (every 2 ms) until each has a
// route to every fake's podCIDR via its address (present) or none to any
// (!present), and returns the time from t0 until the last node got there.
func (cl *cluster) waitRoutes(t0 time.Time, timeout time.Duration, fakes []fakeNode, present bool) (time.Duration, error) {
	done := make([]time.Duration, len(cl.Nodes))
	left := len(cl.Nodes)
	for left > 0 {
		for i, nd := range cl.Nodes {
			if done[i] != 0 {
				continue
			}
			routes, err := gwRoutes(nd)
			if err != nil {
				return 0, err
			}
			ok := true
			for _, f := range fakes {
				via, has := routes[f.cidr]
				if present && (!has || via != f.ip) || !present && has {
					ok = false
					break
				}
			}
			if ok {
				done[i] = time.Since(t0)
				left--
			}
		}
		if time.Since(t0) > timeout {
			return 0, fmt.Errorf("routes (present %v) of %d Nodes not on every node after %v (done %v)", present, len(fakes), timeout, done)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return slices.Max(done), nil
}

// gwRoutes are the node's IPv4 routes with a gateway, destination to gateway.
func gwRoutes(nd *kubeenv.Node) (map[netip.Prefix]netip.Addr, error) {
	rs, err := nd.Host.Netlink.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("%s: routes: %w", nd.Name, err)
	}
	m := map[netip.Prefix]netip.Addr{}
	for _, r := range rs {
		if r.Dst == nil || r.Gw == nil {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		dst, ok1 := netip.AddrFromSlice(r.Dst.IP.To4())
		gw, ok2 := netip.AddrFromSlice(r.Gw.To4())
		if ok1 && ok2 {
			m[netip.PrefixFrom(dst, ones)] = gw
		}
	}
	return m, nil
}

// podStartup creates a Deployment of benchPods sleeping busybox pods spread
// evenly over the nodes in namespace ns and returns, per pod, the time from
// its creation to Ready as a watch of the API sees them, the wall time until
// the last was Ready, and the time from the namespace's deletion until every
// pod is gone.
func (cl *cluster) podStartup(cs *kubernetes.Clientset, ns string) (ds []time.Duration, wall, teardown time.Duration) {
	t := cl.T
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	replicas := int32(benchPods)
	labels := map[string]string{"app": "startup"}
	zero := int64(0)
	no := false
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "startup"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &zero,
					AutomountServiceAccountToken:  &no,
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: "kubernetes.io/hostname",
						WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: labels}}},
					Containers: []corev1.Container{{Name: "sleep", Image: nodesenv.PodImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/bin/busybox", "sleep", "3600"}}},
				},
			},
		},
	}
	start := time.Now()
	if _, err := cs.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	added, readyAt := map[string]time.Time{}, map[string]time.Time{}
	deadline := time.After(15 * time.Minute)
	for len(readyAt) < benchPods {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("pod watch closed with %d of %d pods Ready", len(readyAt), benchPods)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			now := time.Now()
			if _, seen := added[p.Name]; !seen {
				added[p.Name] = now
			}
			if _, seen := readyAt[p.Name]; !seen && podReady(p) {
				readyAt[p.Name] = now
			}
		case <-deadline:
			t.Fatalf("%d of %d pods Ready after 15 minutes", len(readyAt), benchPods)
		}
	}
	wall = time.Since(start)
	for name, r := range readyAt {
		ds = append(ds, r.Sub(added[name]))
	}
	slices.Sort(ds)
	return ds, wall, deleteNamespace(t, cs, ns)
}

// deleteNamespace deletes the benchmark's namespace and returns how long its
// pods took to be gone.
func deleteNamespace(t testing.TB, cs *kubernetes.Clientset, ns string) time.Duration {
	t.Helper()
	ctx := context.Background()
	t1 := time.Now()
	if err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := kubeenv.WaitFor(15*time.Minute, time.Second, func() (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		return len(pods.Items) == 0, fmt.Errorf("%d pods left", len(pods.Items))
	}); err != nil {
		t.Fatal(err)
	}
	return time.Since(t1)
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// agentPIDs are the processes whose executable is named exe and that run in
// nd's network namespace.
func agentPIDs(nd *kubeenv.Node, exe string) []int {
	want, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", nd.NSPID()))
	if err != nil {
		return nil
	}
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); filepath.Base(p) != exe {
			continue
		}
		if ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid)); ns == want {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cpuOf is the mean CPU time (user + system, /proc/PID/stat) of pids.
func cpuOf(tb testing.TB, pids []int) time.Duration {
	tb.Helper()
	var sum time.Duration
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			tb.Fatal(err)
		}
		// Fields after the command (which may hold spaces): state is the 3rd
		// field, utime and stime the 14th and 15th.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		sum += time.Duration(ut+st) * time.Second / 100 // USER_HZ
	}
	return sum / time.Duration(len(pids))
}

// runWait is the time the threads of pids spent runnable, waiting for a CPU
// (the second field of each /proc/PID/task/TID/schedstat), summed. Threads
// that exited are not counted: pids are long-lived agents whose Go runtime
// keeps its threads.
func runWait(tb testing.TB, pids []int) time.Duration {
	tb.Helper()
	var sum time.Duration
	for _, pid := range pids {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			tb.Fatal(err)
		}
		for _, task := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
			if err != nil {
				continue // the thread exited
			}
			f := strings.Fields(string(b))
			if len(f) < 2 {
				tb.Fatalf("/proc/%d/task/%s/schedstat: %q", pid, task.Name(), b)
			}
			ns, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				tb.Fatalf("/proc/%d/task/%s/schedstat: %q", pid, task.Name(), b)
			}
			sum += time.Duration(ns)
		}
	}
	return sum
}

// rssOf is the mean VmRSS of pids in bytes.
func rssOf(tb testing.TB, pids []int) uint64 { tb.Helper(); return memOf(tb, pids, "VmRSS:") }

// idle is the agents' usage over idleWindow with nothing changing.
func idle(tb testing.TB, pids []int) usage {
	c0 := cpuOf(tb, pids)
	time.Sleep(idleWindow)
	return usage{cpu: cpuOf(tb, pids) - c0, rss: rssOf(tb, pids)}
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(p*float64(len(s))+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// table is the Markdown table of both results, ipledger first, with ratios.
func table(a, b result) string {
	var s strings.Builder
	fmt.Fprintf(&s, "| 3 kubelet nodes, Kubernetes %s, 2 cores | %s | %s host-gw %s | %s / %s |\n|---|---:|---:|---:|\n",
		kubeenv.Version, a.name, b.name, kubeenv.FlannelVersion, a.name, b.name)
	mesh := func(r result) string {
		if r.meshOK {
			return "pass"
		}
		return "FAIL (" + strings.Join(r.meshFailed, ", ") + ")"
	}
	fmt.Fprintf(&s, "| connectivity: a pod on each node reaches a pod on every other (TCP) | %s | %s | – |\n", mesh(a), mesh(b))
	dur := func(name string, x, y time.Duration) {
		ratio := "–"
		if x > 0 && y > 0 {
			ratio = fmt.Sprintf("%.2f×", float64(x)/float64(y))
		}
		fmt.Fprintf(&s, "| %s | %s | %s | %s |\n", name, fmtDur(x), fmtDur(y), ratio)
	}
	dur(fmt.Sprintf("pod startup p50, %d pods over 3 nodes at once, creation → Ready", benchPods), pct(a.startup, .5), pct(b.startup, .5))
	dur(fmt.Sprintf("pod startup p99, %d pods", benchPods), pct(a.startup, .99), pct(b.startup, .99))
	dur(fmt.Sprintf("all %d pods Ready (wall)", benchPods), a.startupWall, b.startupWall)
	dur(fmt.Sprintf("all %d pods gone after their namespace's deletion (wall)", benchPods), a.teardown, b.teardown)
	dur(fmt.Sprintf("agent CPU while the %d pods start (per agent)", benchPods), a.startupCPU, b.startupCPU)
	dur(fmt.Sprintf("Node joins → route on every other node, 3 Nodes, p50 of %d", benchRounds), pct(a.join3, .5), pct(b.join3, .5))
	dur(fmt.Sprintf("Node joins → route on every other node, 3 Nodes, max of %d", benchRounds), slices.Max(a.join3), slices.Max(b.join3))
	dur(fmt.Sprintf("Node deleted → its route gone on every other node, 3 Nodes, p50 of %d", benchRounds), pct(a.leave3, .5), pct(b.leave3, .5))
	dur(fmt.Sprintf("Node deleted → its route gone on every other node, 3 Nodes, max of %d", benchRounds), slices.Max(a.leave3), slices.Max(b.leave3))
	dur(fmt.Sprintf("%d API-only Nodes created → all their routes on every node (wall)", benchNodes-3), a.fill, b.fill)
	dur("agent CPU until then (per agent)", a.fillCPU, b.fillCPU)
	dur(fmt.Sprintf("Node joins → route on every other node, %d Nodes, p50 of %d", benchNodes, benchRounds), pct(a.join100, .5), pct(b.join100, .5))
	dur(fmt.Sprintf("Node joins → route on every other node, %d Nodes, max of %d", benchNodes, benchRounds), slices.Max(a.join100), slices.Max(b.join100))
	dur(fmt.Sprintf("Node deleted → its route gone on every other node, %d Nodes, p50 of %d", benchNodes, benchRounds), pct(a.leave100, .5), pct(b.leave100, .5))
	dur(fmt.Sprintf("Node deleted → its route gone on every other node, %d Nodes, max of %d", benchNodes, benchRounds), slices.Max(a.leave100), slices.Max(b.leave100))
	dur(fmt.Sprintf("%d API-only Nodes deleted → their routes gone on every node (wall)", benchNodes-3), a.drain, b.drain)
	dur(fmt.Sprintf("agent CPU idle over %v, 3 Nodes (per agent)", idleWindow), a.idle3.cpu, b.idle3.cpu)
	dur(fmt.Sprintf("agent CPU idle over %v, %d Nodes (per agent)", idleWindow, benchNodes), a.idle100.cpu, b.idle100.cpu)
	mem := func(name string, x, y uint64) {
		fmt.Fprintf(&s, "| %s | %.1f MiB | %.1f MiB | %.2f× |\n", name, float64(x)/(1<<20), float64(y)/(1<<20), float64(x)/float64(y))
	}
	mem("agent VmRSS, 3 Nodes (per agent)", a.idle3.rss, b.idle3.rss)
	mem(fmt.Sprintf("agent VmRSS, %d Nodes (per agent)", benchNodes), a.idle100.rss, b.idle100.rss)
	return s.String()
}

// fmtDur prints d to a precision that suits it; a negative d is a timeout.
func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "timeout"
	case d < time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
}
