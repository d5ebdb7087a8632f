package agent

import (
	"errors"
	"fmt"
	"net/netip"

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
// its verdicts.
type NodeNetwork interface {
	Checks() []api.Check
	Counts() nodenet.Counts
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
