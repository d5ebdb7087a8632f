package clusterconf

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
)

// WatchNodes calls gone with the name of every Node object deleted while it runs
// (--datastore kubernetes: kubeds.WatchNodeDeletions, in the background until ctx
// ends; etcd has no Node objects): the block manager then reclaims the node's blocks
// as soon as its lease has run out, without the quarantine. A Node deleted while no
// agent watched is caught by the lease's expiry and the quarantine.
func WatchNodes(ctx context.Context, ds datastore.Store, gone func(node string), log *slog.Logger) {
	ks, ok := ds.(*kubeds.Store)
	if !ok {
		return
	}
	go func() {
		err := ks.WatchNodeDeletions(ctx, func(node string) {
			log.Warn("Node deleted: its blocks are reclaimed once its lease runs out", "node", node)
			gone(node)
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Error("watching Node deletions stopped; a dead node's blocks wait for its lease and the quarantine", "err", err)
		}
	}()
}
