package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ledger"
)

// NodeBooks is what the cluster audit reads of one node: its live leases and the
// blocks its ledger holds (ipledgerctl leases and blocks of that node's agent).
type NodeBooks struct {
	Node   string               `json:"node"`
	Leases []ledger.Lease       `json:"leases"`
	Blocks []ledger.BlockStatus `json:"blocks"`
}

// Holding is one address held by one attachment on one node.
type Holding struct {
	Node string     `json:"node"`
	Key  ledger.Key `json:"key"`
	// Current: the address lies in a block the node owns at the datastore's epoch
	// (false for a lease left in a block the node lost: Outside says why).
	Current bool `json:"current"`
	// Lost: the node's ledger holds the address's block lost (its agent flags the
	// lease lost; a DEL releases it locally only).
	Lost bool `json:"lost,omitempty"`
}

// DoubleHeld is an address held by more than one attachment in the cluster, in one
// network or several (Network is the first holder's).
type DoubleHeld struct {
	Network string     `json:"network"`
	IP      netip.Addr `json:"ip"`
	Holders []Holding  `json:"holders"`
}

// Outside is an address a node holds outside the blocks it owns at the current
// epoch: no block of the datastore holds it, another node owns the block, or the
// node's ledger has the block at another epoch (it lost it meanwhile).
type Outside struct {
	Holding
	Network string     `json:"network"`
	IP      netip.Addr `json:"ip"`
	Why     string     `json:"why"`
	// Block is the datastore's block holding the address (invalid when none does)
	// and Owner its owner ("" when free).
	Block netip.Prefix `json:"block"`
	Owner string       `json:"owner"`
}

// AuditReport is the cluster audit's verdict: OK when no address is held twice and
// every held address lies in a block its node owns at the datastore's epoch.
type AuditReport struct {
	OK         bool         `json:"ok"`
	Nodes      int          `json:"nodes"`
	Leases     int          `json:"leases"`
	Addresses  int          `json:"addresses"`
	Blocks     int          `json:"blocks"`
	DoubleHeld []DoubleHeld `json:"doubleHeld"`
	Outside    []Outside    `json:"outside"`
	// StaleBorrows: addresses a block lends to an audited node whose books hold
	// no lease of them. Not a double assignment (OK ignores them): the owner
	// withholds the address and every node routes it to the borrower, so one
	// address is idle until the borrower gives it back (its sweep retries a
	// failed return); one that stays is worth a look.
	StaleBorrows []StaleBorrow `json:"staleBorrows"`
}

// StaleBorrow is an address of Block (owned by Owner) kept For a StatefulSet pod
// and lent to Node, whose books hold no lease of it.
type StaleBorrow struct {
	Network string       `json:"network"`
	Block   netip.Prefix `json:"block"`
	Owner   string       `json:"owner"`
	IP      netip.Addr   `json:"ip"`
	For     string       `json:"for"`
	Node    string       `json:"node"`
}

