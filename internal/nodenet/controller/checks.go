package controller

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
)

// Checks are the node network's lines of `ipledgerctl doctor`: each problem with
// the node it concerns and the fix.
func (c *Controller) Checks() []api.Check {
	st := c.Status()
	var out []api.Check
	add := func(level, format string, args ...any) {
		out = append(out, api.Check{Level: level, Text: fmt.Sprintf(format, args...)})
	}
	if !st.Synced {
		add(api.CheckWarn, "node network: the Nodes have not been listed yet; routes and masquerade rules are left as they are until the API server answers (fix: check the agent's credentials and the API server)")
		return out
	}
	for _, p := range st.Problems {
		switch {
		case p.Node == c.cfg.Self && errors.Is(p.Err, nodenet.ErrNoPodCIDR) && c.cfg.Blocks == nil:
			add(api.CheckFail, "node network: this node's Node %q has no spec.podCIDRs: usePodCidr pools cannot allocate and other nodes cannot route here; fix: run kube-controller-manager with --allocate-node-cidrs and --cluster-cidr (or set the Node's spec.podCIDRs)", c.cfg.Self)
		case p.Node == c.cfg.Self:
		default:
			add(api.CheckWarn, "node network: node %s: %v; its pods are not routed from here", p.Node, p.Err)
		}
	}
	for _, cf := range st.Report.Conflicts {
		add(api.CheckFail, "node network: a route of another owner (%s) holds %s, a pod range of the cluster; ipledger leaves it alone, so the pods there may be unreachable from this node; fix: delete that route (ip route del %s) or, if the underlay routes pod addresses, run with --routes=false", cf.String(), cf.Dst, cf.Dst)
	}
	for _, in := range st.Report.Inside {
		add(api.CheckFail, "node network: a route of another owner (%s) lies inside %s, a pod range of the cluster, and takes its addresses from ipledger's route (a leftover of another CNI?); ipledger leaves it alone; fix: delete it (ip route del %s proto %s) if nothing on this node needs it", in.String(), in.Range, in.Dst, in.Protocol)
	}
	for _, o := range st.Report.OffLink {
		add(api.CheckFail, "node network: node %s's pods (%s) would be routed via %s, which is not on a directly connected network of node %s: no route was made (never through a gateway); fix: put the nodes on one L2 network, or run with --routes=false where the underlay routes pod addresses", st.byVia[o.Via], o.Dst, o.Via, c.cfg.Self)
	}
	if f := st.Forward; f != nil {
		for _, fam := range []struct {
			name string
			s    masq.FamilyStatus
		}{{"IPv4", f.IPv4}, {"IPv6", f.IPv6}} {
			out = append(out, ForwardChecks(c.cfg.Self, fam.name, fam.s, st.PodCIDRs)...)
		}
	}
	if st.Err != "" {
		add(api.CheckFail, "node network: %s", st.Err)
	}
	if len(out) == 0 {
		cond := fmt.Sprintf("NetworkUnavailable=%v", !st.Ready)
		if c.cfg.Routes == nil {
			cond = "NetworkUnavailable left to the underlay's route controller (--routes=false)"
		}
		add(api.CheckOK, "node network: %d routes to the other nodes' pods, %d pod ranges not masqueraded, %s", st.Routes, len(st.PodCIDRs), cond)
	}
	return out
}

// ForwardChecks are doctor's lines for one family's forwarding on node self: the
// kernel's forwarding switch off, the FORWARD policy DROP without ipledger's
// accepts, an iptables-legacy filter table whose policy the agent cannot see; each
// with the fix.
func ForwardChecks(self, family string, s masq.FamilyStatus, pods []netip.Prefix) []api.Check {
	if !s.Ranges {
		return nil
	}
	var out []api.Check
	add := func(level, format string, args ...any) {
		out = append(out, api.Check{Level: level, Text: fmt.Sprintf(format, args...)})
	}
	var ranges []string
	for _, p := range pods {
		if p.Addr().Is4() == (family == "IPv4") {
			ranges = append(ranges, p.String())
		}
	}
	if !s.Forwarding {
		if family == "IPv4" {
			add(api.CheckFail, "node network: IPv4 forwarding is off on node %s (net.ipv4.ip_forward=0) and the agent could not turn it on: pods on other nodes and outside are unreachable through this node; fix: sysctl -w net.ipv4.ip_forward=1 and put net.ipv4.ip_forward=1 in /etc/sysctl.d/ (kubeadm requires it too)", self)
		} else {
			add(api.CheckFail, "node network: IPv6 forwarding is off on node %s (net.ipv6.conf.all.forwarding=0): IPv6 pod traffic through this node is dropped; fix: sysctl -w net.ipv6.conf.all.forwarding=1 and persist it in /etc/sysctl.d/ (set accept_ra=2 on an interface that takes its default route from router advertisements, which forwarding otherwise stops)", self)
		}
	}
	tool := "iptables"
	if family == "IPv6" {
		tool = "ip6tables"
	}
	if s.Policy == "DROP" && !s.Accepts {
		add(api.CheckFail, "node network: the %s FORWARD policy of node %s is DROP and ipledger's accepts for the pod ranges (%s) are not in place: pod traffic through this node is dropped; fix: see the error below, or add them by hand: %s -A FORWARD -s RANGE -j ACCEPT; %s -A FORWARD -d RANGE -j ACCEPT", tool, self, strings.Join(ranges, ", "), tool, tool)
	}
	if s.Legacy {
		add(api.CheckWarn, "node network: node %s has an iptables-legacy filter table (%s-legacy), which the agent cannot read or write: if its FORWARD policy is DROP (%s-legacy -S FORWARD), pod traffic through this node is dropped; fix: for each pod range (%s) %s-legacy -A FORWARD -s RANGE -j ACCEPT and -d RANGE -j ACCEPT, or move the host to iptables-nft", self, tool, tool, strings.Join(ranges, ", "), tool)
	}
	return out
}
