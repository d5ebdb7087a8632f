package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/datastore/kubeds"
	"github.com/ipledger/ipledger/internal/kubenode"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
)

var _ controller.Pools = (*cluster.Manager)(nil)
var _ agent.Choices = (*kubenode.Pods)(nil)

// startNetwork starts the Kubernetes features of the agent (--node-name): the Node
// watch, which resolves usePodCidr, and the node network's controller (routes to the
// other nodes' pods, masquerade), in the background until ctx ends. m is cluster
// mode's block manager (nil in node mode): its blocks, not the Nodes' podCIDRs, say
// where pods live then, and the same watch tells it of Node deletions and
// re-creations (a deleted Node's blocks are reclaimed once its lease runs out,
// without the quarantine, unless the Node is registered again meanwhile; a Node
// deleted while no agent watched is caught by the lease's expiry and the
// quarantine). It subscribes before the watch runs, so that it hears of every
// change after the first list.
//
// It also starts the watch of this node's pods (shown with each lease) and the
// Events recorder the agent reports releases, supersedes and stranded leases with
// on their pods.
func startNetwork(ctx context.Context, o *options, m *cluster.Manager, log *slog.Logger) (*kubeParts, error) {
	rc, err := kubeds.LoadConfig(o.cluster.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	w, err := kubenode.New(rc, o.cluster.NodeName, log)
	if err != nil {
		return nil, err
	}
	if m != nil {
		w.Subscribe(m)
	}
	w.Run(ctx)
	pods, err := kubenode.NewPods(rc, o.cluster.NodeName, clock.NewSystem(), log.With("part", "pods"))
	if err != nil {
		return nil, err
	}
	pods.Run(ctx)
	// one recorder for the Node's Events and the pods'
	ev, err := kubenode.NewEvents(ctx, rc, o.cluster.NodeName, log.With("part", "events"))
	if err != nil {
		return nil, err
	}
	kp := &kubeParts{nodes: w, pods: pods, events: ev}
	if m != nil {
		// cluster mode: the StatefulSets say how long sticky addresses are kept
		if kp.statefulSets, err = kubenode.NewStatefulSets(rc, log.With("part", "statefulsets")); err != nil {
			return nil, err
		}
		kp.statefulSets.Run(ctx)
	}
	if !o.network.Enabled(true) {
		return kp, nil
	}
	cfg := controller.Config{Self: o.cluster.NodeName, Nodes: w, NonMasquerade: o.network.NonMasquerade, Resync: o.network.Resync,
		Events: ev, Log: log.With("part", "node-network")}
	if o.network.Routes {
		// with --routes=false the underlay's route controller owns the condition
		cfg.Ready, cfg.Available = w.SetNetworkAvailable, w.NetworkAvailable
	}
	if kp.network, err = runController(ctx, o, cfg, m, log); err != nil {
		return nil, err
	}
	return kp, nil
}

// kubeParts is what startNetwork started: the Node watch, the watch of this node's
// pods, the pods' Events and the node network's controller (nil with --routes=false
// and --masquerade=false).
type kubeParts struct {
	nodes   *kubenode.Watch
	pods    *kubenode.Pods
	events  *kubenode.Events
	network *controller.Controller
	// statefulSets: cluster mode's cache of the StatefulSets (sticky addresses'
	// retention), nil in node mode
	statefulSets *kubenode.StatefulSets
}

var (
	_ agent.Pods     = (*kubenode.Pods)(nil)
	_ agent.PodWatch = (*kubenode.Pods)(nil)
	_ agent.Events   = (*kubenode.Events)(nil)

	_ agent.StatefulSets     = (*kubenode.Pods)(nil)
	_ agent.StatefulSetCache = (*kubenode.StatefulSets)(nil)
)

// startLeaseNetwork starts the node network of cluster mode on the etcd datastore,
// which has no Kubernetes Nodes: the nodes are those with a live lease, reached
// through the addresses each published with it (--node-ip), listed every quarter
// of the lease TTL, and those whose lease is gone (a clean stop, a crash) while
// they still own a block, reached through the addresses they published last: the
// routes to a node's blocks go when the blocks are reclaimed, not with its lease.
// nil when --routes=false and --masquerade=false.
func startLeaseNetwork(ctx context.Context, o *options, m *cluster.Manager, log *slog.Logger) (*controller.Controller, error) {
	if !o.network.Enabled(true) {
		return nil, nil
	}
	nodes := m.LeaseNodes(o.cluster.LeaseTTL / 4)
	go nodes.Run(ctx)
	cfg := controller.Config{Self: o.cluster.NodeName, Nodes: nodes, NonMasquerade: o.network.NonMasquerade, Resync: o.network.Resync,
		Log: log.With("part", "node-network")}
	return runController(ctx, o, cfg, m, log)
}

// runController completes cfg with cluster mode's blocks (m, nil in node mode) and
// the routes and masquerade the flags ask for, and runs the controller until ctx
// ends.
func runController(ctx context.Context, o *options, cfg controller.Config, m *cluster.Manager, log *slog.Logger) (*controller.Controller, error) {
	if m != nil {
		cfg.Blocks, cfg.BlocksChanged, cfg.Pools = m, m.BlocksChanged(), m // WatchOwners runs (startCluster)
	}
	if o.network.Routes {
		// a new handle after a failed sync: a socket gone bad is not used twice
		cfg.Routes = routes.NewOpener(func() (routes.Netlink, error) { return netlink.NewHandle() })
		// a route of ours deleted by another program comes back at once, not at the resync
		cfg.RoutesChanged = routes.Watch(ctx, netns.None(), cfg.Log)
	}
	if o.network.Masquerade {
		cfg.Masquerade = masq.New(netns.None())
	}
	// the FORWARD accepts of the pod ranges: pods are forwarded through this node
	// whether it routes or masquerades them
	cfg.Forward = masq.NewForward(netns.None())
	c, err := controller.New(cfg)
	if err != nil {
		return nil, err
	}
	go c.Run(ctx)
	log.Info("node network", "node", o.cluster.NodeName, "nodes", nodesSource(o), "routes", o.network.Routes, "masquerade", o.network.Masquerade, "nonMasquerade", o.network.NonMasquerade, "resync", o.network.Resync)
	return c, nil
}

// nodesSource names where the node network learns the nodes, for the log.
func nodesSource(o *options) string {
	if o.cluster.Kubernetes() {
		return "kubernetes"
	}
	return "node leases"
}

// removeRoutesIfOff deletes, at start, every route of ipledger's protocol in the main
// table when this run makes none (--routes=false, or neither --node-name nor
// --datastore etcd): an earlier run's routes would otherwise stay, with next hops
// nobody keeps up to date (a move to a cloud route table keeps stale ones). Routes
// of any other protocol are never touched. A failure is logged, not fatal: the
// addresses are served all the same.
func removeRoutesIfOff(o *options, log *slog.Logger) {
	if o.network.Routes && (o.cluster.Kubernetes() || o.cluster.LeaseNodes()) {
		return
	}
	h, err := netlink.NewHandle()
	if err != nil {
		log.Error("routes off: cannot open netlink to remove ipledger's earlier routes", "err", err)
		return
	}
	defer h.Close()
	n, err := routes.New(h).Remove()
	if err != nil {
		log.Error("routes off: removing ipledger's earlier routes", "protocol", int(routes.Protocol), "removed", n, "err", err)
		return
	}
	if n > 0 {
		log.Info("routes off: removed ipledger's earlier routes", "protocol", int(routes.Protocol), "removed", n)
	}
}
