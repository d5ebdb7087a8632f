package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/pool"
)

// Cluster is cluster mode as the agent uses it: the block manager that owns the
// node's address blocks in the datastore (cluster.Manager). A nil Cluster is node
// mode.
//
// The agent relies on:
//   - EnsureNetwork sets a network up (its pool record, the ledger's cluster-scoped
//     pool) and returns at once when it is set up with the same config.
//   - EnsurePool sets a named IPPool up on the node (the pod's ipledger.io/pool)
//     and returns it; errors wrap cluster.ErrNoPool, ErrPoolNotForNode,
//     ErrBadPool, ErrPoolMismatch or ledger.ErrPoolConflict when the choice
//     cannot be honoured, anything else when the datastore could not be asked.
//   - Allocate serves an ADD from the node's own blocks, claiming a block when none
//     has a free address; it never allocates from a block the node cannot prove it
//     owns. Errors wrap cluster.ErrFenced (lease not provable),
//     ledger.ErrPoolExhausted (no block left to claim), or the ledger's errors.
//   - DEL does not go through Cluster: a release only touches the node's ledger, so a
//     lease in a block the node lost is released locally and never touches the new
//     owner's leases.
//   - Status says whether an ADD of a set-up network can be served; Provable whether
//     the node's lease is provable now.
//   - Blocks lists the datastore's blocks (an unreachable datastore is an error).
//   - Counts are the manager's figures, for metrics.
//   - Health is the datastore's and the node lease's state, for doctor; it makes no
//     datastore call.
//   - Refused names, by pool, why its record is not served as it stands (bad
//     input: the node serves the pool as it was); no datastore call.
type Cluster interface {
	Node() string
	EnsureNetwork(ctx context.Context, network string, ranges []pool.RangeSet, blockBits []int) error
	EnsurePool(ctx context.Context, name string, labels cluster.NodeLabels) (cluster.IPPool, error)
	Allocate(ctx context.Context, req ledger.AllocateRequest) (ledger.Lease, bool, error)
	Status(network string) cluster.Status
	Provable() bool
	Blocks(ctx context.Context) ([]cluster.BlockView, error)
	Counts() cluster.Counts
	Health() cluster.Health
	Refused() map[string]string
}

var _ Cluster = (*cluster.Manager)(nil)

// allocate serves an ADD's allocation: in cluster mode through the block manager,
// after setting the network up with the request's ranges and blockSize; for a
// StatefulSet pod (sticky, cluster mode only) from the addresses kept for it.
func (s *Server) allocate(ctx context.Context, areq ledger.AllocateRequest, blockSize int, sticky *cluster.StickyPod) (ledger.Lease, bool, error) {
	c := s.cfg.Cluster
	if c == nil {
		return s.cfg.Ledger.Allocate(areq)
	}
	if areq.Pool != "" {
		return c.Allocate(ctx, areq) // a named pool, set up by EnsurePool
	}
	bits, err := cluster.BlockBits(areq.Ranges, blockSize)
	if err != nil {
		return ledger.Lease{}, false, err
	}
	if err := c.EnsureNetwork(ctx, areq.Key.Network, areq.Ranges, bits); err != nil {
		return ledger.Lease{}, false, fmt.Errorf("network %q: %w", areq.Key.Network, err)
	}
	if sticky != nil {
		return s.allocateSticky(ctx, areq, *sticky)
	}
	return c.Allocate(ctx, areq)
}

// annotateBlock fills in a lease view's block and whether the node lost it.
func (s *Server) annotateBlock(v *api.LeaseView, ls ledger.Lease) {
	if s.cfg.Cluster == nil {
		return
	}
	bs := s.cfg.Ledger.Blocks(ls.PoolNetwork())
	for _, p := range ls.IPs {
		for _, b := range bs {
			if b.Prefix.Contains(p.Addr()) {
				if v.Block == "" {
					v.Block = b.Prefix.String()
				}
				v.Lost = v.Lost || b.State == ledger.BlockLost
			}
		}
	}
}

// clusterStatus answers STATUS in cluster mode: the node's own free addresses are
// not the pool's end; the manager says whether an ADD can be served. A network not
// set up on this node yet is served by its first ADD, which needs a provable lease.
func (s *Server) clusterStatus(req api.Request) *api.Response {
	c := s.cfg.Cluster
	var reason string
	if _, err := s.cfg.Ledger.Pool(req.Network); req.Network == "" || errors.Is(err, ledger.ErrUnknownNetwork) {
		if !c.Provable() {
			reason = "node lease not provable (datastore unreachable?): no block can be claimed"
		}
	} else if st := c.Status(req.Network); st.Degraded {
		reason = st.Reason
	}
	if reason == "" {
		return &api.Response{}
	}
	// STATUS's answer to "cannot serve ADD" is the exhausted code, which the plugin
	// turns into CNI error 50 (plugin not available); the message says why.
	return errResp(&api.Error{Code: api.CodeExhausted, Msg: fmt.Sprintf("cluster mode degraded on node %s: %s", c.Node(), reason)})
}

// blocks answers OpBlocks: the datastore's blocks as this node sees them.
func (s *Server) blocks(ctx context.Context) *api.Response {
	c := s.cfg.Cluster
	if c == nil {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "blocks: this agent runs in node mode (no --datastore); blocks exist only in cluster mode"})
	}
	bs, err := c.Blocks(ctx)
	if err != nil {
		return errResp(errorOf(err))
	}
	v := api.Cluster{Node: c.Node(), Datastore: s.cfg.Datastore, Blocks: []api.BlockView{}}
	if !c.Provable() {
		v.Degraded, v.Reason = true, "node lease not provable: the node allocates nothing until it renews"
	}
	for _, b := range bs {
		bv := api.BlockView{Network: b.Network, Block: b.CIDR.String(), Owner: b.Owner, Epoch: int64(b.Epoch)}
		switch {
		case b.Local && b.State == ledger.BlockLost:
			bv.State, bv.Owner = api.BlockLost, c.Node() // the ledger's copy; the datastore's record is listed too
		case b.Local:
			bv.State = api.BlockOwned
			if b.State == ledger.BlockSuspended {
				bv.State = api.BlockSuspended
			}
		case b.Owner == "":
			bv.State = api.BlockFree
		default:
			bv.State = api.BlockOther
		}
		for _, k := range b.Borrows {
			bv.Borrows = append(bv.Borrows, api.Borrow{Addr: k.Addr.String(), For: k.For, Node: k.Node})
		}
		if b.Local {
			used, free := b.Used, int(b.Usable)-b.Used
			bv.Used, bv.Free = &used, &free
		}
		v.Blocks = append(v.Blocks, bv)
	}
	return &api.Response{Cluster: &v}
}
