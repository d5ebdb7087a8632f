package cluster

import (
	"context"
	"log/slog"
	"slices"
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
// to its blocks. A lease the datastore no longer lists (expired, released) or whose
// revision has not moved for its TTL since this list first saw it (the observer's
// judgement of datastore.Leases) is a node gone: its routes go.
//
// Run lists the leases at once and every interval after; Changed fires when the
// nodes or their addresses changed. A failed list changes nothing: until the first
// list succeeds the list is not Synced, and after it the last one stands.
type LeaseNodes struct {
	ls      datastore.Leases
	every   time.Duration
	timeout time.Duration
	clk     clock.Clock
	log     *slog.Logger

	mu      sync.Mutex
	synced  bool
	failing bool
	nodes   []nodenet.Node
	seen    map[string]seenLease // by node
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
	return newLeaseNodes(m.ds.Leases(), every, m.opts.Timeout, m.opts.Clock, m.log)
}

func newLeaseNodes(ls datastore.Leases, every, timeout time.Duration, clk clock.Clock, log *slog.Logger) *LeaseNodes {
	return &LeaseNodes{ls: ls, every: every, timeout: timeout, clk: clk, log: log,
		seen: map[string]seenLease{}, changed: make(chan struct{}, 1)}
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
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		if !n.failing && ctx.Err() == nil {
			n.log.Warn("node network: the node leases cannot be listed; the nodes and their routes stay as they are", "err", err)
		}
		n.failing = true
		return false
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
	var nodes []nodenet.Node
	for _, l := range leases {
		s, ok := n.seen[l.Node]
		if !ok || s.rev != l.Revision {
			s = seenLease{rev: l.Revision, at: now}
		}
		s.live = now-s.at < l.TTL
		seen[l.Node] = s
		if s.live {
			nodes = append(nodes, nodenet.Node{Name: l.Node, Addrs: slices.Clone(l.Addrs)})
		}
	}
	n.seen = seen
	first := !n.synced
	n.synced = true
	if first || !sameNodes(n.nodes, nodes) {
		n.logChanges(n.nodes, nodes)
		n.nodes = nodes
		select {
		case n.changed <- struct{}{}:
		default:
		}
	}
	return true
}

func (n *LeaseNodes) logChanges(old, cur []nodenet.Node) {
	for _, c := range cur {
		i := slices.IndexFunc(old, func(o nodenet.Node) bool { return o.Name == c.Name })
		if i < 0 || !slices.Equal(old[i].Addrs, c.Addrs) {
			n.log.Info("node network: node with a live lease", "node", c.Name, "addrs", c.Addrs)
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(cur, func(c nodenet.Node) bool { return c.Name == o.Name }) {
			n.log.Info("node network: node's lease expired or was released; its routes go", "node", o.Name)
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

// Nodes returns the nodes with a live lease, in node order.
func (n *LeaseNodes) Nodes() []nodenet.Node {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.nodes)
}

// Changed receives a value (coalesced) after the nodes or their addresses changed.
func (n *LeaseNodes) Changed() <-chan struct{} { return n.changed }
