package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock/clocktest"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledger/ledgertest"
	"github.com/ipledger/ipledger/internal/store/boltstore"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// poolNode is an agent in cluster mode on the Kubernetes datastore, with the
// watch of its node's pods (annotations) on the same kube-apiserver.
type poolNode struct {
	name string
	s    *agent.Server
	l    *ledger.Ledger
	m    *cluster.Manager
	ev   *recordedEvents
}

// annotatedPoolsClusterMode: on a real kube-apiserver serving the pods, the
// namespaces, the Nodes and the datastore (kubeds, IPPools applied as an operator
// does), a namespace annotated ipledger.io/pool: blue gets blue's addresses on
// either node, in blocks of blue each node claims, with the reason in the lease; a
// pod's own annotation wins over its namespace's; a pool the node's labels do not
// select, a pool that does not exist and a pool name that does not parse fail the
// ADD with the message and a Warning Event, allocating nothing (ledger and
// datastore unchanged); DEL gives a pool's address back to the pool.
func annotatedPoolsClusterMode(t *testing.T, srv *kubeenv.APIServer) {
	cfg := srv.Config()
	ctx := context.Background()
	manifest, err := os.ReadFile(filepath.Join("..", "..", "deploy", "ipledger.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubeds.InstallCRDs(ctx, cfg, manifest); err != nil {
		t.Fatal(err)
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct{ name, zone string }{{"node-a", "a"}, {"node-b", "b"}} {
		if _, err := c.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"zone": n.zone}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "ipledger"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Annotations: map[string]string{"ipledger.io/pool": "blue"}}},
	} {
		if _, err := c.Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	ippools := schema.GroupVersionResource{Group: kubeds.Group, Version: kubeds.Version, Resource: "ippools"}
	for name, spec := range map[string]map[string]any{
		"blue":  {"ranges": []any{[]any{map[string]any{"subnet": "10.50.0.0/24"}}}, "blockSize": int64(28)},
		"green": {"ranges": []any{[]any{map[string]any{"subnet": "10.60.0.0/24"}}}, "nodeSelector": map[string]any{"zone": "a"}},
	} {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": kubeds.Group + "/" + kubeds.Version, "kind": "IPPool",
			"metadata": map[string]any{"name": name}, "spec": spec}}
		if _, err := dyn.Resource(ippools).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	clk := clocktest.New()
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	node := func(name string) *poolNode {
		t.Helper()
		ds, err := kubeds.New(cfg, kubeds.Options{Namespace: "ipledger"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ds.Close() })
		st, err := boltstore.Open(filepath.Join(t.TempDir(), "ledger.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		l := ledgertest.Open(t, st, ledger.Options{Clock: clk})
		m, err := cluster.New(ds, l, cluster.Options{Node: name, Clock: clk, LeaseTTL: 30 * time.Second, Manual: true, Logger: ledgertest.TestLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Start(ctx); err != nil {
			t.Fatal(err)
		}
		pods, err := kubenode.NewPods(cfg, name, nil, ledgertest.TestLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		pods.Run(wctx)
		ev := &recordedEvents{}
		s, err := agent.New(agent.Config{Ledger: l, Socket: filepath.Join(t.TempDir(), "s.sock"), Cluster: m, Datastore: "kubernetes",
			Pods: pods, Choices: pods, Events: ev, Clock: clk, Logger: ledgertest.TestLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return &poolNode{name: name, s: s, l: l, m: m, ev: ev}
	}
	a, b := node("node-a"), node("node-b")
	reader, err := kubeds.New(cfg, kubeds.Options{Namespace: "ipledger"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	seq := 0
	add := func(n *poolNode, ns string, ann map[string]string) *api.Response {
		t.Helper()
		seq++
		name := fmt.Sprintf("p%d", seq)
		p, err := c.Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec: corev1.PodSpec{NodeName: n.name, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		req := api.Request{Version: api.Version, Op: api.OpAdd, Network: "pods", ContainerID: name, IfName: "eth0",
			Ranges: ledgertest.Ranges(t, `[[{"subnet":"10.40.0.0/24"}]]`), BlockSize: 28,
			Pod: api.Pod{Namespace: ns, Name: name, UID: string(p.UID)}}
		return n.s.Handle(ctx, req)
	}
	ok := func(r *api.Response, subnet, why string) netip.Addr {
		t.Helper()
		if r.Error != nil || r.Lease == nil {
			t.Fatalf("ADD: %+v", r.Error)
		}
		ip := netip.MustParsePrefix(r.Lease.IPs[0])
		if !netip.MustParsePrefix(subnet).Contains(ip.Addr()) || ip.Bits() != 24 || r.Lease.Why != why {
			t.Fatalf("lease %v why %q, want an address of %s why %q", r.Lease.IPs, r.Lease.Why, subnet, why)
		}
		return ip.Addr()
	}
	ok(add(a, "team-a", nil), "10.40.0.0/24", agent.WhyDefault)
	blueA := ok(add(a, "team-b", nil), "10.50.0.0/24", "pool blue (annotation ipledger.io/pool on namespace team-b)")
	blueB := ok(add(b, "team-b", nil), "10.50.0.0/24", "pool blue (annotation ipledger.io/pool on namespace team-b)")
	if pa, _ := blueA.Prefix(28); pa.Contains(blueB) {
		t.Fatalf("node-a's %s and node-b's %s share a /28 block of blue", blueA, blueB)
	}
	r := add(a, "team-b", map[string]string{"ipledger.io/pool": "green"})
	ok(r, "10.60.0.0/24", fmt.Sprintf("pool green (annotation ipledger.io/pool on pod team-b/p%d)", seq))
	// every block of blue is in the datastore, owned by the node that serves it
	blocks, err := cluster.ReadBlocks(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]string{}
	for _, blk := range blocks {
		owners[blk.Network+" "+blk.CIDR.String()] = blk.Owner
	}
	if pa, _ := blueA.Prefix(28); owners["blue "+pa.String()] != "node-a" {
		t.Errorf("block of %s: owners %v, want node-a's block of blue", blueA, owners)
	}
	if pb, _ := blueB.Prefix(28); owners["blue "+pb.String()] != "node-b" {
		t.Errorf("block of %s: owners %v, want node-b's block of blue", blueB, owners)
	}
	b.ev.take()
	before := fmt.Sprint(owners)
	for _, tc := range []struct {
		name  string
		ns    string
		ann   map[string]string
		words []string
	}{
		{"node not selected", "team-a", map[string]string{"ipledger.io/pool": "green"}, []string{"ipledger.io/pool on pod team-a/", `asks for pool "green"`, "IPPool green selects nodes labelled zone=a; node node-b is not one (its labels: zone=b)"}},
		{"pool missing", "team-a", map[string]string{"ipledger.io/pool": "purple"}, []string{"ipledger.io/pool on pod team-a/", `no IPPool named "purple" exists; create it`, "remove the annotation"}},
		{"pool name does not parse", "team-b", map[string]string{"ipledger.io/pool": "Blue!"}, []string{"ipledger.io/pool on pod team-b/", "DNS label"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leases := len(b.l.Leases(""))
			resp := add(b, tc.ns, tc.ann)
			if resp.Error == nil || resp.Error.Code != api.CodeInvalid {
				t.Fatalf("ADD answered %+v, want an invalid-config error", resp)
			}
			for _, w := range tc.words {
				if !strings.Contains(resp.Error.Msg, w) {
					t.Errorf("error %q lacks %q", resp.Error.Msg, w)
				}
			}
			got := b.ev.take()
			if len(got) != 1 || got[0].typ != "Warning" || got[0].reason != agent.ReasonAddressChoiceRefused || got[0].note != resp.Error.Msg {
				t.Errorf("events %+v, want one Warning %s saying the error", got, agent.ReasonAddressChoiceRefused)
			}
			if n := len(b.l.Leases("")); n != leases {
				t.Errorf("a refused ADD allocated: %d leases before, %d after", leases, n)
			}
			if _, err := b.l.Pool("green"); err == nil {
				t.Errorf("node-b set up pool green")
			}
		})
	}
	blocks, err = cluster.ReadBlocks(ctx, reader)
	if err != nil {
		t.Fatal(err)
	}
	after := map[string]string{}
	for _, blk := range blocks {
		after[blk.Network+" "+blk.CIDR.String()] = blk.Owner
	}
	if fmt.Sprint(after) != before {
		t.Errorf("refused ADDs changed the blocks:\n%s\n%v", before, after)
	}
	// DEL by the attachment's key returns blue's address to blue
	for _, ls := range a.l.Leases("pods") {
		if ls.Pool == "blue" {
			resp := a.s.Handle(ctx, api.Request{Version: api.Version, Op: api.OpDel, Network: "pods", ContainerID: ls.Key.ContainerID, IfName: "eth0"})
			if resp.Error != nil || resp.Released != 1 {
				t.Fatalf("DEL %s: %+v", ls.Key, resp)
			}
		}
	}
	if ps, err := a.l.Pool("blue"); err != nil || ps.InUse != 0 || ps.Free != 1 {
		t.Fatalf("pool blue on node-a after DEL: %+v %v, want its address free", ps, err)
	}
	var books []cluster.NodeBooks
	for _, n := range []*poolNode{a, b} {
		books = append(books, cluster.NodeBooks{Node: n.name, Leases: n.l.Leases(""), Blocks: n.l.Blocks("")})
	}
	if rep := cluster.Audit(blocks, books); len(rep.DoubleHeld) > 0 || len(rep.Outside) > 0 {
		t.Errorf("cluster audit: %+v", rep)
	}
}
