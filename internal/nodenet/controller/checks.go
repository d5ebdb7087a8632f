package controller

import (
	"errors"
	"fmt"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/nodenet"
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
	if st.Err != "" {
		add(api.CheckFail, "node network: %s", st.Err)
	}
	if len(out) == 0 {
		add(api.CheckOK, "node network: %d routes to the other nodes' pods, %d pod ranges not masqueraded, NetworkUnavailable=%v", st.Routes, len(st.PodCIDRs), !st.Ready)
	}
	return out
}
