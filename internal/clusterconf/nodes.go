package clusterconf

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
)

// Nodes is what WatchNodes reports to: the block manager (cluster.Manager).
type Nodes interface {
	// NodeGone: the node's Node object was deleted.
	NodeGone(node string)
	// NodeBack: a Node object of that name exists again (or is new).
	NodeBack(node string)
}

// WatchNodes tells nodes of every Node object deleted, and of every Node created,
// while it runs (--datastore kubernetes: kubeds.WatchNodes, in the background until
// ctx ends; etcd has no Node objects): the block manager reclaims a deleted node's
// blocks as soon as its lease has run out, without the quarantine, unless the Node
// was registered again meanwhile (its kubelet still runs, and so may its pods). A
// Node deleted while no agent watched is caught by the lease's expiry and the
// quarantine.
func WatchNodes(ctx context.Context, ds datastore.Store, nodes Nodes, log *slog.Logger) {
	ks, ok := ds.(*kubeds.Store)
	if !ok {
		return
	}
	go func() {
		err := ks.WatchNodes(ctx, func(node string) {
			log.Warn("Node deleted: its blocks are reclaimed once its lease runs out", "node", node)
			nodes.NodeGone(node)
		}, nodes.NodeBack)
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Error("watching Node deletions stopped; a dead node's blocks wait for its lease and the quarantine", "err", err)
		}
	}()
}
