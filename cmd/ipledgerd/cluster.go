package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/clusterconf"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/ipam"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/netconf"
	"github.com/ipledger/ipledger/internal/pool"
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

// preparedNetwork is the network --conflist names, as its ADDs would give it.
type preparedNetwork struct {
	network string
	ranges  []pool.RangeSet
	bits    []int
}

// readConflist reads --conflist and checks it as an ADD's config is checked, in
// cluster mode; errors name the flag, the field and the fix.
func readConflist(path string) (*preparedNetwork, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--conflist: %w; give the conflist the node's pods use (the file install-cni installs), or leave the flag out", err)
	}
	conf, err := ipam.FromConflist(b)
	if err != nil {
		return nil, fmt.Errorf("--conflist %s: %w", path, err)
	}
	ranges := conf.IPAM.RangeSets()
	if pool.HasPodCIDR(ranges) {
		return nil, fmt.Errorf("--conflist %s: ipam.ranges: usePodCidr is for node mode; in cluster mode the ranges are the cluster's pools, split into blocks: give them as CIDRs", path)
	}
	bits, err := cluster.BlockBits(ranges, conf.IPAM.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("--conflist %s: %w", path, err)
	}
	return &preparedNetwork{network: conf.Name, ranges: ranges, bits: bits}, nil
}

// prepareNetwork sets the --conflist network up and claims the node's first
// blocks (cluster.Manager.Prepare), trying again, 1 s to 30 s apart, while the
// datastore does not answer or the lease is not provable. Any other error (the
// pool record disagrees with the conflist) is logged and left to the ADDs, which
// answer it to the runtime.
func prepareNetwork(ctx context.Context, m *cluster.Manager, p preparedNetwork, log *slog.Logger) {
	pause := time.Second
	for {
		n, err := m.Prepare(ctx, p.network, p.ranges, p.bits)
		if err == nil {
			log.Info("network set up before its first ADD", "network", p.network, "blocks_claimed", n)
			return
		}
		if ctx.Err() != nil {
			return
		}
		if !errors.Is(err, cluster.ErrFenced) && !errors.Is(err, datastore.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			log.Error("setting the --conflist network up at start; its first ADD tries again and answers the error", "network", p.network, "err", err)
			return
		}
		log.Info("setting the --conflist network up at start: trying again", "network", p.network, "err", err, "retry", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 30*time.Second)
	}
}
