package kubeenv

import (
	"reflect"
	"testing"
)

// TestClusterFlagsPerFamily: without DualStack the controller manager, the
// apiserver and the kubelet get exactly the single-stack flags they always
// had; with it, two CIDRs each, per-family mask sizes (the controller manager
// refuses --node-cidr-mask-size with two cluster CIDRs) and both node
// addresses.
func TestClusterFlagsPerFamily(t *testing.T) {
	single := Options{ClusterCIDR: "10.236.0.0/16"}
	dual := Options{ClusterCIDR: "10.236.0.0/16", DualStack: true}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"single kcm", single.nodeCIDRArgs(), []string{"--allocate-node-cidrs", "--cluster-cidr", "10.236.0.0/16", "--node-cidr-mask-size", "24"}},
		{"single services", single.serviceCIDRs(), "10.96.0.0/24"},
		{"single node-ip", (&Node{IP: "10.250.0.11"}).nodeIPs(), "10.250.0.11"},
		{"dual kcm", dual.nodeCIDRArgs(), []string{"--allocate-node-cidrs", "--cluster-cidr", "10.236.0.0/16,fd00:236::/56",
			"--node-cidr-mask-size-ipv4", "24", "--node-cidr-mask-size-ipv6", "64"}},
		{"dual services", dual.serviceCIDRs(), "10.96.0.0/24,fd00:96::/108"},
		{"dual node-ip", (&Node{IP: "10.250.0.11", IP6: "fd00:250::11"}).nodeIPs(), "10.250.0.11,fd00:250::11"},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}
