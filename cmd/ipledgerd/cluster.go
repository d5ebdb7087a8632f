package main

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/clusterconf"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/netconf"
)

// nodeIPs are the addresses the node publishes with its lease: --node-ip, else the
// source address of each family's default route (none, with a warning, when there
// is no default route: the other nodes then have no route to this node's blocks).
func nodeIPs(o *options, log *slog.Logger) []netip.Addr {
	if len(o.network.NodeIPs) > 0 {
		return o.network.NodeIPs
	}
	h, err := netlink.NewHandle()
	if err != nil {
		log.Warn("cluster mode: netlink: no node address published with the lease; give --node-ip", "err", err)
		return nil
	}
	defer h.Close()
	addrs, err := netconf.DefaultNodeIPs(h)
	if err != nil {
		log.Warn("cluster mode: no node address published with the lease", "err", err)
	}
	return addrs
}

// startCluster opens the datastore and starts the block manager and the watched
// copy of the IPReservations. A datastore that does not answer yet does not stop
// the agent: it serves DELs and the blocks it can prove, and the manager and the
// copy keep trying. stop ends them and closes the store.
func startCluster(ctx context.Context, c *clusterconf.Config, addrs []netip.Addr, l *ledger.Ledger, log *slog.Logger) (*cluster.Manager, *cluster.Reservations, func(), error) {
	ds, err := c.Open(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	m, err := cluster.New(ds, l, cluster.Options{Node: c.NodeName, Addrs: addrs, LeaseTTL: c.LeaseTTL, Grace: c.BlockGrace, Quarantine: c.Quarantine, Logger: log})
	if err != nil {
		ds.Close()
		return nil, nil, nil, err
	}
	rs := cluster.NewReservations(ds, log)
	rctx, rcancel := context.WithCancel(ctx)
	rdone := make(chan struct{})
	go func() { defer close(rdone); rs.Run(rctx) }()
	if err := m.Start(ctx); err != nil {
		log.Warn("cluster mode: the datastore did not answer at start; allocation waits for the node lease", "datastore", c.Datastore, "err", err)
	}
	// the pools' records are followed: a range added or removed applies at once
	go m.WatchPools(ctx)
	// and every block record: the node network routes from this copy, sticky
	// addresses and doctor read it (with or without a node network)
	go m.WatchOwners(ctx)
	log.Info("cluster mode", "node", c.NodeName, "addrs", addrs, "holder", m.Holder(), "datastore", c.Datastore, "leaseTTL", c.LeaseTTL, "quarantine", c.Quarantine, "blockGrace", c.BlockGrace)
	stop := func() {
		rcancel()
		<-rdone
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := m.Stop(sctx); err != nil {
			log.Warn("cluster mode: releasing the node lease", "err", err)
		}
		ds.Close()
	}
	return m, rs, stop, nil
}
