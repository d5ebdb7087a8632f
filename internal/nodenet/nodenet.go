// Package nodenet computes the node network of a cluster without overlay: which
// pod ranges live on which node, and so the routes this node needs to reach every
// other node's pods directly through that node's address on the shared L2
// network (as flannel's host-gw or Calico and Cilium native routing do), and the
// pod ranges of the whole cluster, which masquerade excludes.
//
// Two sources say where pods live. In node mode each Kubernetes Node's
// spec.podCIDRs is that node's; in cluster mode the ledger's address blocks are
// claimed by nodes (strict affinity), and a block's owner holds every pod
// address in it. The package is pure: it reads no state and changes nothing;
// internal/nodenet/routes and internal/nodenet/masq apply its answers.
package nodenet

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// Node is what the node network needs of a Kubernetes Node.
type Node struct {
	Name string
	// Addrs are the node's InternalIPs, of any family, in the Node's order:
	// the first usable address of a family is the next hop for that family.
	Addrs []netip.Addr
	// PodCIDRs is spec.podCIDRs (node mode).
	PodCIDRs []netip.Prefix
}

// Block is an address block of a cluster-wide pool and the node that holds it
// (cluster mode). An empty Owner means the block is free.
type Block struct {
	Prefix netip.Prefix
	Owner  string
	// Borrowed: Prefix is one address (a /32 or /128) of another node's block that
	// Owner borrowed for a pod (a StatefulSet pod's sticky address, re-created on
	// Owner). Every other node routes it to Owner, the block's owner too: the
	// longer prefix wins over the block's route. Owner itself needs no route (the
	// pod's veth has the host route).
	Borrowed bool
}

// RouteType is the kind of route a Route asks for.
type RouteType uint8

const (
	// Unicast: Dst via the owning node's address.
	Unicast RouteType = iota
	// Unreachable: Dst is a pod range of this node. Its assigned addresses have
	// more specific host routes (the pods' veths); the rest of the block must
	// fail at once instead of leaving by the default route, from where the
	// network would route it back here.
	Unreachable
)

func (t RouteType) String() string {
	switch t {
	case Unicast:
		return "unicast"
	case Unreachable:
		return "unreachable"
	}
	return fmt.Sprintf("RouteType(%d)", uint8(t))
}

// Route is one route this node needs.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr // Unicast only: the owner's first usable address of Dst's family
	// Alt (Unicast only): the owner's other usable addresses of Dst's family,
	// in the Node's order. The route goes via the first of Via and Alt that
	// is on a directly connected network of this node (a Node may list an
	// address of a network only some nodes share first).
	Alt  []netip.Addr
	Type RouteType
	Node string // the node Dst belongs to
}

func (r Route) String() string {
	if r.Type == Unicast {
		return fmt.Sprintf("%s via %s (node %s)", r.Dst, r.Via, r.Node)
	}
	return fmt.Sprintf("%s %s (node %s)", r.Type, r.Dst, r.Node)
}

// Problem is a reason a node or one of its pod ranges gets no route. Err wraps
// one of the package's sentinel errors.
type Problem struct {
	Node   string
	Prefix netip.Prefix // the pod range concerned; zero for the node as a whole
	Err    error
}

func (p Problem) String() string {
	if p.Prefix.IsValid() {
		return fmt.Sprintf("node %s: %s: %v", p.Node, p.Prefix, p.Err)
	}
	return fmt.Sprintf("node %s: %v", p.Node, p.Err)
}

// Plan is the desired node network of one node: its routes, sorted by
// destination, and the problems that left a range without a route.
type Plan struct {
	Routes   []Route
	Problems []Problem
}

// claim says that owner's pods live in prefix.
type claim struct {
	prefix   netip.Prefix
	owner    string
	borrowed bool   // one address borrowed from the block around it (Block.Borrowed)
	overlap  *claim // a claim of another owner overlapping this one
}

