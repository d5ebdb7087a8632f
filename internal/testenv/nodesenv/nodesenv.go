// Package nodesenv is the three-node Kubernetes environment of ipledger's
// kubelet tests: a control plane on the host and n kubelet nodes, each a
// network namespace on netnodes' bridge with a mount namespace, a containerd
// and a kubelet of its own (kubeenv.StartControlPlane and Cluster.AddNode),
// ipledger installed from deploy/ unchanged, and the busybox pods the tests
// run. test/kubenodes, test/kubewitness and test/kubeupstream share it, each
// package a test binary of its own so that each fits go test's default
// timeout (see internal/testenv/README.md).
package nodesenv

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipledger/ipledger/internal/image"
	"github.com/ipledger/ipledger/internal/testenv"
	"github.com/ipledger/ipledger/internal/testenv/agentenv"
	"github.com/ipledger/ipledger/internal/testenv/debpkg"
	"github.com/ipledger/ipledger/internal/testenv/e2eenv"
	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
	"github.com/ipledger/ipledger/internal/testenv/netnodes"
)

// PodImage is the pods' image: busybox, imported on every node, never pulled.
const PodImage = "ipledger.local/busybox:test"

// Cluster is a control plane and its nodes; T is the test its helpers fail.
type Cluster struct {
	T     testing.TB
	C     *kubeenv.Cluster
	Env   *netnodes.Env
	Nodes []*kubeenv.Node
	// ClusterMode: ipledger installed from deploy/cluster (pods get
	// addresses in ClusterPool, not in their Node's podCIDR).
	ClusterMode bool
	// pools: the ranges of the IPPools AddPool applied
	pools []netip.Prefix
}

// Setup is how Upstream builds its cluster.
type Setup struct {
	// ClusterMode installs ipledger from deploy/cluster (kubectl apply -k);
	// otherwise deploy/ipledger.yaml.
	ClusterMode bool
	// DualStack makes the cluster IPv4/IPv6 dual-stack (kubeenv's
	// Options.DualStack) and installs ipledger from deploy/dualstack
	// (kubectl apply -k: usePodCidr and usePodCidrIPv6), node mode only.
	DualStack bool
	// TwoPools (cluster mode): the IPPool SecondPoolName over SecondPool
	// beside deploy/cluster's pool, and every namespace created after the
	// install (the suite's, all but default and kube-*) annotated at
	// admission to take its pods' addresses from it (PoolForNewNamespaces).
	// While the suite runs every pod is sampled; Upstream fails unless each
	// pod's address came from the pool its namespace chose.
	TwoPools bool
}

// Images writes the ipledger image (as `make image` builds it) and a busybox
// image into dir.
func Images(t testing.TB, dir string) []string {
	t.Helper()
	spec, err := image.IpledgerSpec(agentenv.Bin(t), "ipledger:dev")
	if err != nil {
		t.Fatal(err)
	}
	ipl := filepath.Join(dir, "ipledger.tar")
	if err := image.WriteFile(spec, ipl); err != nil {
		t.Fatal(err)
	}
	debpkg.Need(t, debpkg.BusyBox) // the pods' image
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	box := filepath.Join(dir, "busybox.tar")
	if err := image.WriteFile(image.Spec{Tag: PodImage, Files: []image.File{{Path: "bin/busybox", Mode: 0o755, Data: bb}},
		Dirs: []string{"tmp", "etc", "proc", "sys", "dev"}, Entrypoint: []string{"/bin/busybox"}}, box); err != nil {
		t.Fatal(err)
	}
	return []string{ipl, box}
}

// Start brings up the control plane and n nodes with more images (docker
// archives) on every node, applies deploy/ipledger.yaml unchanged (or
// deploy/cluster with kubectl apply -k when clusterMode) and waits until every
// node is Ready with its agent Ready.
func Start(t testing.TB, n int, clusterMode bool, extra []string) *Cluster {
	t.Helper()
	cl := startNodesWith(t, n, extra, kubeenv.Options{})
	cl.Install(clusterMode)
	return cl
}

// StartNodes brings up the control plane and n nodes, with no pod network:
// the nodes are NotReady until one is installed.
func StartNodes(t testing.TB, n int) *Cluster {
	t.Helper()
	return startNodesWith(t, n, nil, kubeenv.Options{})
}

// StartNodesMaxPods is StartNodes with each kubelet's maxPods raised (or
// lowered) to maxPods, as an operator sets it in the KubeletConfiguration.
func StartNodesMaxPods(t testing.TB, n, maxPods int) *Cluster {
	t.Helper()
	return startNodesWith(t, n, nil, kubeenv.Options{MaxPods: maxPods})
}

