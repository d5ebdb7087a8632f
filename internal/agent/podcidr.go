package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/pool"
)

// PodCIDRs answers for this node's Kubernetes podCIDRs (kubenode.Watch), which a
// range of subnet usePodCidr / usePodCidrIPv6 stands for. The error names the Node,
// the field and the fix when there is none yet.
type PodCIDRs interface {
	PodCIDRs() ([]netip.Prefix, error)
}

// NodeNetwork is the node network's controller (routes, masquerade): doctor shows
// its verdicts, and ADD and STATUS wait for its first reconciliation.
type NodeNetwork interface {
	Checks() []api.Check
	Counts() nodenet.Counts
	// Waiting says why the node network has not been reconciled once without
	// error; "" once it has.
	Waiting() string
}

// networkGate holds ADD and STATUS back until the node network's first
// reconciliation (routes and masquerade in place; the Nodes listed): a pod started
// before would open connections that conntrack then keeps un-masqueraded, or
// reach nothing on other nodes. CodeUnavailable: the plugin answers "try again
// later" (ADD, code 11) or "not available" (STATUS, code 50), so the runtime keeps
// the Node NotReady and retries the sandbox.
func (s *Server) networkGate() *api.Error {
	if s.cfg.NodeNetwork == nil {
		return nil
	}
	why := s.cfg.NodeNetwork.Waiting()
	if why == "" {
		return nil
	}
	return &api.Error{Code: api.CodeUnavailable, Msg: "node network not ready: " + why +
		"; no pod is started before this node's routes and masquerade rules are in place (ipledgerctl doctor shows the node network)"}
}

// resolveRanges replaces the usePodCidr placeholders of sets by this node's
// podCIDRs. A node without a podCIDR yet is a passing condition (the controller
// manager assigns one shortly after the Node registers): CodeUnavailable, which the
// plugin answers with "try again later" (ADD) or "not available" (STATUS).
func (s *Server) resolveRanges(sets []pool.RangeSet) ([]pool.RangeSet, *api.Error) {
	if !pool.HasPodCIDR(sets) {
		return sets, nil
	}
	if s.cfg.Cluster != nil {
		return nil, &api.Error{Code: api.CodeInvalid, Msg: "ipam.ranges: usePodCidr is for node mode; in cluster mode (--datastore) the ranges are the cluster's pools, split into blocks: give them as CIDRs"}
	}
	if s.cfg.PodCIDRs == nil {
		return nil, &api.Error{Code: api.CodeInvalid, Msg: "ipam.ranges: usePodCidr needs the node's Kubernetes podCIDRs: run ipledgerd with --node-name (and in-cluster credentials or --kubeconfig), or give the subnet as a CIDR"}
	}
	cidrs, err := s.cfg.PodCIDRs.PodCIDRs()
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Msg: "ipam.ranges: usePodCidr: " + err.Error()}
	}
	out, err := pool.Resolve(sets, cidrs)
	if errors.Is(err, pool.ErrNoPodCIDR) {
		return nil, &api.Error{Code: api.CodeUnavailable, Msg: fmt.Sprintf("%v (the Node's spec.podCIDRs are %v)", err, cidrs)}
	}
	if err != nil {
		return nil, &api.Error{Code: api.CodeInvalid, Msg: err.Error()}
	}
	return out, nil
}

// podCIDRChecks warns, for every pool range set that a podCIDR change retired while
// leases still hold addresses in it (ledger.PoolStatus.Retired), that those pods'
// addresses are no longer routed here: every node routes a podCIDR to the Node
// whose spec names it. They stay leased until their pods go (DEL releases them).
func (s *Server) podCIDRChecks() []api.Check {
	if s.cfg.PodCIDRs == nil {
		return nil
	}
	cidrs, _ := s.cfg.PodCIDRs.PodCIDRs()
	var out []api.Check
	for _, ps := range s.cfg.Ledger.Pools() {
		for _, r := range ps.Retired {
			if len(r.Ranges) == 0 {
				continue
			}
			old := subnets(r.Ranges)
			is4 := r.Ranges[0].Subnet.Addr().Unmap().Is4()
			now := "none of its family"
			for _, p := range cidrs {
				if p.Addr().Unmap().Is4() == is4 {
					now = p.Masked().String()
					break
				}
			}
			leases := "live leases of network %q still hold addresses"
			if r.Leases == 1 {
				leases = "live lease of network %q still holds an address"
			}
			out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf(
				"node %q: podCIDR changed from %s to %s; %d "+leases+" in %s: other nodes no longer route %s to this node, so their pods are unreachable from other nodes; new pods get addresses in %s; fix: delete those pods (ipledgerctl leases lists them) so that they are re-created: their DEL releases the old addresses",
				s.cfg.Node, old, now, r.Leases, ps.Network, old, old, now)})
		}
	}
	return out
}

// subnets names the subnets of a range set.
func subnets(set pool.RangeSet) string {
	var out []string
	for _, r := range set {
		if s := r.Subnet.Masked().String(); !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}