// ReadBlocks returns every block record in the datastore.
func ReadBlocks(ctx context.Context, ds datastore.Store) ([]BlockRecord, error) {
	kvs, _, err := ds.List(ctx, BlocksPrefix(""))
	if err != nil {
		return nil, fmt.Errorf("listing blocks: %w", err)
	}
	out := make([]BlockRecord, 0, len(kvs))
	for _, kv := range kvs {
		rec, err := decodeBlock(kv)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// Audit checks every node's books against each other and the datastore's blocks.
// The caller reads the books of all nodes and then the blocks (ReadBlocks), with no
// node allocating in between for an exact answer. It is the one implementation of
// the cluster's rules (ipledgerctl cluster-audit adapts the agents' views to it):
//   - no address is held by two attachments, on one node or two, in one network or
//     two, whatever their blocks' states (DoubleHeld);
//   - every held address lies in a block of the datastore that its node owns, and
//     the node's ledger holds that block at the datastore's epoch and not lost
//     (Outside, with Why; Holding.Lost marks a lease its agent flags lost), or it is
//     a borrowed address of the lease and the block record lends it to that node;
//   - every address a block lends to an audited node is held there (StaleBorrows,
//     reported apart: no address is at risk).
func Audit(blocks []BlockRecord, nodes []NodeBooks) AuditReport {
	rep := AuditReport{Nodes: len(nodes), Blocks: len(blocks), DoubleHeld: []DoubleHeld{}, Outside: []Outside{}, StaleBorrows: []StaleBorrow{}}
	type bk struct {
		network string
		prefix  netip.Prefix
	}
	// block sizes per network and family, from the records
	bits := map[string]map[int]bool{}
	byKey := map[bk]BlockRecord{}
	for _, b := range blocks {
		byKey[bk{b.Network, b.CIDR}] = b
		if bits[b.Network] == nil {
			bits[b.Network] = map[int]bool{}
		}
		bits[b.Network][b.CIDR.Bits()] = true
	}
	find := func(network string, ip netip.Addr) (BlockRecord, bool) {
		for n := range bits[network] {
			p, err := ip.Prefix(n)
			if err != nil {
				continue
			}
			if b, ok := byKey[bk{network, p}]; ok {
				return b, true
			}
		}
		return BlockRecord{}, false
	}
	holders := map[netip.Addr][]Holding{}
	var order []netip.Addr
	for _, n := range nodes {
		epochs := map[bk]ledger.BlockStatus{}
		for _, b := range n.Blocks {
			epochs[bk{b.Network, b.Prefix}] = b
		}
		for _, ls := range n.Leases {
			rep.Leases++
			for _, p := range ls.IPs {
				rep.Addresses++
				a := p.Addr()
				h := Holding{Node: n.Node, Key: ls.Key, Current: true}
				b, ok := find(ls.PoolNetwork(), a)
				if ok {
					lb, held := epochs[bk{b.Network, b.CIDR}]
					h.Lost = held && lb.State == ledger.BlockLost
				}
				out := func(why string) {
					h.Current = false
					rep.Outside = append(rep.Outside, Outside{Holding: h, Network: ls.PoolNetwork(), IP: a, Why: why, Block: b.CIDR, Owner: b.Owner})
				}
				borrowed := slices.Contains(ls.Borrowed, a)
				switch {
				case !ok:
					out("no block of the datastore holds it")
				case borrowed:
					if i := b.borrowIndex(a); i < 0 || b.Borrows[i].Node != n.Node {
						out(fmt.Sprintf("held as borrowed, but block %s (owner %q) does not lend it to node %s", b.CIDR, b.Owner, n.Node))
					}
				case b.Owner != n.Node:
					out(fmt.Sprintf("block %s is owned by %q at epoch %d", b.CIDR, b.Owner, b.Epoch))
				default:
					lb, ok := epochs[bk{b.Network, b.CIDR}]
					if !ok {
						out(fmt.Sprintf("block %s is the node's at epoch %d but its ledger does not hold it", b.CIDR, b.Epoch))
					} else if lb.Epoch != b.Epoch || lb.State == ledger.BlockLost {
						out(fmt.Sprintf("block %s is at epoch %d; the node's ledger has it %s at epoch %d", b.CIDR, b.Epoch, lb.State, lb.Epoch))
					}
				}
				if holders[a] == nil {
					order = append(order, a)
				}
				holders[a] = append(holders[a], h)
			}
		}
	}
	audited := map[string]bool{}
	for _, n := range nodes {
		audited[n.Node] = true
	}
	for _, b := range blocks {
		for _, x := range b.Borrows {
			if x.Node == "" || !audited[x.Node] || slices.ContainsFunc(holders[x.Addr], func(h Holding) bool { return h.Node == x.Node }) {
				continue // not lent, lent to a node not audited (unknown), or held there
			}
			rep.StaleBorrows = append(rep.StaleBorrows, StaleBorrow{Network: b.Network, Block: b.CIDR, Owner: b.Owner, IP: x.Addr, For: x.For, Node: x.Node})
		}
	}
	for _, a := range order {
		if hs := holders[a]; len(hs) > 1 {
			rep.DoubleHeld = append(rep.DoubleHeld, DoubleHeld{Network: hs[0].Key.Network, IP: a, Holders: hs})
		}
	}
	sort.SliceStable(rep.DoubleHeld, func(i, j int) bool { return rep.DoubleHeld[i].IP.Less(rep.DoubleHeld[j].IP) })
	sort.SliceStable(rep.Outside, func(i, j int) bool { return rep.Outside[i].IP.Less(rep.Outside[j].IP) })
	rep.OK = len(rep.DoubleHeld) == 0 && len(rep.Outside) == 0
	return rep
}
