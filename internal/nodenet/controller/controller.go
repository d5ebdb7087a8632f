// Package controller keeps a node's network in its desired state: the routes to
// every other node's pods (nodenet.Desired over the Nodes, or the cluster's blocks)
// and the masquerade of pod traffic leaving the cluster's pod ranges. It reconciles
// at start, whenever the Nodes or the blocks change, when a route of ours is deleted
// behind its back (systemd-networkd, an operator: RoutesChanged), soon after a
// failure, and every resync interval, so such a route comes back at once, and a
// route left by a Node deleted while the agent was down goes.
//
// When in doubt it keeps: before the Nodes have been listed once, or when the blocks
// cannot be read, nothing is changed (an empty answer is not taken for "no nodes").
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/masq"
	"github.com/ipledger/ipledger/internal/nodenet/routes"
)

// Nodes is the Node watch (kubenode.Watch).
type Nodes interface {
	// Synced reports whether the Nodes have been listed once.
	Synced() bool
	// Nodes returns every Node known.
	Nodes() []nodenet.Node
	// Changed receives a value after the Nodes changed.
	Changed() <-chan struct{}
}

// Blocks is cluster mode's view of the cluster's address blocks and their owners
// (the block manager). An error means "unknown", never "none".
type Blocks interface {
	Owners(ctx context.Context) ([]nodenet.Block, error)
}

// Pools is cluster mode's view of the pools' ranges (the block manager): every
// network's ranges, claimed or not. An error means "unknown", never "none".
type Pools interface {
	PoolRanges(ctx context.Context) ([]netip.Prefix, error)
}

// Routes applies the desired routes (routes.Reconciler).
type Routes interface {
	Sync(desired []nodenet.Route) (routes.Report, error)
}

var _ Routes = (*routes.Reconciler)(nil)

// Masquerade applies the masquerade rules (masq.Masq).
type Masquerade interface {
	Sync(podCIDRs, nonMasq []netip.Prefix) error
}

// Forward keeps the forwarding accepts of the pod ranges in the iptables FORWARD
// chain and checks forwarding (masq.Forward).
type Forward interface {
	Sync(podCIDRs []netip.Prefix) (masq.ForwardStatus, error)
}

var (
	_ Masquerade = (*masq.Masq)(nil)
	_ Forward    = (*masq.Forward)(nil)
)

// Events records Kubernetes Events on this agent's own Node (kubenode.Events), so
// that what the controller finds wrong shows in `kubectl describe node` and
// `kubectl get events`. Warning must not block and has no error: an Event that
// cannot be sent is the implementation's to log and drop, never a failure of the
// reconciliation.
type Events interface {
	Warning(reason, action, note string)
}

// Event reasons and actions the controller records.
const (
	// ReasonRouteNextHopOffLink: a route to another node's pods was not made
	// because that node's address is not on a directly connected network.
	ReasonRouteNextHopOffLink = "RouteNextHopOffLink"
	// ActionRoute is what the controller was doing: routing to a node's pods.
	ActionRoute = "RouteToNodePods"
)

// Config wires a Controller.
type Config struct {
	Self  string
	Nodes Nodes
	// Blocks: cluster mode's blocks; nil in node mode (routes to the Nodes'
	// podCIDRs).
	Blocks Blocks
	// BlocksChanged receives a value when a block changed owner (cluster mode).
	BlocksChanged <-chan struct{}
	// Pools: cluster mode's pool ranges, all of them pod ranges not masqueraded
	// (a block claimed a moment ago is inside them before this node sees the
	// claim); nil: the blocks alone.
	Pools Pools
	// RoutesChanged receives a value when a route of ours left the table
	// (routes.Watch); nil: only the resync puts it back.
	RoutesChanged <-chan struct{}
	Routes        Routes     // nil: --routes=false
	Masquerade    Masquerade // nil: --masquerade=false
	// Forward: the accepts of the pod ranges in FORWARD and the forwarding
	// check; nil: none.
	Forward       Forward
	NonMasquerade []netip.Prefix
	Resync        time.Duration
	// Ready runs after the first reconciliation that left no error and left this
	// node's routes in place (notInPlace): the agent sets its Node's
	// NetworkUnavailable condition false. It is retried at each reconciliation
	// until it succeeds. Never with Routes nil (--routes=false): the underlay's
	// route controller (a cloud's) owns the condition then.
	Ready func(ctx context.Context) error
	// Available reports whether the Node shows NetworkUnavailable=False (the Node
	// watch). When it turns false after Ready succeeded (the Node was deleted and
	// created again, or another writer set the condition True), Ready runs again at
	// the next reconciliation that leaves no error. nil: Ready runs once.
	Available func() bool
	// Events: Warning Events on this node's Node; nil: none.
	Events Events
	Log    *slog.Logger
}

