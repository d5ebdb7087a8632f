//go:build kubelet

package kubeenv_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/ipledger/ipledger/internal/testenv/kubeenv"
)

// TestDualStackControlPlane: with Options.DualStack the control plane is
// IPv4/IPv6 dual-stack as kubeadm's is with two pod and two Service CIDRs:
// kube-controller-manager gives a registered Node a podCIDR of each family (a
// /24 of the IPv4 cluster CIDR first, then a /64 of ClusterCIDR6), and a
// Service asking for both families gets a ClusterIP of each, the IPv6 one in
// ServiceCIDR6, while one that asks for nothing stays single-stack IPv4 (the
// primary family). No kubelet: the Nodes are objects, which is all the
// controller manager looks at.
func TestDualStackControlPlane(t *testing.T) {
	t0 := time.Now()
	c := kubeenv.StartControlPlane(t, kubeenv.Options{DualStack: true})
	t.Logf("dual-stack control plane up in %v", time.Since(t0).Round(time.Millisecond))
	v4, v6 := netip.MustParsePrefix(c.ClusterCIDR()), netip.MustParsePrefix(kubeenv.ClusterCIDR6)
	if got := c.ClusterCIDRs(); len(got) != 2 || got[1] != kubeenv.ClusterCIDR6 {
		t.Fatalf("ClusterCIDRs() = %q, want the IPv4 one and %s", got, kubeenv.ClusterCIDR6)
	}
	seen := map[netip.Prefix]string{}
	for _, name := range []string{"dual-a", "dual-b"} {
		c.Apply(t, fmt.Sprintf(`{"apiVersion":"v1","kind":"Node","metadata":{"name":%q}}`, name))
		var cidrs []string
		if err := kubeenv.WaitFor(time.Minute, 200*time.Millisecond, func() (bool, error) {
			out, err := c.Kubectl("get", "node", name, "-o", "jsonpath={.spec.podCIDRs}")
			if err != nil {
				return false, err
			}
			cidrs = nil
			if strings.TrimSpace(out) != "" {
				if err := json.Unmarshal([]byte(out), &cidrs); err != nil {
					return false, fmt.Errorf("podCIDRs %q: %v", out, err)
				}
			}
			return len(cidrs) > 0, fmt.Errorf("node %s: no podCIDRs yet", name)
		}); err != nil {
			t.Fatalf("%v\n%s", err, c.Log("kube-controller-manager", 20))
		}
		if len(cidrs) != 2 {
			t.Fatalf("node %s: spec.podCIDRs %q, want an IPv4 /%d and an IPv6 /%d", name, cidrs, kubeenv.NodeCIDRMask4, kubeenv.NodeCIDRMask6)
		}
		for i, want := range []struct {
			in   netip.Prefix
			bits int
		}{{v4, kubeenv.NodeCIDRMask4}, {v6, kubeenv.NodeCIDRMask6}} {
			p, err := netip.ParsePrefix(cidrs[i])
			if err != nil || p.Bits() != want.bits || !want.in.Contains(p.Addr()) {
				t.Fatalf("node %s: spec.podCIDRs[%d] = %q, want a /%d of %s", name, i, cidrs[i], want.bits, want.in)
			}
			if other, dup := seen[p]; dup {
				t.Fatalf("nodes %s and %s both got %s", other, name, p)
			}
			seen[p] = name
		}
		t.Logf("node %s: spec.podCIDRs %q", name, cidrs)
	}

	svc6 := netip.MustParsePrefix(kubeenv.ServiceCIDR6)
	svc4 := netip.MustParsePrefix(kubeenv.ServiceCIDR)
	for _, tc := range []struct {
		name, policy string
		want         []netip.Prefix
	}{
		{"both", `"ipFamilyPolicy":"RequireDualStack",`, []netip.Prefix{svc4, svc6}},
		{"primary", ``, []netip.Prefix{svc4}},
	} {
		c.Apply(t, fmt.Sprintf(`{"apiVersion":"v1","kind":"Service","metadata":{"name":%q,"namespace":"default"},"spec":{%s"ports":[{"port":80}]}}`, tc.name, tc.policy))
		out := c.MustKubectl(t, "get", "service", tc.name, "-n", "default", "-o", "jsonpath={.spec.clusterIPs}")
		var ips []string
		if err := json.Unmarshal([]byte(out), &ips); err != nil {
			t.Fatalf("service %s: clusterIPs %q: %v", tc.name, out, err)
		}
		if len(ips) != len(tc.want) {
			t.Fatalf("service %s: clusterIPs %q, want one in each of %v", tc.name, ips, tc.want)
		}
		for i, in := range tc.want {
			if a, err := netip.ParseAddr(ips[i]); err != nil || !in.Contains(a) {
				t.Fatalf("service %s: clusterIPs[%d] = %q, want an address of %s", tc.name, i, ips[i], in)
			}
		}
		t.Logf("service %s: clusterIPs %q", tc.name, ips)
	}
}
