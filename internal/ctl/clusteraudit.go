package ctl

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
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
	// StaleBorrows: addresses a block lends to an audited node that holds no
	// lease of them (cluster.AuditReport.StaleBorrows); they leave OK as it is.
	StaleBorrows []string `json:"staleBorrows,omitempty"`
}

// AuditCluster checks every node's leases against each other and against the
// datastore's blocks: no address held by two leases (on one node or two), every lease
// inside a block of its network, owned by its node unless its agent flags the lease
// lost; two agents claiming one node name is a problem too. The rules are
// cluster.Audit's; this adapts the agents' views to its input (a lease its agent
// flags lost stands for a block its node's ledger holds lost, and a block the
// datastore gives the node for one its ledger holds at that epoch: the views carry no
// ledger epochs) and reads a lost-flagged lease outside its node's blocks as the
// known state it is (counted in Lost), not a problem.
func AuditCluster(nodes []NodeLeases, blocks []api.BlockView) ClusterAudit {
	rep := ClusterAudit{Problems: []string{}}
	bad := func(format string, a ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, a...)) }
	var recs []cluster.BlockRecord
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
		rec := cluster.BlockRecord{Network: b.Network, CIDR: p.Masked(), Owner: b.Owner, Epoch: uint64(b.Epoch)}
		for _, x := range b.Borrows {
			if a, err := netip.ParseAddr(x.Addr); err == nil {
				rec.Borrows = append(rec.Borrows, cluster.Borrow{Addr: a, For: x.For, Node: x.Node})
			}
		}
		recs = append(recs, rec)
	}
	containing := func(network string, a netip.Addr) (cluster.BlockRecord, bool) {
		for _, r := range recs {
			if r.Network == network && r.CIDR.Contains(a) {
				return r, true
			}
		}
		return cluster.BlockRecord{}, false
	}
	type nodeKey struct {
		node string
		key  ledger.Key
	}
	lost := map[nodeKey]bool{}
	seen := map[string]string{}
	books := make([]cluster.NodeBooks, 0, len(nodes))
	for _, n := range nodes {
		if prev, dup := seen[n.Node]; dup {
			bad("node %s answers on two sockets (%s and %s)", n.Node, prev, n.Socket)
		}
		seen[n.Node] = n.Socket
		rep.Nodes = append(rep.Nodes, n.Node)
		nb := cluster.NodeBooks{Node: n.Node}
		for _, l := range n.Leases {
			rep.Leases++
			k := ledger.Key{Network: l.Network, ContainerID: l.ContainerID, IfName: l.IfName}
			ls := ledger.Lease{Key: k, Pool: l.Pool}
			if l.Lost {
				rep.Lost++
				lost[nodeKey{n.Node, k}] = true
			}
			for _, s := range l.IPs {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					bad("node %s, lease %s/%s/%s: address %q is not a CIDR", n.Node, l.Network, l.ContainerID, l.IfName, s)
					continue
				}
				ls.IPs = append(ls.IPs, p)
				if b, ok := containing(ls.PoolNetwork(), p.Addr()); ok && l.Lost {
					nb.Blocks = append(nb.Blocks, ledger.BlockStatus{BlockRecord: ledger.BlockRecord{Network: b.Network, Prefix: b.CIDR, Epoch: b.Epoch, State: ledger.BlockLost}})
				}
			}
			nb.Leases = append(nb.Leases, ls)
		}
		// after the lost ones: a block the node owns is current in its ledger
		for _, b := range recs {
			if b.Owner == n.Node {
				nb.Blocks = append(nb.Blocks, ledger.BlockStatus{BlockRecord: ledger.BlockRecord{Network: b.Network, Prefix: b.CIDR, Epoch: b.Epoch, State: ledger.BlockActive}})
			}
		}
		books = append(books, nb)
	}
	audit := cluster.Audit(recs, books)
	for _, o := range audit.Outside {
		l := o.Key
		switch {
		case !o.Block.IsValid():
			bad("node %s, lease %s/%s/%s: %s lies in no block of pool %s", o.Node, l.Network, l.ContainerID, l.IfName, o.IP, o.Network)
		case o.Owner != o.Node && !lost[nodeKey{o.Node, l}]:
			owner := o.Owner
			if owner == "" {
				owner = "nobody"
			}
			bad("node %s, lease %s/%s/%s: %s lies in block %s owned by %s, and the agent does not flag it lost", o.Node, l.Network, l.ContainerID, l.IfName, o.IP, o.Block, owner)
		case o.Owner != o.Node:
			// flagged lost: counted in Lost, released locally only
		default:
			bad("node %s, lease %s/%s/%s: %s: %s", o.Node, l.Network, l.ContainerID, l.IfName, o.IP, o.Why)
		}
	}
	for _, d := range audit.DoubleHeld {
		cd := ClusterDouble{IP: d.IP.String()}
		var who []string
		for _, h := range d.Holders {
			hl := Holder{Node: h.Node, Network: h.Key.Network, ContainerID: h.Key.ContainerID, IfName: h.Key.IfName, Lost: lost[nodeKey{h.Node, h.Key}]}
			cd.Holders = append(cd.Holders, hl)
			s := hl.Node + ":" + hl.Network + "/" + hl.ContainerID + "/" + hl.IfName
			if hl.Lost {
				s += " (lost block)"
			}
			who = append(who, s)
		}
		rep.Doubles = append(rep.Doubles, cd)
		bad("%s is held %d times: %s", d.IP, len(d.Holders), strings.Join(who, ", "))
	}
	for _, x := range audit.StaleBorrows {
		rep.StaleBorrows = append(rep.StaleBorrows, fmt.Sprintf("%s of block %s (owner %s), kept for %s, is lent to node %s, which holds no lease of it; it returns when that node's sweep gives it back (if it stays, read that agent's log)", x.IP, x.Block, x.Owner, x.For, x.Node))
	}
	rep.DoubleAssigned = len(audit.DoubleHeld)
	rep.OK = len(rep.Problems) == 0
	return rep
}
