package kubeenv

import (
	"fmt"
	"strings"
)

// The clusters' address ranges. They exist only inside the test's namespaces
// and the nodes' Services: never routed off the machine.
const (
	// DefaultClusterCIDR is Options.ClusterCIDR's default: the IPv4 pod
	// range, a /24 per Node (NodeCIDRMask4).
	DefaultClusterCIDR = "10.236.0.0/16"
	// ServiceCIDR is the Services' IPv4 range (--service-cluster-ip-range);
	// its first address is APIServiceIP, its tenth DNSServiceIP.
	ServiceCIDR = "10.96.0.0/24"
	// ServiceCIDR6 is the Services' IPv6 range of a dual-stack cluster
	// (Options.DualStack): a /108, as kubeadm's dual-stack examples give it.
	ServiceCIDR6 = "fd00:96::/108"
	// ClusterCIDR6 is the IPv6 pod range of a dual-stack cluster, which
	// kube-controller-manager splits into a /64 per Node (NodeCIDRMask6).
	ClusterCIDR6 = "fd00:236::/56"
	// NodeCIDRMask4 and NodeCIDRMask6 are the prefix lengths of a Node's
	// podCIDR of each family.
	NodeCIDRMask4 = 24
	NodeCIDRMask6 = 64
)

// serviceCIDRs is kube-apiserver's --service-cluster-ip-range: IPv4, then
// IPv6 in a dual-stack cluster (IPv4 the primary family: the kubernetes
// Service and every single-stack Service get an IPv4 ClusterIP).
func (o Options) serviceCIDRs() string {
	if o.DualStack {
		return ServiceCIDR + "," + ServiceCIDR6
	}
	return ServiceCIDR
}

// clusterCIDRs are the pod ranges the Nodes' podCIDRs are allocated from:
// o.ClusterCIDR, and ClusterCIDR6 in a dual-stack cluster.
func (o Options) clusterCIDRs() []string {
	if o.DualStack {
		return []string{o.ClusterCIDR, ClusterCIDR6}
	}
	return []string{o.ClusterCIDR}
}

// nodeCIDRArgs are kube-controller-manager's flags that give each Node its
// podCIDRs: one per family of the cluster. A dual-stack cluster needs the
// per-family mask sizes (the controller manager refuses --node-cidr-mask-size
// with two cluster CIDRs).
func (o Options) nodeCIDRArgs() []string {
	args := []string{"--allocate-node-cidrs", "--cluster-cidr", strings.Join(o.clusterCIDRs(), ",")}
	if o.DualStack {
		return append(args, "--node-cidr-mask-size-ipv4", fmt.Sprint(NodeCIDRMask4), "--node-cidr-mask-size-ipv6", fmt.Sprint(NodeCIDRMask6))
	}
	return append(args, "--node-cidr-mask-size", fmt.Sprint(NodeCIDRMask4))
}

// ClusterCIDRs are the pod ranges the Nodes' podCIDRs are allocated from, one
// per family of the cluster: kube-proxy's --cluster-cidr (joined with ",").
func (c *Cluster) ClusterCIDRs() []string { return c.opts.clusterCIDRs() }

// DualStack reports whether the cluster is IPv4/IPv6 dual-stack
// (Options.DualStack).
func (c *Cluster) DualStack() bool { return c.opts.DualStack }

// nodeIPs is the kubelet's --node-ip: the node's IPv4 address, and its IPv6
// one on the same network in a dual-stack cluster (the Node then has an
// InternalIP of each family, which pods with hostNetwork get as hostIPs and
// every agent routes that node's podCIDR of the family to).
func (n *Node) nodeIPs() string {
	if n.IP6 != "" {
		return n.IP + "," + n.IP6
	}
	return n.IP
}