// Desired is the node network of node self given every node and, in cluster
// mode, every block. blocks == nil is node mode: for every other node, one
// route per podCIDR via that node's usable addresses of the same family, and
// an Unreachable route per podCIDR of self. blocks != nil (even empty) is
// cluster mode: a route per block another node owns, via the owner's
// addresses, and an Unreachable route per block self owns; free blocks get
// nothing, and podCIDRs are ignored. A borrowed address (Block.Borrowed) inside
// another node's block gets a host route via its borrower on every node but the
// borrower; two nodes borrowing the same address are an overlap.
//
// Never planned: a route via one of self's addresses, a route into one of
// self's pod ranges, a route whose destination holds a node's address, two
// routes to overlapping ranges of different nodes. Each range left out for such
// a reason, or for lack of an address of its family, is a Problem.
func Desired(self string, nodes []Node, blocks []Block) Plan {
	var plan Plan
	problem := func(node string, p netip.Prefix, err error) {
		plan.Problems = append(plan.Problems, Problem{Node: node, Prefix: p, Err: err})
	}

	byName := make(map[string]*Node, len(nodes))
	for i := range nodes {
		n := &nodes[i]
		if _, dup := byName[n.Name]; dup {
			problem(n.Name, netip.Prefix{}, ErrDuplicateNode)
			continue
		}
		byName[n.Name] = n
	}
	selfAddrs := map[netip.Addr]bool{}
	if n := byName[self]; n != nil {
		for _, a := range n.Addrs {
			if a = normAddr(a); a.IsValid() {
				selfAddrs[a] = true
			}
		}
	}
	var nodeAddrs []netip.Addr
	for _, n := range byName {
		for _, a := range n.Addrs {
			if a = normAddr(a); a.IsValid() && !a.IsUnspecified() {
				nodeAddrs = append(nodeAddrs, a)
			}
		}
	}
	slices.SortFunc(nodeAddrs, netip.Addr.Compare)

	cluster := blocks != nil
	var claims []*claim
	if cluster {
		for _, b := range blocks {
			if b.Owner == "" {
				continue
			}
			p, ok := normPrefix(b.Prefix)
			if !ok {
				problem(b.Owner, b.Prefix, ErrInvalidPrefix)
				continue
			}
			if b.Borrowed && p.Bits() != p.Addr().BitLen() {
				problem(b.Owner, b.Prefix, fmt.Errorf("%w: a borrowed address must be a /32 or /128", ErrInvalidPrefix))
				continue
			}
			claims = append(claims, &claim{prefix: p, owner: b.Owner, borrowed: b.Borrowed})
		}
	} else {
		for i := range nodes {
			n := &nodes[i]
			if byName[n.Name] != n {
				continue // a duplicate, reported above
			}
			if len(n.PodCIDRs) == 0 {
				problem(n.Name, netip.Prefix{}, ErrNoPodCIDR)
			}
			for _, raw := range n.PodCIDRs {
				p, ok := normPrefix(raw)
				if !ok {
					problem(n.Name, raw, ErrInvalidPrefix)
					continue
				}
				claims = append(claims, &claim{prefix: p, owner: n.Name})
			}
		}
	}
	claims = markOverlaps(claims, self)

	for _, c := range claims {
		if c.overlap != nil {
			problem(c.owner, c.prefix, fmt.Errorf("%w: %s of node %s", ErrOverlap, c.overlap.prefix, c.overlap.owner))
			continue
		}
		if a, ok := holdsAddr(c.prefix, nodeAddrs); ok {
			problem(c.owner, c.prefix, fmt.Errorf("%w: %s", ErrHoldsNodeAddress, a))
			continue
		}
		if c.owner == self {
			if !c.borrowed {
				plan.Routes = append(plan.Routes, Route{Dst: c.prefix, Type: Unreachable, Node: self})
			}
			continue
		}
		owner := byName[c.owner]
		if owner == nil {
			problem(c.owner, c.prefix, ErrUnknownOwner)
			continue
		}
		hops, err := nextHops(owner, c.prefix.Addr().Is4(), selfAddrs)
		if err != nil {
			problem(c.owner, c.prefix, err)
			continue
		}
		r := Route{Dst: c.prefix, Via: hops[0], Type: Unicast, Node: c.owner}
		if len(hops) > 1 {
			r.Alt = hops[1:]
		}
		plan.Routes = append(plan.Routes, r)
	}

	slices.SortFunc(plan.Routes, func(a, b Route) int { return comparePrefix(a.Dst, b.Dst) })
	slices.SortStableFunc(plan.Problems, func(a, b Problem) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), comparePrefix(a.Prefix, b.Prefix))
	})
	return plan
}

// ClusterCIDRs is every pod range of the cluster: in node mode (blocks == nil)
// every node's podCIDRs, in cluster mode every block, owned or free (pass the
// pools' ranges as blocks without owner to cover their unclaimed part too).
// Invalid prefixes are left out, and so are ranges inside another one
// returned; the result is sorted.
func ClusterCIDRs(nodes []Node, blocks []Block) []netip.Prefix {
	var all []netip.Prefix
	if blocks != nil {
		for _, b := range blocks {
			if p, ok := normPrefix(b.Prefix); ok {
				all = append(all, p)
			}
		}
	} else {
		for _, n := range nodes {
			for _, raw := range n.PodCIDRs {
				if p, ok := normPrefix(raw); ok {
					all = append(all, p)
				}
			}
		}
	}
	return Outermost(all)
}

