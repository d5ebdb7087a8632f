package cluster

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/datastore"
	"github.com/ipledger/ipledger/internal/nodenet"
	"github.com/ipledger/ipledger/internal/nodenet/controller"
)

// LeaseNodes is cluster mode's node list where no Kubernetes Node says where a node
// is (--datastore etcd): every node whose lease in the datastore is live, with the
// addresses it published with the lease (Options.Addrs), the next hops of the routes
// to its blocks, and every node seen so whose lease is no longer live (the datastore
// no longer lists it: expired, or released by a clean stop; or its revision has not
// moved for its TTL since this list first saw it, the observer's judgement of
// datastore.Leases) while it still owns a block, with the addresses it published
// last. Routes follow block ownership, not the lease: an agent restarted by a
// DaemonSet rollout, or one that died, leaves its pods running, reachable through
// their node, until their blocks are reclaimed (Options.Quarantine); then the node
// owns none, is dropped, and the routes go with the blocks. When the owners cannot
// be read, such a node is kept.
//
// Run lists the leases at once and every interval after; Changed fires when the
// nodes or their addresses changed. A failed list changes nothing: until the first
// list succeeds the list is not Synced, and after it the last one stands.
type LeaseNodes struct {
	ls      datastore.Leases
	blocks  controller.Blocks // the blocks' owners (the manager's watched copy)
	every   time.Duration
	timeout time.Duration
	clk     clock.Clock
	log     *slog.Logger

	mu      sync.Mutex
	synced  bool
	failing bool
	nodes   []nodenet.Node
	live    map[string]bool      // the nodes listed whose lease is live
	seen    map[string]seenLease // by node
	// last: the addresses every node published with its last live lease seen, kept
	// while it is listed (live, or owning a block)
	last    map[string][]netip.Addr
	changed chan struct{}
}

// seenLease is the revision of a node's lease and when this list first saw it.
type seenLease struct {
	rev  int64
	at   time.Duration // clock.Mono
	live bool
}

var (
	_ controller.Nodes  = (*LeaseNodes)(nil)
	_ controller.Blocks = (*Manager)(nil)
)

// LeaseNodes returns the node list of the manager's datastore, listed every
// interval once Run runs (each list bounded by Options.Timeout).
func (m *Manager) LeaseNodes(every time.Duration) *LeaseNodes {
	return &LeaseNodes{ls: m.ds.Leases(), blocks: m, every: every, timeout: m.opts.Timeout, clk: m.opts.Clock, log: m.log,
		seen: map[string]seenLease{}, last: map[string][]netip.Addr{}, changed: make(chan struct{}, 1)}
}

