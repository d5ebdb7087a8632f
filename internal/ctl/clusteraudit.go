package ctl

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	"github.com/ipledger/ipledger/internal/api"
)

// NodeLeases is one node's live leases, as its agent listed them.
type NodeLeases struct {
	Node   string
	Socket string
	Leases []api.LeaseView
}

// Holder is one lease holding an address, in a ClusterAudit.
type Holder struct {
	Node        string `json:"node"`
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
	Lost        bool   `json:"lost,omitempty"`
}

// ClusterDouble is an address held by more than one lease cluster-wide.
type ClusterDouble struct {
	IP      string   `json:"ip"`
	Holders []Holder `json:"holders"`
}

// ClusterAudit is `ipledgerctl cluster-audit -o json`.
type ClusterAudit struct {
	// OK: no address is held twice, and every lease lies in a block its node owns or
	// in one its agent flags as lost.
	OK             bool            `json:"ok"`
	Nodes          []string        `json:"nodes"`
	Leases         int             `json:"leases"`
	Blocks         int             `json:"blocks"`
	DoubleAssigned int             `json:"doubleAssigned"`
	Doubles        []ClusterDouble `json:"doubles,omitempty"`
	// Lost counts leases in blocks their node no longer owns, flagged by their agent
	// (released locally only; the new owner's leases are untouched).
	Lost     int      `json:"lost"`
	Problems []string `json:"problems"`
}

// AuditCluster checks every node's leases against each other and against the
// datastore's blocks: no address held by two leases (on one node or two), every lease
// inside a block of its network, owned by its node unless its agent flags the lease
// lost; two agents claiming one node name is a problem too.
func AuditCluster(nodes []NodeLeases, blocks []api.BlockView) ClusterAudit {
	rep := ClusterAudit{Problems: []string{}}
	bad := func(format string, a ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...)) }
	type block struct {
		p     netip.Prefix
		owner string
	}
	byNet := map[string][]block{}
	for _, b := range blocks {
		if b.State == api.BlockLost {
			continue // the answering node's ledger copy of a block it lost, not the datastore's record
		}
		rep.Blocks++
		p, err := netip.ParsePrefix(b.Block)
		if err != nil {
			bad("block %q of network %s: not a CIDR", b.Block, b.Network)
			continue
		}
		byNet[b.Network] = append(byNet[b.Network], block{p.Masked(), b.Owner})
	}
	seen := map[string]string{}
	holders := map[netip.Addr][]Holder{}
	for _, n := range nodes {
		if prev, dup := seen[n.Node]; dup {
			bad("node %s answers on two sockets (%s and %s)", n.Node, prev, n.Socket)
		}
		seen[n.Node] = n.Socket
		rep.Nodes = append(rep.Nodes, n.Node)
		for _, l := range n.Leases {
			rep.Leases++
			h := Holder{Node: n.Node, Network: l.Network, ContainerID: l.ContainerID, IfName: l.IfName, Lost: l.Lost}
			if l.Lost {
				rep.Lost++
			}
			for _, s := range l.IPs {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					bad("node %s, lease %s/%s/%s: address %q is not a CIDR", n.Node, l.Network, l.ContainerID, l.IfName, s)
					continue
				}
				a := p.Addr()
				holders[a] = append(holders[a], h)
				var in *block
				for i, b := range byNet[l.Network] {
					if b.p.Contains(a) {
						in = &byNet[l.Network][i]
						break
					}
				}
				switch {
				case in == nil:
					bad("node %s, lease %s/%s/%s: %s lies in no block of network %s", n.Node, l.Network, l.ContainerID, l.IfName, a, l.Network)
				case in.owner != n.Node && !l.Lost:
					owner := in.owner
					if owner == "" {
						owner = "nobody"
					}
					bad("node %s, lease %s/%s/%s: %s lies in block %s owned by %s, and the agent does not flag it lost", n.Node, l.Network, l.ContainerID, l.IfName, a, in.p, owner)
				}
			}
		}
	}
	addrs := make([]netip.Addr, 0, len(holders))
	for a, hs := range holders {
		if len(hs) > 1 {
			addrs = append(addrs, a)
		}
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Less(addrs[j]) })
	for _, a := range addrs {
		hs := holders[a]
		rep.Doubles = append(rep.Doubles, ClusterDouble{IP: a.String(), Holders: hs})
		var who []string
		for _, h := range hs {
			s := h.Node + ":" + h.Network + "/" + h.ContainerID + "/" + h.IfName
			if h.Lost {
				s += " (lost block)"
			}
			who = append(who, s)
		}
		bad("%s is held %d times: %s", a, len(hs), strings.Join(who, ", "))
	}
	rep.DoubleAssigned = len(addrs)
	rep.OK = len(rep.Problems) == 0
	return rep
}