// Status is the outcome of the last reconciliation, for doctor and the metrics.
type Status struct {
	At       time.Time         `json:"at"`
	Synced   bool              `json:"synced"` // the Nodes have been listed
	Routes   int               `json:"routes"` // routes desired
	Report   routes.Report     `json:"report"`
	Problems []nodenet.Problem `json:"-"`
	// ProblemText: Problems as text (their errors do not marshal).
	ProblemText []string       `json:"problems,omitempty"`
	PodCIDRs    []netip.Prefix `json:"podCIDRs,omitempty"` // the cluster's pod ranges (not masqueraded)
	// Forward: the FORWARD accepts and forwarding, as the last sync left them
	// (nil: not synced).
	Forward *masq.ForwardStatus `json:"forward,omitempty"`
	Err     string              `json:"error,omitempty"`
	Ready   bool                `json:"ready"` // NetworkUnavailable set false
	// NotInPlace: why this node's routes are not all in place, so that
	// NetworkUnavailable is not set false (notInPlace); empty when they are.
	NotInPlace string `json:"notInPlace,omitempty"`
	// byVia: the node each desired route's next hop belongs to.
	byVia map[netip.Addr]string
}

// Controller reconciles the node network.
type Controller struct {
	cfg Config

	mu     sync.Mutex
	status Status
	ready  bool
	syncs  int
	errs   uint64
	// offLinkSent: the (node, next hop) pairs whose off-link Event was recorded and
	// whose condition has not cleared since.
	offLinkSent map[offLinkKey]bool
	// lastNotInPlace: the reason last logged for not setting NetworkUnavailable
	// false
	lastNotInPlace string
}

// offLinkKey is another node and the address its pods would be routed via.
type offLinkKey struct {
	node string
	via  netip.Addr
}

// New returns a Controller; Run starts it.
func New(cfg Config) (*Controller, error) {
	if cfg.Nodes == nil {
		return nil, errors.New("controller: no Node watch")
	}
	if cfg.Resync <= 0 {
		return nil, errors.New("controller: resync interval must be positive")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Controller{cfg: cfg}, nil
}

// Retry bounds: a reconciliation that failed is tried again after MinRetry,
// then after twice as long each time it fails again, up to the resync interval.
const MinRetry = 200 * time.Millisecond

// Run reconciles until ctx ends: at start, when the Nodes, the blocks or the
// routes change, every resync interval, and soon after a reconciliation that
// failed (MinRetry, doubling up to the resync interval).
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTicker(c.cfg.Resync)
	defer t.Stop()
	retryTimer := time.NewTimer(time.Hour)
	retryTimer.Stop()
	defer retryTimer.Stop()
	var backoff time.Duration
	for {
		c.Reconcile(ctx)
		var retry <-chan time.Time
		if c.failed() {
			backoff = min(max(2*backoff, MinRetry), c.cfg.Resync)
			retryTimer.Reset(backoff)
			retry = retryTimer.C
		} else {
			backoff = 0
		}
		select {
		case <-ctx.Done():
			return
		case <-c.cfg.Nodes.Changed():
		case <-c.cfg.BlocksChanged:
		case <-c.cfg.RoutesChanged:
		case <-retry:
		case <-t.C:
		}
		retryTimer.Stop()
	}
}

// failed reports whether the last reconciliation tried and failed (not: the
// Nodes are not listed yet, which their watch tells the end of).
func (c *Controller) failed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status.Synced && c.status.Err != ""
}

// Status returns the last reconciliation's outcome.
func (c *Controller) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// Counts are the figures of the last reconciliation, for metrics.
func (c *Controller) Counts() nodenet.Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.status
	return nodenet.Counts{Routes: st.Routes, Conflicts: len(st.Report.Conflicts), OffLink: len(st.Report.OffLink),
		Problems: len(st.Problems), Syncs: uint64(c.syncs), Errors: c.errs, Ready: c.ready}
}

// Waiting says why the node network has not yet been reconciled once without
// error ("" once it has, and from then on): the Nodes (or node leases) not listed
// yet, or the error of the last reconciliation. Until then the agent refuses ADD
// and fails STATUS, so that no pod starts before its traffic is routed and
// masqueraded (a connection opened earlier keeps its un-masqueraded conntrack
// entry).
func (c *Controller) Waiting() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.syncs > 0:
		return ""
	case c.status.Err != "":
		return c.status.Err
	}
	return "not reconciled yet"
}

// Syncs is the number of reconciliations that changed or confirmed the host's state.
func (c *Controller) Syncs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncs
}