// Run lists the leases now and every interval until ctx ends.
func (n *LeaseNodes) Run(ctx context.Context) {
	t := time.NewTicker(n.every)
	defer t.Stop()
	for {
		n.Refresh(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Refresh lists the leases once and updates the nodes, reporting whether the list
// succeeded.
func (n *LeaseNodes) Refresh(ctx context.Context) bool {
	cctx, cancel := context.WithTimeout(ctx, n.timeout)
	leases, err := n.ls.List(cctx)
	cancel()
	live, ok := n.judge(ctx, leases, err)
	if !ok {
		return false
	}
	// the owners are read without the lock (a LIST when the watched copy is not
	// live): Nodes and Synced answer meanwhile. Refresh runs in one goroutine.
	owning, known := n.owningNodes(ctx, live)
	n.mu.Lock()
	defer n.mu.Unlock()
	var nodes []nodenet.Node
	for name, addrs := range n.last {
		if !live[name] && known && !owning[name] {
			delete(n.last, name)
			continue
		}
		nodes = append(nodes, nodenet.Node{Name: name, Addrs: slices.Clone(addrs)})
	}
	slices.SortFunc(nodes, func(a, b nodenet.Node) int { return strings.Compare(a.Name, b.Name) })
	first := !n.synced
	n.synced = true
	if first || !sameNodes(n.nodes, nodes) || !maps.Equal(live, n.live) {
		n.logChanges(n.nodes, nodes, n.live, live)
		n.nodes, n.live = nodes, live
		select {
		case n.changed <- struct{}{}:
		default:
		}
	}
	return true
}

// judge records a list of the leases (err: it failed) and returns the nodes whose
// lease is live, each one's addresses recorded as its last; false when the list
// failed.
func (n *LeaseNodes) judge(ctx context.Context, leases []datastore.NodeLease, err error) (map[string]bool, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if !n.failing && ctx.Err() == nil {
			n.log.Warn("node network: the node leases cannot be listed; the nodes and their routes stay as they are", "err", err)
		}
		n.failing = true
		return nil, false
	}
	if n.failing {
		n.log.Info("node network: node leases listed again")
		// Nobody may have been able to renew meanwhile: the expiry clocks restart.
		for k, s := range n.seen {
			s.at = n.clk.Mono()
			n.seen[k] = s
		}
		n.failing = false
	}
	now := n.clk.Mono()
	seen := make(map[string]seenLease, len(leases))
	live := map[string]bool{}
	for _, l := range leases {
		s, ok := n.seen[l.Node]
		if !ok || s.rev != l.Revision {
			s = seenLease{rev: l.Revision, at: now}
		}
		s.live = now-s.at < l.TTL
		seen[l.Node] = s
		if s.live {
			live[l.Node] = true
			n.last[l.Node] = slices.Clone(l.Addrs)
		}
	}
	n.seen = seen
	return live, true
}

// owningNodes is the set of nodes, other than those in skip, that own a block, and
// whether the owners could be read; nothing is read when every node remembered is
// in skip.
func (n *LeaseNodes) owningNodes(ctx context.Context, skip map[string]bool) (map[string]bool, bool) {
	need := false
	n.mu.Lock()
	for name := range n.last {
		need = need || !skip[name]
	}
	n.mu.Unlock()
	if !need || n.blocks == nil {
		return nil, n.blocks != nil
	}
	cctx, cancel := context.WithTimeout(ctx, n.timeout)
	defer cancel()
	blocks, err := n.blocks.Owners(cctx)
	if err != nil {
		if ctx.Err() == nil {
			n.log.Warn("node network: the blocks' owners cannot be read; nodes without a live lease keep their routes", "err", err)
		}
		return nil, false
	}
	owning := map[string]bool{}
	for _, b := range blocks {
		if b.Owner != "" && !skip[b.Owner] {
			owning[b.Owner] = true
		}
	}
	return owning, true
}

func (n *LeaseNodes) logChanges(old, cur []nodenet.Node, oldLive, curLive map[string]bool) {
	for _, c := range cur {
		i := slices.IndexFunc(old, func(o nodenet.Node) bool { return o.Name == c.Name })
		switch {
		case curLive[c.Name] && (i < 0 || !oldLive[c.Name] || !slices.Equal(old[i].Addrs, c.Addrs)):
			n.log.Info("node network: node with a live lease", "node", c.Name, "addrs", c.Addrs)
		case !curLive[c.Name] && (i < 0 || oldLive[c.Name]):
			n.log.Info("node network: node's lease expired or was released; its blocks stay routed through its last addresses until they are reclaimed", "node", c.Name, "addrs", c.Addrs)
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(cur, func(c nodenet.Node) bool { return c.Name == o.Name }) {
			n.log.Info("node network: node without a live lease owns no block any more; its routes go", "node", o.Name)
		}
	}
}

func sameNodes(a, b []nodenet.Node) bool {
	return slices.EqualFunc(a, b, func(x, y nodenet.Node) bool {
		return x.Name == y.Name && slices.Equal(x.Addrs, y.Addrs)
	})
}

// Synced reports whether the leases have been listed once.
func (n *LeaseNodes) Synced() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.synced
}

// Nodes returns the nodes with a live lease and those without one that still own a
// block, in node order.
func (n *LeaseNodes) Nodes() []nodenet.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.nodes)
}

// Changed receives a value (coalesced) after the nodes or their addresses changed.
func (n *LeaseNodes) Changed() <-chan struct{} { return n.changed }