// startNodesWith brings up the control plane with opts (its StartTimeout
// 2 minutes) and n nodes with more images.
func startNodesWith(t testing.TB, n int, extra []string, opts kubeenv.Options) *Cluster {
	t.Helper()
	testenv.SkipIfShort(t, "needs a Kubernetes build")
	imgs := append(Images(t, t.TempDir()), extra...)
	t0 := time.Now()
	opts.StartTimeout = 2 * time.Minute
	c := kubeenv.StartControlPlane(t, opts)
	t.Logf("control plane up in %v", time.Since(t0).Round(time.Millisecond))
	env := netnodes.New(t, n)
	cl := &Cluster{T: t, C: c, Env: env}
	for i := range n {
		t1 := time.Now()
		cl.Nodes = append(cl.Nodes, c.AddNode(t, fmt.Sprintf("node%d", i), env.Node(i), imgs...))
		t.Logf("node%d registered in %v", i, time.Since(t1).Round(time.Millisecond))
	}
	return cl
}

// InstallIpledger applies deploy/ipledger.yaml unchanged and waits until
// every node is Ready with its agent Ready.
func (cl *Cluster) InstallIpledger() {
	cl.T.Helper()
	cl.Install(false)
}

// Install applies deploy/ipledger.yaml, or deploy/cluster with kubectl apply
// -k when clusterMode (deploy/dualstack in a dual-stack cluster), unchanged,
// and waits until every node is Ready with its agent Ready.
func (cl *Cluster) Install(clusterMode bool) {
	t, c := cl.T, cl.C
	t.Helper()
	cl.ClusterMode = clusterMode
	t2 := time.Now()
	what := "deploy/ipledger.yaml applied"
	switch {
	case clusterMode && c.DualStack():
		t.Fatal("nodesenv: no dual-stack cluster-mode install: deploy/cluster's pool is IPv4 only; install node mode (deploy/dualstack)")
	case clusterMode:
		what = "deploy/cluster applied (kubectl apply -k)"
		c.MustKubectl(t, "apply", "-k", filepath.Join(agentenv.RepoRoot(), "deploy", "cluster"))
	case c.DualStack():
		what = "deploy/dualstack applied (kubectl apply -k)"
		c.MustKubectl(t, "apply", "-k", filepath.Join(agentenv.RepoRoot(), "deploy", "dualstack"))
	default:
		manifest, err := os.ReadFile(filepath.Join(agentenv.RepoRoot(), "deploy", "ipledger.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		c.Apply(t, string(manifest))
	}
	cl.WaitAgents(what+" unchanged", t2)
}

// WaitAgents waits until every node's agent and Node are Ready, what having
// been applied at t0.
func (cl *Cluster) WaitAgents(what string, t0 time.Time) {
	t, c, n := cl.T, cl.C, len(cl.Nodes)
	t.Helper()
	if err := kubeenv.WaitFor(3*time.Minute, time.Second, func() (bool, error) {
		pods, err := c.Pods("ipledger", "app=ipledgerd")
		if err != nil {
			return false, err
		}
		readyPods := 0
		for _, p := range pods {
			if p.Ready() {
				readyPods++
			}
		}
		if readyPods != n {
			return false, fmt.Errorf("%d of %d ipledgerd pods ready", readyPods, n)
		}
		return cl.NodesReady()
	}); err != nil {
		out, _ := c.Kubectl("describe", "pods", "-n", "ipledger")
		t.Fatalf("ipledger not installed: %v\n%s", err, out)
	}
	t.Logf("%s: %d agents and nodes Ready in %v", what, n, time.Since(t0).Round(time.Millisecond))
}

// NodesReady reports whether every node's Node is Ready.
func (cl *Cluster) NodesReady() (bool, error) {
	for _, nd := range cl.Nodes {
		st, err := cl.C.Kubectl("get", "node", nd.Name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if st != "True" {
			return false, fmt.Errorf("node %s Ready=%q (%v)", nd.Name, st, err)
		}
	}
	return true, nil
}

// PodCIDR is the Node's spec.podCIDR.
func (cl *Cluster) PodCIDR(node string) netip.Prefix {
	cl.T.Helper()
	out := cl.C.MustKubectl(cl.T, "get", "node", node, "-o", "jsonpath={.spec.podCIDR}")
	p, err := netip.ParsePrefix(strings.TrimSpace(out))
	if err != nil {
		cl.T.Fatalf("node %s podCIDR %q: %v", node, out, err)
	}
	return p
}

// PodNetwork is the range of every pod's address: kube-proxy's
// --cluster-cidr (the Nodes' podCIDRs, one CIDR per family joined with ",",
// or the cluster-wide pool, widened to cover the IPPools AddPool added).
func (cl *Cluster) PodNetwork() string {
	if cl.ClusterMode {
		return Covering(append([]netip.Prefix{ClusterPool}, cl.pools...)...).String()
	}
	return strings.Join(cl.C.ClusterCIDRs(), ",")
}

// PodRange is where node's pods get their addresses: its podCIDR, or the
// cluster-wide pool in cluster mode.
func (cl *Cluster) PodRange(node string) netip.Prefix {
	if cl.ClusterMode {
		return ClusterPool
	}
	return cl.PodCIDR(node)
}

// ClusterPool is deploy/cluster's cluster-wide pool.
var ClusterPool = netip.MustParsePrefix("10.244.0.0/16")

// BusyboxPod is the spec every pod of the kubelet tests shares: one
// container of PodImage (busybox, never pulled) named container, pinned to
// node (no scheduler placement), running command, without a service-account
// token. Callers set what their pod needs beyond that (grace, restart policy,
// ports).
func BusyboxPod(node, container string, command ...string) corev1.PodSpec {
	return corev1.PodSpec{
		NodeName:                     node,
		AutomountServiceAccountToken: new(false),
		Containers: []corev1.Container{{Name: container, Image: PodImage,
			ImagePullPolicy: corev1.PullNever, Command: command}},
	}
}

// PodManifest is the Pod name in namespace default with labels and spec, as
// kubectl apply reads it (JSON is YAML).
func PodManifest(name string, labels map[string]string, spec corev1.PodSpec) string {
	return PodManifestIn("default", name, labels, spec)
}

// PodManifestIn is PodManifest in namespace ns.
func PodManifestIn(ns, name string, labels map[string]string, spec corev1.PodSpec) string {
	return manifest(&corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec:       spec,
	})
}

// JobManifest is the Job name in namespace default running one pod of spec
// (labelled job=NAME), never retried.
func JobManifest(name string, spec corev1.PodSpec) string {
	return manifest(&batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: batchv1.JobSpec{
			BackoffLimit: new(int32(0)),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job": name}},
				Spec:       spec,
			},
		},
	})
}

