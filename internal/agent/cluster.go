package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
)

// ErrDegraded: in cluster mode, the node cannot give an address now without a new
// block and cannot get one (the datastore is unreachable, or the node cannot prove
// its lease). Cluster implementations wrap it; the agent answers it as
// api.CodeUnavailable (the runtime tries again later) and STATUS reports it.
var ErrDegraded = errors.New("cluster mode degraded")

// Cluster is cluster mode as the agent uses it: the block manager that owns the
// node's address blocks in the datastore. A nil Cluster is node mode.
//
// Contract:
//   - Allocate serves an ADD from the node's own blocks, claiming a block first when
//     none has a free address. It never allocates from a block the node cannot prove
//     it owns (lease not provably alive, or the block's epoch moved). Its errors wrap
//     ledger.ErrPoolExhausted (no address in the whole cluster-wide pool),
//     ErrDegraded (no address without a new block, and none can be claimed now), or
//     the ledger's errors.
//   - DEL does not go through Cluster: a release only touches the node's ledger, so a
//     lease in a block the node lost is released locally and never touches the new
//     owner's leases.
//   - Status reports, for one network (every network when empty), whether an ADD
//     could be served: nil, or an error wrapping ErrDegraded or
//     ledger.ErrPoolExhausted.
//   - View lists the datastore's blocks as this node sees them, with the node's
//     degraded state; an unreachable datastore is an error.
//   - Locate names the block of an address the node's ledger holds and whether the
//     node has lost that block.
//   - Counts are the manager's counters and gauges, for metrics.
type Cluster interface {
	Node() string
	Allocate(ctx context.Context, req ledger.AllocateRequest) (ledger.Lease, bool, error)
	Status(network string) error
	View(ctx context.Context) (api.Cluster, error)
	Locate(network string, ip netip.Addr) (block netip.Prefix, lost bool, ok bool)
	Counts() ClusterCounts
}

// ClusterCounts are the block manager's figures since the agent started.
type ClusterCounts struct {
	BlocksOwned int    // blocks this node owns now (gauge)
	Claims      uint64 // blocks claimed (compare-and-swap won)
	HandBacks   uint64 // empty blocks given back after the grace
	Reclaims    uint64 // blocks of dead nodes reclaimed by this node
	Suspensions uint64 // times the node stopped allocating because it could not prove its lease
}

// allocate serves an ADD's allocation: through the block manager in cluster mode.
func (s *Server) allocate(ctx context.Context, areq ledger.AllocateRequest) (ledger.Lease, bool, error) {
	if s.cfg.Cluster != nil {
		return s.cfg.Cluster.Allocate(ctx, areq)
	}
	return s.cfg.Ledger.Allocate(areq)
}

// annotateBlock fills in a lease view's block and whether the node lost it.
func (s *Server) annotateBlock(v *api.LeaseView, ls ledger.Lease) {
	if s.cfg.Cluster == nil {
		return
	}
	for _, p := range ls.IPs {
		if b, lost, ok := s.cfg.Cluster.Locate(ls.Key.Network, p.Addr()); ok {
			if v.Block == "" {
				v.Block = b.String()
			}
			v.Lost = v.Lost || lost
		}
	}
}

// clusterStatus answers STATUS in cluster mode: the node's own free addresses are not
// the pool's end, the manager says whether an ADD can be served.
func (s *Server) clusterStatus(req api.Request) *api.Response {
	err := s.cfg.Cluster.Status(req.Network)
	if err == nil {
		return &api.Response{}
	}
	// STATUS's answer to "cannot serve ADD" is the exhausted code, which the plugin
	// turns into CNI error 50 (plugin not available); the message says why.
	if errors.Is(err, ErrDegraded) || errors.Is(err, ledger.ErrPoolExhausted) {
		return errResp(&api.Error{Code: api.CodeExhausted, Msg: fmt.Sprintf("node %s: %v", s.cfg.Cluster.Node(), err)})
	}
	return errResp(errorOf(err))
}

func (s *Server) blocks(ctx context.Context) *api.Response {
	if s.cfg.Cluster == nil {
		return errResp(&api.Error{Code: api.CodeInvalid, Msg: "blocks: this agent runs in node mode (no --datastore); blocks exist only in cluster mode"})
	}
	v, err := s.cfg.Cluster.View(ctx)
	if err != nil {
		return errResp(errorOf(err))
	}
	if v.Blocks == nil {
		v.Blocks = []api.BlockView{}
	}
	return &api.Response{Cluster: &v}
}