// Reconcile compares the host with the desired state once and applies the
// difference.
func (c *Controller) Reconcile(ctx context.Context) {
	st := Status{At: time.Now(), Synced: c.cfg.Nodes.Synced()}
	defer func() {
		c.mu.Lock()
		st.Ready = c.ready
		c.status = st
		c.mu.Unlock()
	}()
	if !st.Synced {
		st.Err = "the Nodes have not been listed yet: nothing changed"
		return
	}
	nodes := c.cfg.Nodes.Nodes()
	var blocks []nodenet.Block
	if c.cfg.Blocks != nil {
		var err error
		if blocks, err = c.cfg.Blocks.Owners(ctx); err != nil {
			st.Err = fmt.Sprintf("reading the cluster's blocks: %v: nothing changed", err)
			c.cfg.Log.Warn("node network: the blocks cannot be read; routes and rules kept as they are", "err", err)
			return
		}
		if blocks == nil {
			blocks = []nodenet.Block{} // cluster mode with no block yet
		}
	}
	plan := nodenet.Desired(c.cfg.Self, nodes, blocks)
	st.Routes, st.Problems = len(plan.Routes), plan.Problems
	st.byVia = map[netip.Addr]string{}
	for _, r := range plan.Routes {
		for _, a := range append([]netip.Addr{r.Via}, r.Alt...) {
			if a.IsValid() {
				st.byVia[a] = r.Node
			}
		}
	}
	for _, p := range plan.Problems {
		st.ProblemText = append(st.ProblemText, p.Err.Error())
	}
	var errs []error
	// the pod ranges not masqueraded: node mode's podCIDRs, cluster mode's blocks
	// and, where known, the pools' ranges around them
	podRanges, rangesKnown := blocks, true
	if c.cfg.Pools != nil && c.cfg.Masquerade != nil {
		ranges, err := c.cfg.Pools.PoolRanges(ctx)
		if err != nil {
			// unknown: the masquerade rules stay as they are (never narrowed to the
			// claimed blocks, which would masquerade the pods of a new block)
			errs = append(errs, fmt.Errorf("masquerade: reading the pools' ranges: %w (rules kept as they are)", err))
			rangesKnown = false
		}
		podRanges = slices.Clone(blocks)
		for _, r := range ranges {
			podRanges = append(podRanges, nodenet.Block{Prefix: r})
		}
	}
	st.PodCIDRs = nodenet.ClusterCIDRs(nodes, podRanges)
	if c.cfg.Routes != nil {
		rep, err := c.cfg.Routes.Sync(plan.Routes)
		st.Report = rep
		if err != nil {
			errs = append(errs, fmt.Errorf("routes: %w", err))
		}
		if rep.Installed > 0 || rep.Removed > 0 {
			c.cfg.Log.Info("node network: routes reconciled", "installed", rep.Installed, "removed", rep.Removed, "unchanged", rep.Unchanged)
		}
		for _, cf := range rep.Conflicts {
			c.cfg.Log.Warn("node network: a route of another owner holds a pod range; left alone", "route", cf.String())
		}
		for _, o := range rep.OffLink {
			c.cfg.Log.Warn("node network: next hop not on a directly connected network; no route (nodes must share an L2 network, or use --routes=false with an underlay that routes pod addresses)", "route", o.String())
		}
		c.offLinkEvents(rep.OffLink, st.byVia, err == nil)
	}
	if c.cfg.Masquerade != nil && len(st.PodCIDRs) > 0 && rangesKnown {
		// no pod range known yet: masquerading nothing is right, and the rules of
		// an earlier run stay until the ranges are known
		if err := c.cfg.Masquerade.Sync(st.PodCIDRs, c.cfg.NonMasquerade); err != nil {
			errs = append(errs, fmt.Errorf("masquerade: %w", err))
		}
	}
	if c.cfg.Forward != nil && len(st.PodCIDRs) > 0 && rangesKnown {
		fs, err := c.cfg.Forward.Sync(st.PodCIDRs)
		st.Forward = &fs
		if err != nil {
			errs = append(errs, fmt.Errorf("forwarding: %w", err))
		}
		if fs.IPv4.SetForwarding {
			c.cfg.Log.Info("node network: net.ipv4.ip_forward was 0; turned it on (pods on other nodes and outside are reached through this node's forwarding)")
		}
	}
	if err := errors.Join(errs...); err != nil {
		st.Err = err.Error()
		c.mu.Lock()
		c.errs++
		c.mu.Unlock()
		c.cfg.Log.Error("node network: reconciling", "err", err)
		return
	}
	st.NotInPlace = c.notInPlace(plan, st.Report)
	c.mu.Lock()
	c.syncs++
	if c.ready && c.cfg.Available != nil && !c.cfg.Available() {
		c.ready = false
	}
	ready := c.ready
	c.mu.Unlock()
	if st.NotInPlace != "" {
		c.mu.Lock()
		changed := c.lastNotInPlace != st.NotInPlace
		c.lastNotInPlace = st.NotInPlace
		c.mu.Unlock()
		if changed && !ready && c.cfg.Routes != nil {
			c.cfg.Log.Warn("node network: NetworkUnavailable not set false: this node's routes are not all in place", "because", st.NotInPlace)
		}
		return
	}
	if !ready && c.cfg.Ready != nil && slices.ContainsFunc(nodes, func(n nodenet.Node) bool { return n.Name == c.cfg.Self }) {
		if err := c.cfg.Ready(ctx); err != nil {
			c.cfg.Log.Warn("node network: setting NetworkUnavailable=False", "err", err)
			return
		}
		c.mu.Lock()
		c.ready = true
		c.mu.Unlock()
		c.cfg.Log.Info("node network ready: NetworkUnavailable=False", "routes", st.Routes)
	}
}