func manifest(obj any) string {
	b, err := json.Marshal(obj)
	if err != nil {
		panic(fmt.Sprintf("manifest of %T: %v", obj, err)) // the API types always marshal
	}
	return string(b)
}

// Upstream brings up three nodes as s says (cluster mode, dual-stack) with
// ipledger installed, kube-proxy on each, the e2e suite's images imported and
// CoreDNS deployed as kubeadm deploys it, and runs Kubernetes' e2e suite from
// the namespace outside the cluster with the focus given.
func Upstream(t *testing.T, s Setup, o e2eenv.Options) e2eenv.Report {
	t.Helper()
	dir := t.TempDir()
	imgs := append(e2eenv.Images(t, dir), e2eenv.CoreDNSImage(t, dir))
	if s.TwoPools && !s.ClusterMode {
		t.Fatal("nodesenv: Setup.TwoPools is cluster mode's (named pools); set ClusterMode")
	}
	cl := startNodesWith(t, 3, imgs, kubeenv.Options{DualStack: s.DualStack})
	cl.Install(s.ClusterMode)
	if s.TwoPools {
		cl.AddPool(SecondPoolName, SecondPool)
		cl.PoolForNewNamespaces(SecondPoolName)
	}
	for _, nd := range cl.Nodes {
		nd.StartKubeProxy(t, cl.PodNetwork())
	}
	t0 := time.Now()
	cl.C.Apply(t, e2eenv.CoreDNSManifest)
	if out, err := cl.C.Kubectl("rollout", "status", "-n", "kube-system", "deployment/coredns", "--timeout=3m"); err != nil {
		d, _ := cl.C.Kubectl("describe", "pods", "-n", "kube-system")
		t.Fatalf("CoreDNS not ready: %v\n%s\n%s", err, out, d)
	}
	t.Logf("CoreDNS ready in %v", time.Since(t0).Round(time.Millisecond))
	if err := cl.C.RelayAPI(t, cl.Env.Outside.NS); err != nil {
		t.Fatal(err)
	}
	o.Kubeconfig, o.Kubectl, o.Netns, o.ClusterNodes = cl.C.Kubeconfig, cl.C.Bin+"/kubectl", cl.Env.Outside.Netns, len(cl.Nodes)
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	if !s.TwoPools {
		return e2eenv.Run(t, o)
	}
	sampler := cl.samplePods(10 * time.Second)
	rep := e2eenv.Run(t, o)
	pods, errs := sampler.stop()
	cl.checkPools(t, pods, errs, SecondPoolName, SecondPool)
	return rep
}
