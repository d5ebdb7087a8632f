package nodesenv

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// SecondPool is the range of the IPPool that Setup.TwoPools adds beside
// deploy/cluster's pool (ClusterPool), and SecondPoolName its name.
var SecondPool = netip.MustParsePrefix("10.245.0.0/16")

const SecondPoolName = "e2e"

// PoolAnnotation is the annotation that chooses a pod's pool (on the pod or
// its namespace).
const PoolAnnotation = "ipledger.io/pool"

// PoolManifest is an IPPool named name over the one IPv4 range r, split into
// blocks of /blockSize.
func PoolManifest(name string, r netip.Prefix, blockSize int) string {
	return fmt.Sprintf(`{"apiVersion":"ipledger.io/v1alpha1","kind":"IPPool","metadata":{"name":%q},"spec":{"ranges":[[{"subnet":%q}]],"blockSize":%d}}`,
		name, r.String(), blockSize)
}

// NamespaceManifest is the Namespace name with annotations.
func NamespaceManifest(name string, annotations map[string]string) string {
	return manifest(&corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
	})
}

// AddPool applies the IPPool name over r (blocks of /26), in cluster mode, and
// widens PodNetwork (kube-proxy's --cluster-cidr, given to the kube-proxies
// started from then on) to cover it.
func (cl *Cluster) AddPool(name string, r netip.Prefix) {
	cl.T.Helper()
	if !cl.ClusterMode {
		cl.T.Fatalf("nodesenv: IPPool %s: named pools are cluster mode's; install deploy/cluster first", name)
	}
	cl.C.Apply(cl.T, PoolManifest(name, r, 26))
	cl.pools = append(cl.pools, r)
}

// Covering is the smallest prefix that contains every prefix of ps (all of
// one family): kube-proxy takes one cluster CIDR per family, and it must
// cover every pool, or kube-proxy masquerades Service traffic from the pods
// outside it.
func Covering(ps ...netip.Prefix) netip.Prefix {
	c := ps[0]
	for _, p := range ps[1:] {
		for bits := min(c.Bits(), p.Bits()); bits >= 0; bits-- {
			w := netip.PrefixFrom(c.Addr(), bits).Masked()
			if w.Contains(p.Addr()) {
				c = w
				break
			}
		}
	}
	return c
}

// poolPolicy is a MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, on
// by default since Kubernetes 1.36) and its binding: every Namespace created
// from then on, other than default and kube-*, is annotated with
// ipledger.io/pool=%[1]s, so that every pod of a namespace the e2e suite
// creates asks for pool %[1]s.
const poolPolicy = `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {name: ipledger-pool-%[1]s}
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE]
      resources: [namespaces]
  matchConditions:
  - name: not-the-system
    expression: "!object.metadata.name.startsWith('kube-') && object.metadata.name != 'default'"
  failurePolicy: Fail
  reinvocationPolicy: Never
  mutations:
  - patchType: ApplyConfiguration
    applyConfiguration:
      expression: 'Object{metadata: Object.metadata{annotations: {"%[2]s": "%[1]s"}}}'
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {name: ipledger-pool-%[1]s}
spec:
  policyName: ipledger-pool-%[1]s
`

// PoolForNewNamespaces makes pool the pool of every namespace created from
// now on (but default and kube-*), by annotating it at admission, and waits
// until the apiserver applies the policy (a probe namespace comes out
// annotated).
func (cl *Cluster) PoolForNewNamespaces(pool string) {
	t := cl.T
	t.Helper()
	cl.C.Apply(t, fmt.Sprintf(poolPolicy, pool, PoolAnnotation))
	probe := 0
	if err := kubeenv.WaitFor(time.Minute, time.Second, func() (bool, error) {
		probe++
		ns := fmt.Sprintf("ipledger-pool-probe-%d", probe)
		if out, err := cl.C.Kubectl("create", "namespace", ns); err != nil {
			return false, fmt.Errorf("%v: %s", err, out)
		}
		got, err := cl.C.Kubectl("get", "namespace", ns, "-o", "jsonpath={.metadata.annotations."+strings.ReplaceAll(PoolAnnotation, ".", `\.`)+"}")
		if _, derr := cl.C.Kubectl("delete", "namespace", ns, "--wait=false"); derr != nil {
			t.Log(derr)
		}
		if err != nil {
			return false, err
		}
		return got == pool, fmt.Errorf("namespace %s created with %s=%q, want %q (policy not applied yet)", ns, PoolAnnotation, got, pool)
	}); err != nil {
		t.Fatal(err)
	}
}