// notInPlace says why this node's routes, after a sync that left no error
// with the plan and its report rep, are not all in place ("" when they are):
// routes are not ipledger's (--routes=false); in node mode this node has no
// podCIDR (nothing routes to its pods); a route of another owner holds a pod
// range; or a next hop is off-link and no Event reports it. An off-link peer
// recorded as a Warning Event on the Node does not hold the node back: its pods
// cannot be routed from anywhere, and the Event says why.
func (c *Controller) notInPlace(plan nodenet.Plan, rep routes.Report) string {
	if c.cfg.Routes == nil {
		return "--routes=false: the underlay's route controller owns NetworkUnavailable"
	}
	if c.cfg.Blocks == nil && slices.ContainsFunc(plan.Problems, func(p nodenet.Problem) bool {
		return p.Node == c.cfg.Self && errors.Is(p.Err, nodenet.ErrNoPodCIDR)
	}) {
		return fmt.Sprintf("this node's Node %q has no spec.podCIDRs", c.cfg.Self)
	}
	if n := len(rep.Conflicts); n > 0 {
		return fmt.Sprintf("%d pod ranges held by routes of another owner (first: %s)", n, rep.Conflicts[0])
	}
	if n := len(rep.OffLink); n > 0 && c.cfg.Events == nil {
		return fmt.Sprintf("%d routes not made: next hop off-link, and no Event reports it (first: %s)", n, rep.OffLink[0])
	}
	return ""
}

// offLinkEvents records one Warning Event per other node and next-hop address whose
// routes are off-link, once until the condition clears: a pair recorded before and
// absent from a complete report (complete: the route sync succeeded) may be recorded
// again when it comes back. Several destinations via one address (a node's podCIDRs)
// make one Event naming them all.
func (c *Controller) offLinkEvents(offLink []routes.OffLink, byVia map[netip.Addr]string, complete bool) {
	if c.cfg.Events == nil {
		return
	}
	dsts := map[offLinkKey][]string{}
	var order []offLinkKey
	for _, o := range offLink {
		k := offLinkKey{byVia[o.Via], o.Via}
		if _, ok := dsts[k]; !ok {
			order = append(order, k)
		}
		dsts[k] = append(dsts[k], o.Dst.String())
	}
	c.mu.Lock()
	if c.offLinkSent == nil {
		c.offLinkSent = map[offLinkKey]bool{}
	}
	if complete {
		for k := range c.offLinkSent {
			if _, still := dsts[k]; !still {
				delete(c.offLinkSent, k)
			}
		}
	}
	var send []offLinkKey
	for _, k := range order {
		if !c.offLinkSent[k] {
			c.offLinkSent[k] = true
			send = append(send, k)
		}
	}
	c.mu.Unlock()
	for _, k := range send {
		c.cfg.Events.Warning(ReasonRouteNextHopOffLink, ActionRoute, OffLinkNote(c.cfg.Self, k.node, k.via, dsts[k]))
	}
}

// OffLinkNote is the Event's message for routes from node self to node other's pods
// (dsts) via its address via, which is not on-link.
func OffLinkNote(self, other string, via netip.Addr, dsts []string) string {
	return fmt.Sprintf("no route from node %s to node %s's pods (%s): next hop %s is not on a directly connected network of %s, and ipledger never routes pods through a gateway; fix: put the nodes on one L2 network, or run ipledgerd with --routes=false where the underlay routes pod addresses",
		self, other, strings.Join(dsts, ", "), via, self)
}
