package multinode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// stickyNS is the Kubernetes namespace of the test's StatefulSet.
const stickyNS = "default"

// kube is the admin's clientset of c's API server.
func (c *cluster) kube() *kubernetes.Clientset {
	c.t.Helper()
	kc, err := kubernetes.NewForConfig(c.api.Config())
	if err != nil {
		c.t.Fatal(err)
	}
	return kc
}

// createStatefulSet creates the StatefulSet name with replicas pods in the API
// (no controller runs: the test creates and binds its pods itself).
func (c *cluster) createStatefulSet(kc *kubernetes.Clientset, name string, replicas int32) *appsv1.StatefulSet {
	c.t.Helper()
	labels := map[string]string{"app": name}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: stickyNS},
		Spec: appsv1.StatefulSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}},
			},
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// the namespace's default ServiceAccount, which the controller manager would
	// create: the API server admits no pod without it
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: stickyNS}}
	if _, err := kc.CoreV1().ServiceAccounts(stickyNS).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		c.t.Fatalf("create ServiceAccount default: %v", err)
	}
	got, err := kc.AppsV1().StatefulSets(stickyNS).Create(ctx, sts, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create StatefulSet %s: %v", name, err)
	}
	return got
}

// stickyPod is one incarnation of a StatefulSet's pod: its Pod object bound to a
// node, and its sandbox there.
type stickyPod struct {
	*pod
	args []string // CNI_ARGS
	cid  string
}

// createStickyPod creates the Pod object name of sts bound to node i (a new UID,
// as the StatefulSet controller re-creates a pod) and returns its CNI_ARGS.
func (c *cluster) createStickyPod(kc *kubernetes.Clientset, sts *appsv1.StatefulSet, i int, name string) (uid string, cniArgs []string) {
	c.t.Helper()
	isController := true
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: stickyNS, Labels: sts.Spec.Template.Labels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID, Controller: &isController}}},
		Spec: corev1.PodSpec{NodeName: c.net.Node(i).Name, Containers: sts.Spec.Template.Spec.Containers},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := kc.CoreV1().Pods(stickyNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatalf("create Pod %s: %v", name, err)
	}
	uid = string(got.UID)
	return uid, []string{"IgnoreUnknown=1", "K8S_POD_NAMESPACE=" + stickyNS, "K8S_POD_NAME=" + name, "K8S_POD_UID=" + uid}
}

// deletePod deletes the Pod object name at once (no kubelet waits on it).
func (c *cluster) deletePod(kc *kubernetes.Clientset, name string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var now int64
	if err := kc.CoreV1().Pods(stickyNS).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &now}); err != nil {
		c.t.Fatalf("delete Pod %s: %v", name, err)
	}
}

// leaseWhy is the WHY of the lease of sandbox cid on node i's agent, as
// `ipledgerctl leases -o json` shows it.
func (c *cluster) leaseWhy(i int, cid string) string {
	c.t.Helper()
	stdout, stderr, code := agentenv.Ctl(c.t, "--socket", c.agents[i].Socket, "leases", "-o", "json")
	if code != 0 {
		c.t.Fatalf("ipledgerctl leases on %s exited %d: %s", c.net.Node(i).Name, code, stderr)
	}
	var ls []api.LeaseView
	if err := json.Unmarshal([]byte(stdout), &ls); err != nil {
		c.t.Fatalf("ipledgerctl leases: %v\n%s", err, stdout)
	}
	for _, l := range ls {
		if l.ContainerID == cid {
			return l.Why
		}
	}
	c.t.Fatalf("ipledgerctl leases on %s: no lease of sandbox %s: %s", c.net.Node(i).Name, cid, stdout)
	return ""
}

// routesTo are node i's routes of ipledger's protocol to the single address x.
func (c *cluster) routesTo(i int, x netip.Addr) []route {
	have, _ := c.routes(i)
	var out []route
	for _, r := range have {
		if d := strings.Fields(strings.TrimPrefix(string(r), "unreachable "))[0]; d == x.String() || d == netip.PrefixFrom(x, x.BitLen()).String() {
			out = append(out, r)
		}
	}
	return out
}

// waitRoutedTo waits until every node but holder routes x (one route, of
// ipledger's protocol) via holder's address, and holder has no such route.
func (c *cluster) waitRoutedTo(x netip.Addr, holder int) {
	c.t.Helper()
	for j := range c.net.Nodes {
		var want []route
		if j != holder {
			want = []route{route(fmt.Sprintf("%s via %s", x, c.net.Node(holder).Addr4))}
		}
		for t0 := time.Now(); ; time.Sleep(50 * time.Millisecond) {
			have := c.routesTo(j, x)
			if fmt.Sprint(have) == fmt.Sprint(want) {
				break
			}
			if time.Since(t0) > blockRouted {
				c.t.Fatalf("%s: routes of proto 201 to %s after %v: %v, want %v", c.net.Node(j).Name, x, blockRouted, have, want)
			}
		}
	}
}