// Outermost sorts prefixes and drops every one inside another (duplicates
// included): what is left is disjoint and covers the same addresses. Invalid
// prefixes are dropped.
func Outermost(prefixes []netip.Prefix) []netip.Prefix {
	ps := make([]netip.Prefix, 0, len(prefixes))
	for _, p := range prefixes {
		if p.IsValid() {
			ps = append(ps, p.Masked())
		}
	}
	slices.SortFunc(ps, comparePrefix)
	out := ps[:0]
	for _, p := range ps {
		// Sorted by address then length, prefixes are nested or disjoint: p is
		// inside an earlier one only if it is inside the last one kept.
		if len(out) > 0 && out[len(out)-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
	}
	return out
}

// markOverlaps drops duplicate claims, sorts them, and marks each claim that
// overlaps a claim of another owner; of a pair where one owner is self, only
// the other is marked (self's own ranges always stay self's). A borrowed
// address inside a block is no overlap: it is what borrowing means.
func markOverlaps(claims []*claim, self string) []*claim {
	slices.SortFunc(claims, func(a, b *claim) int {
		return cmp.Or(comparePrefix(a.prefix, b.prefix), cmp.Compare(a.owner, b.owner))
	})
	claims = slices.CompactFunc(claims, func(a, b *claim) bool {
		return a.prefix == b.prefix && a.owner == b.owner && a.borrowed == b.borrowed
	})
	mark := func(c, other *claim) {
		if c.overlap == nil {
			c.overlap = other
		}
	}
	// Sorted by address then length, two prefixes are nested or disjoint, and
	// the claims whose prefix holds c's are exactly those on the stack.
	var stack []*claim
	for _, c := range claims {
		for len(stack) > 0 && !stack[len(stack)-1].prefix.Contains(c.prefix.Addr()) {
			stack = stack[:len(stack)-1]
		}
		for _, outer := range stack {
			if outer.owner == c.owner || outer.borrowed != c.borrowed {
				continue
			}
			if outer.owner != self {
				mark(outer, c)
			}
			if c.owner != self {
				mark(c, outer)
			}
		}
		stack = append(stack, c)
	}
	return claims
}

// holdsAddr returns an address of sorted that p contains, if any.
func holdsAddr(p netip.Prefix, sorted []netip.Addr) (netip.Addr, bool) {
	i, _ := slices.BinarySearchFunc(sorted, p.Addr(), netip.Addr.Compare)
	if i < len(sorted) && p.Contains(sorted[i]) {
		return sorted[i], true
	}
	return netip.Addr{}, false
}

// nextHops are n's addresses of the family that can carry a route, in n's
// order, at least one: not one of self's, nor unspecified, loopback,
// link-local or multicast.
func nextHops(n *Node, v4 bool, self map[netip.Addr]bool) ([]netip.Addr, error) {
	fam := "IPv6"
	if v4 {
		fam = "IPv4"
	}
	var good, bad []netip.Addr
	for _, a := range n.Addrs {
		a = normAddr(a)
		if !a.IsValid() || a.Is4() != v4 {
			continue
		}
		if a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() || self[a] {
			bad = append(bad, a)
			continue
		}
		if !slices.Contains(good, a) {
			good = append(good, a)
		}
	}
	if len(good) > 0 {
		return good, nil
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%w: %v (no other %s address)", ErrBadAddress, bad, fam)
	}
	return nil, fmt.Errorf("%w: %s", ErrNoAddress, fam)
}

// normAddr drops a zone and turns an IPv4-mapped IPv6 address into IPv4.
func normAddr(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

// normPrefix masks p; false for an invalid prefix, an IPv4-mapped one, or the
// whole address space (no node owns every address).
func normPrefix(p netip.Prefix) (netip.Prefix, bool) {
	if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "" || p.Bits() == 0 {
		return netip.Prefix{}, false
	}
	return p.Masked(), true
}

// comparePrefix orders by address, then by length (shorter first).
func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// Counts are a node network's figures at its last reconciliation, for metrics.
type Counts struct {
	Routes    int    // routes desired
	Conflicts int    // pod ranges held by a route of another owner (left alone)
	OffLink   int    // routes not made: the next hop is not on-link
	Problems  int    // Nodes or blocks that could not be routed (no podCIDR, no address, ...)
	Syncs     uint64 // reconciliations that left no error
	Errors    uint64 // reconciliations that failed
	Ready     bool   // NetworkUnavailable set false
}