// seenPod is what the pool sampler reads of a pod.
type seenPod struct {
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
		UID       string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		NodeName    string `json:"nodeName"`
		HostNetwork bool   `json:"hostNetwork"`
	} `json:"spec"`
	Status struct {
		PodIP string `json:"podIP"`
	} `json:"status"`
}

// poolSampler lists every pod every few seconds while the suite runs and keeps
// each pod network pod's address, by UID.
type poolSampler struct {
	cl     *Cluster
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	pods   map[string]seenPod
	errs   int
}

func (cl *Cluster) samplePods(every time.Duration) *poolSampler {
	ctx, cancel := context.WithCancel(context.Background())
	s := &poolSampler{cl: cl, cancel: cancel, done: make(chan struct{}), pods: map[string]seenPod{}}
	go func() {
		defer close(s.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.sample()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *poolSampler) sample() {
	var l struct {
		Items []seenPod `json:"items"`
	}
	err := s.cl.C.GetJSON(&l, "pods", "-A")
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.errs++
		return
	}
	for _, p := range l.Items {
		if !p.Spec.HostNetwork && p.Status.PodIP != "" {
			s.pods[p.Metadata.UID] = p
		}
	}
}

// stop ends the sampling after one last sample; errs is how many listings
// failed.
func (s *poolSampler) stop() (pods map[string]seenPod, errs int) {
	s.cancel()
	<-s.done
	s.sample()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pods, s.errs
}

// checkPools fails t unless every pod seen in a namespace the policy
// annotated (all but default and kube-*) had an address of second, every
// other pod one of ClusterPool, and pods of second ran on every node.
func (cl *Cluster) checkPools(t *testing.T, pods map[string]seenPod, errs int, second string, r netip.Prefix) {
	t.Helper()
	if errs > 0 {
		t.Logf("pools: %d of the sampler's pod listings failed (kubectl); the check reads the others", errs)
	}
	nodes := map[string]int{}
	inSecond, inFirst := 0, 0
	var wrong []string
	for _, p := range pods {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		ns := p.Metadata.Namespace
		want, pool := ClusterPool, "the default pool"
		if ns != "default" && !strings.HasPrefix(ns, "kube-") {
			want, pool = r, "pool "+second
		}
		if err != nil || !want.Contains(ip) {
			wrong = append(wrong, fmt.Sprintf("%s/%s on %s: %s, want an address of %s (%s)", ns, p.Metadata.Name, p.Spec.NodeName, p.Status.PodIP, pool, want))
			continue
		}
		if want == r {
			inSecond++
			nodes[p.Spec.NodeName]++
		} else {
			inFirst++
		}
	}
	sort.Strings(wrong)
	t.Logf("pools: %d pods of the suite's namespaces had addresses of pool %s (%s), by node %v; %d pods of default and kube-* had the default pool's (%s)",
		inSecond, second, r, nodes, inFirst, ClusterPool)
	for _, w := range wrong {
		t.Errorf("pools: %s", w)
	}
	if len(nodes) < len(cl.Nodes) {
		t.Errorf("pools: pool %s's pods ran on %d of %d nodes: the check saw too little of the suite", second, len(nodes), len(cl.Nodes))
	}
	if inFirst == 0 {
		t.Errorf("pools: no pod of the default pool seen (CoreDNS runs in kube-system): the sampler saw nothing")
	}
}
