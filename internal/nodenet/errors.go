package nodenet

import "errors"

// Reasons a pod range gets no route; a Problem's Err wraps one of them.
var (
	// ErrNoPodCIDR: a node (in node mode) has no spec.podCIDRs, so nothing
	// routes to its pods and, for this node itself, usePodCidr has no subnet.
	ErrNoPodCIDR = errors.New("node has no podCIDR")
	// ErrNoAddress: the node has no usable InternalIP of the pod range's family
	// to route it through.
	ErrNoAddress = errors.New("node has no address of the family")
	// ErrBadAddress: one of the node's addresses cannot be a next hop
	// (unspecified, loopback, link-local, multicast, or an address of this node).
	ErrBadAddress = errors.New("node address unusable as next hop")
	// ErrInvalidPrefix: a pod range that is not a valid prefix, or the whole
	// address space of its family.
	ErrInvalidPrefix = errors.New("invalid pod range")
	// ErrOverlap: the pod range overlaps a pod range of another node; routing
	// either would send part of the other's pods to the wrong node.
	ErrOverlap = errors.New("pod range overlaps another node's")
	// ErrHoldsNodeAddress: the pod range contains a node's address; a route
	// for it would capture the traffic to that node.
	ErrHoldsNodeAddress = errors.New("pod range contains a node address")
	// ErrUnknownOwner: a block is owned by a node the node list does not hold.
	ErrUnknownOwner = errors.New("block owner is not a known node")
	// ErrDuplicateNode: the node list names a node twice; the first entry counts.
	ErrDuplicateNode = errors.New("node listed twice")
)