// TestStickyStatefulSet: three agents in cluster mode on the Kubernetes
// datastore. A StatefulSet's pod web-0, created on node0, deleted and re-created
// (a new UID) on node1, then on node2, gets the same address each time, borrowed
// from node0's block: every other node routes that /32 to the node it runs on
// (and none to where it ran before), the pods of every node reach it, and the
// lease's WHY says so. Two nodes asked for web-0 at once (a split brain): exactly
// one gets the address, the other's ADD fails with a CNI error naming the holder,
// and a Warning Event on the pod says the same.
func TestStickyStatefulSet(t *testing.T) {
	const nodes = 3
	c := newCluster(t, nodes, true)
	c.args = []string{"--datastore", "kubernetes"}
	for i := range nodes {
		c.createNode(i, nil)
	}
	for i := range nodes {
		c.startAgent(i)
	}
	c.dumpOnFailure()
	kc := c.kube()
	sts := c.createStatefulSet(kc, "web", 3)

	// a plain pod on every node: the clients
	var clients []*pod
	for i := range nodes {
		clients = append(clients, c.addPod(i, fmt.Sprintf("client%d", i), clusterRanges))
	}
	node0 := c.net.Node(0).Name

	var x netip.Addr
	var prev *stickyPod
	for step, node := range []int{0, 1, 2} {
		if prev != nil {
			// the pod is deleted: its sandbox's DEL, then its Pod object
			if out, code := c.cni(prev.node, "DEL", prev.cid, prev.NS, clusterRanges, prev.args...); code != 0 {
				t.Fatalf("DEL of web-0 on node%d exited %d: %s", prev.node, code, out)
			}
			c.deletePod(kc, "web-0")
		}
		_, args := c.createStickyPod(kc, sts, node, "web-0")
		name := fmt.Sprintf("web-0-%d", step) // the sandbox's netns and container ID
		p := &stickyPod{pod: c.addPod(node, name, clusterRanges, args...), args: args, cid: "cid-" + name}
		serveSource(t, p.NS)
		why := c.leaseWhy(node, p.cid)
		if step == 0 {
			x = p.addr(true)
			if want := "sticky for web-0 (StatefulSet default/web)"; why != want {
				t.Fatalf("web-0 on node0: WHY %q, want %q", why, want)
			}
		} else {
			if got := p.addr(true); got != x {
				t.Fatalf("web-0 re-created on node%d got %s, want its address %s", node, got, x)
			}
			if want := "sticky for web-0, borrowed from node " + node0; why != want {
				t.Fatalf("web-0 on node%d: WHY %q, want %q", node, why, want)
			}
			c.waitRoutedTo(x, node)
		}
		t.Logf("web-0 on %s: %s, WHY %q", c.net.Node(node).Name, p.addr(true), why)
		for j := range nodes {
			_, raw := c.routes(j)
			t.Logf("ip route show proto 201 on %s:\n%s", c.net.Node(j).Name, raw)
		}
		for _, cl := range clients {
			src, err := sourceSeen(cl.NS, x)
			if err != nil {
				t.Fatalf("pod %s on node%d -> web-0 on node%d (%s): %v", cl.name, cl.node, node, x, err)
			}
			if src != cl.addr(true) {
				t.Fatalf("pod %s -> web-0: the listener saw %s, want %s", cl.name, src, cl.addr(true))
			}
		}
		prev = p
	}

	// web-0 deleted on node2, and asked for by node1 and node2 at once under the
	// same UID (a partition's split brain): the block's compare-and-swap decides
	if out, code := c.cni(prev.node, "DEL", prev.cid, prev.NS, clusterRanges, prev.args...); code != 0 {
		t.Fatalf("DEL of web-0 on node2 exited %d: %s", code, out)
	}
	c.deletePod(kc, "web-0")
	c.waitNotRouted(x)
	uid, args := c.createStickyPod(kc, sts, 1, "web-0")
	type answer struct {
		node int
		out  []byte
		code int
	}
	answers := make([]answer, 2)
	raceNS := map[int]*netnodes.NS{}
	var wg sync.WaitGroup
	for k, node := range []int{1, 2} {
		ns := c.net.Namespace(fmt.Sprintf("p-race%d", node))
		raceNS[node] = ns
		cid := fmt.Sprintf("cid-race%d", node)
		c.t.Cleanup(func() { c.cni(node, "DEL", cid, ns, clusterRanges, args...) })
		wg.Go(func() {
			out, code := c.cni(node, "ADD", cid, ns, clusterRanges, args...)
			answers[k] = answer{node: node, out: out, code: code}
		})
	}
	wg.Wait()
	var won, lost []answer
	for _, a := range answers {
		if a.code == 0 {
			won = append(won, a)
		} else {
			lost = append(lost, a)
		}
	}
	if len(won) != 1 || len(lost) != 1 {
		t.Fatalf("two nodes asked for web-0 at once: %d ADDs succeeded, %d failed, want one each: %+v", len(won), len(lost), answers)
	}
	var res struct {
		IPs []struct {
			Address string `json:"address"`
		} `json:"ips"`
	}
	if err := json.Unmarshal(won[0].out, &res); err != nil || len(res.IPs) == 0 || !strings.HasPrefix(res.IPs[0].Address, x.String()+"/") {
		t.Fatalf("the winner on node%d: result %s (%v), want address %s", won[0].node, won[0].out, err, x)
	}
	var ce cniError
	if err := json.Unmarshal(lost[0].out, &ce); err != nil {
		t.Fatalf("the loser on node%d: output %q: %v", lost[0].node, lost[0].out, err)
	}
	winner := c.net.Node(won[0].node).Name
	if ce.Code != 7 || !strings.Contains(ce.Msg, "borrowed by node "+winner) {
		t.Fatalf("the loser on node%d: CNI error %d %q, want 7 naming node %s", lost[0].node, ce.Code, ce.Msg, winner)
	}
	t.Logf("race for web-0: node%d won; node%d's ADD failed with CNI error %d: %s", won[0].node, lost[0].node, ce.Code, ce.Msg)
	ev := c.waitPodEvent(kc, "web-0", uid, "StickyAddressHeld")
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "borrowed by node "+winner) {
		t.Fatalf("Event on web-0: %s %q, want a Warning naming node %s", ev.Type, ev.Message, winner)
	}
	c.waitRoutedTo(x, won[0].node)

	// web-1 and web-2 on node1, from node1's block; the StatefulSet scaled down to
	// 1: their addresses are no longer kept, web-0's is
	for _, name := range []string{"web-1", "web-2"} {
		_, args := c.createStickyPod(kc, sts, 1, name)
		p := c.addPod(1, name, clusterRanges, args...)
		t.Logf("%s on node1: %s", name, p.addr(true))
	}
	keptBefore := c.kept(1)
	t.Logf("kept before the scale-down: %v", keptBefore)
	if len(keptBefore) != 3 || keptBefore["default/web/web-0"] != x.String() {
		t.Fatalf("kept: %v, want web-0 (%s), web-1, web-2", keptBefore, x)
	}
	c.scale(kc, "web", 1)
	c.waitKept(func(k map[string]string) bool { return len(k) == 1 && k["default/web/web-0"] == x.String() }, "web-0's only")
	// deleted: web-0's address is released once its holder gives it back
	if out, code := c.cni(won[0].node, "DEL", fmt.Sprintf("cid-race%d", won[0].node), raceNS[won[0].node], clusterRanges, args...); code != 0 {
		t.Fatalf("DEL of web-0 on node%d exited %d: %s", won[0].node, code, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := kc.AppsV1().StatefulSets(stickyNS).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitKept(func(k map[string]string) bool { return len(k) == 0 }, "none")
	c.waitNotRouted(x)
}

// kept is the addresses kept for StatefulSet pods in the blocks `ipledgerctl
// blocks -o json` of node i's agent shows: address by pod ("ns/sts/pod").
func (c *cluster) kept(i int) map[string]string {
	c.t.Helper()
	out := map[string]string{}
	for _, b := range c.blockViews(i) {
		for _, k := range b.Borrows {
			out[k.For] = k.Addr
		}
	}
	return out
}

// waitKept waits until the kept addresses (as node0 shows them) satisfy ok.
func (c *cluster) waitKept(ok func(map[string]string) bool, want string) {
	c.t.Helper()
	for t0 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		k := c.kept(0)
		if ok(k) {
			return
		}
		if time.Since(t0) > 30*time.Second {
			c.t.Fatalf("kept addresses after 30s: %v, want %s", k, want)
		}
	}
}

// scale sets the StatefulSet's spec.replicas.
func (c *cluster) scale(kc *kubernetes.Clientset, name string, replicas int32) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sc, err := kc.AppsV1().StatefulSets(stickyNS).GetScale(ctx, name, metav1.GetOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	sc.Spec.Replicas = replicas
	if _, err := kc.AppsV1().StatefulSets(stickyNS).UpdateScale(ctx, name, sc, metav1.UpdateOptions{}); err != nil {
		c.t.Fatalf("scale StatefulSet %s to %d: %v", name, replicas, err)
	}
}

// waitNotRouted waits until no node has a route of ipledger's protocol to x.
func (c *cluster) waitNotRouted(x netip.Addr) {
	c.t.Helper()
	for j := range c.net.Nodes {
		for t0 := time.Now(); len(c.routesTo(j, x)) > 0; time.Sleep(50 * time.Millisecond) {
			if time.Since(t0) > blockRouted {
				c.t.Fatalf("%s: routes of proto 201 to %s left after %v: %v", c.net.Node(j).Name, x, blockRouted, c.routesTo(j, x))
			}
		}
	}
}

// waitPodEvent waits for an Event of reason on the pod name (uid) and returns it.
func (c *cluster) waitPodEvent(kc *kubernetes.Clientset, name, uid, reason string) corev1.Event {
	c.t.Helper()
	for t0 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		evs, err := kc.CoreV1().Events(stickyNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
		cancel()
		if err != nil {
			c.t.Fatal(err)
		}
		for _, e := range evs.Items {
			if string(e.InvolvedObject.UID) == uid {
				return e
			}
		}
		if time.Since(t0) > 30*time.Second {
			c.t.Fatalf("no Event %s on pod %s/%s after 30s: %d others", reason, stickyNS, name, len(evs.Items))
		}
	}
}
