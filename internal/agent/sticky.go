package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Sticky addresses for StatefulSets (cluster mode): a pod controlled by a
// StatefulSet gets the addresses kept for its name, on whichever node it lands
// (borrowed from the block of the node that keeps them), and its DEL gives a
// borrowed address back to its block, where it stays kept for the name. Node mode
// is unchanged: an address cannot leave the node's podCIDR there.

// StatefulSets tells which StatefulSet controls a pod (kubenode.Pods). Contract:
// StatefulSetOf returns the name of the StatefulSet that is the pod's controller
// ("" when none is, or the API server does not have the pod); an error means the
// API could not be asked, and the ADD fails rather than guess.
type StatefulSets interface {
	StatefulSetOf(ctx context.Context, namespace, name, uid string) (string, error)
}

// Sticky is cluster mode's sticky addresses as the agent uses them
// (cluster.Manager). Contract: AllocateSticky allocates like Cluster.Allocate,
// from the addresses kept for pod when there are (holding each in its block
// record by one compare-and-swap, borrowed from another node's block or in this
// node's own; cluster.ErrBorrowed, naming the holder, when another node holds
// one), else new ones it keeps for pod; ReturnBorrowed gives the kept addresses
// of a released lease back to their blocks (a failure is retried by the
// manager's sweep; a lease with none costs nothing).
//
// Unkeep ends the keeping of an address of this node's blocks (its retention is
// over): one compare-and-swap on the block record, idempotent; it fails with
// cluster.ErrBorrowed while another node holds the address.
type Sticky interface {
	AllocateSticky(ctx context.Context, req ledger.AllocateRequest, pod cluster.StickyPod) (ledger.Lease, bool, error)
	ReturnBorrowed(ctx context.Context, released ledger.Lease) error
	Unkeep(ctx context.Context, network string, addr netip.Addr) error
}

var _ Sticky = (*cluster.Manager)(nil)

// Pod Event reasons of sticky addresses: one another node holds; a kept one a
// reservation ended (the pod got a fresh address).
const (
	ReasonStickyAddressHeld     = "StickyAddressHeld"
	ReasonStickyAddressReserved = "StickyAddressReserved"
)

// returnTimeout bounds giving a released lease's borrowed addresses back.
const returnTimeout = 10 * time.Second

// stickyOf is the StatefulSet pod an ADD's addresses must follow, nil when the
// agent is in node mode, reads no pods, the pod is not a StatefulSet's, or an
// ipledger.io/ip annotation chose its address (the operator's word wins). An
// error means the API could not be asked: the ADD fails, the runtime retries.
func (s *Server) stickyOf(ctx context.Context, pod api.Pod, chosen *choiceMade) (*cluster.StickyPod, *api.Error) {
	if _, ok := s.cfg.Cluster.(Sticky); !ok || s.cfg.StatefulSets == nil || chosen != nil || pod.Namespace == "" || pod.Name == "" {
		return nil, nil
	}
	sts, err := s.cfg.StatefulSets.StatefulSetOf(ctx, pod.Namespace, pod.Name, pod.UID)
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Msg: fmt.Sprintf("reading the owner of pod %s/%s (is it a StatefulSet's?): %v", pod.Namespace, pod.Name, err)}
	}
	if sts == "" {
		return nil, nil
	}
	return &cluster.StickyPod{Namespace: pod.Namespace, StatefulSet: sts, Pod: pod.Name}, nil
}

// allocateSticky allocates for the StatefulSet pod sp (the network set up).
func (s *Server) allocateSticky(ctx context.Context, areq ledger.AllocateRequest, sp cluster.StickyPod) (ledger.Lease, bool, error) {
	return s.cfg.Cluster.(Sticky).AllocateSticky(ctx, areq, sp)
}

// stickyRefused is the answer to an ADD whose sticky address another node holds
// (two nodes raced for it, or the pod still runs there after a partition): a CNI
// error and a Warning Event on the pod, both naming the holder. nil for any other
// error.
func (s *Server) stickyRefused(pod api.Pod, sp *cluster.StickyPod, err error) *api.Error {
	if sp == nil || !errors.Is(err, cluster.ErrBorrowed) {
		return nil
	}
	msg := fmt.Sprintf("sticky address of %s (StatefulSet %s/%s) is held elsewhere: %v; it is given to this pod once that node's pod is deleted (the runtime retries)", sp.Pod, sp.Namespace, sp.StatefulSet, err)
	if s.cfg.Events != nil {
		s.cfg.Events.PodEvent(pod.Namespace, pod.Name, pod.UID, eventWarning, ReasonStickyAddressHeld, actionAllocate, msg)
	}
	return &api.Error{Code: api.CodeConflict, Msg: msg}
}

// stickyReserved tells, in the log and by a Warning Event on the pod, that the
// lease ls of a StatefulSet pod has fresh addresses because a reservation ended
// the keeping of its kept ones (its Why says which; nothing when it does not).
func (s *Server) stickyReserved(pod api.Pod, ls ledger.Lease) {
	_, ended, ok := strings.Cut(ls.Why, cluster.WhyNoLongerKept)
	if !ok {
		return
	}
	msg := fmt.Sprintf("address no longer kept for this StatefulSet pod: %s; it got %s from its pool instead, kept for it from now on", ended, ipList(ls.IPs))
	s.log.Warn("sticky address reserved; the pod got a fresh address", "attachment", ls.Key.String(), "pod", pod.Namespace+"/"+pod.Name, "ended", ended, "ips", ipList(ls.IPs))
	if s.cfg.Events != nil {
		s.cfg.Events.PodEvent(pod.Namespace, pod.Name, pod.UID, eventWarning, ReasonStickyAddressReserved, actionAllocate, msg)
	}
}

// ipList is a lease's addresses, without their prefix lengths.
func ipList(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Addr().String()
	}
	return strings.Join(out, ", ")
}

// returnBorrowed gives the kept addresses of released (a lease this node
// released: DEL, GC, reconciliation, an operator), borrowed or of its own blocks,
// back to their blocks, where they stay kept for their pod (the manager reads its
// ledger first: a lease with none costs no datastore call). A failure is logged; the manager's sweep returns what
// no lease holds.
func (s *Server) returnBorrowed(ctx context.Context, released ledger.Lease) {
	st, ok := s.cfg.Cluster.(Sticky)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), returnTimeout)
	defer cancel()
	if err := st.ReturnBorrowed(ctx, released); err != nil {
		s.log.Warn("returning kept addresses of a released lease; the block sweep retries", "attachment", released.Key.String(), "addrs", fmt.Sprint(released.IPs), "err", err)
	}
}

// StatefulSetCache tells the cluster's StatefulSets (kubenode.StatefulSets).
// Contract: Ordinals never calls the API server; it returns the StatefulSet's
// pods' ordinals, start (spec.ordinals.start, 0 when unset) up to start+replicas
// (excluded). known is false while the cache cannot vouch for an absence (it has
// not listed since the agent started, or an error came since its last list);
// then nothing is released on its word. Changed receives a value after the
// cache changed (it may be nil: no notice).
type StatefulSetCache interface {
	Ordinals(namespace, name string) (start, replicas int32, exists, known bool)
	Changed() <-chan struct{}
}

// retention is the state of the retention sweep: since when each kept address
// of this node's blocks has been unused (Mono).
type retention struct {
	mu     sync.Mutex
	unused map[string]time.Duration // "network addr"
}

// RunRetention ends, every interval and after each change of the StatefulSets
// until ctx ends, the keeping of the sticky
// addresses of this node's blocks whose retention is over: their StatefulSet is
// deleted, or scaled down below their pod's ordinal, or (with
// Config.StickyRetention) they have been unused that long. Every agent sweeps
// only its own blocks, each release one idempotent compare-and-swap, so the
// agents need no leader; an address lent to another node is kept until it comes
// back.
func (s *Server) RunRetention(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var changed <-chan struct{}
	if s.cfg.StatefulSetCache != nil {
		changed = s.cfg.StatefulSetCache.Changed()
	}
	for {
		if err := s.SweepRetention(ctx); err != nil {
			s.log.Warn("sticky address retention sweep", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changed:
		}
	}
}

// SweepRetention is one round of RunRetention.
func (s *Server) SweepRetention(ctx context.Context) error {
	st, ok := s.cfg.Cluster.(Sticky)
	if !ok || s.cfg.StatefulSetCache == nil {
		return nil
	}
	blocks, err := s.cfg.Cluster.Blocks(ctx)
	if err != nil {
		return fmt.Errorf("listing blocks: %w", err)
	}
	self, now := s.cfg.Cluster.Node(), s.cfg.Clock.Mono()
	seen := map[string]bool{}
	var errs []error
	for _, b := range blocks {
		if b.Owner != self {
			continue
		}
		for _, k := range b.Borrows {
			key := b.Network + " " + k.Addr.String()
			seen[key] = true
			why := s.retentionOver(b.Network, k, key, now)
			if why == "" {
				continue
			}
			if err := st.Unkeep(ctx, b.Network, k.Addr); err != nil {
				if !errors.Is(err, cluster.ErrBorrowed) {
					errs = append(errs, fmt.Errorf("releasing %s kept for %s (%s): %w", k.Addr, k.For, why, err))
				}
				continue
			}
			s.log.Info("sticky address released: its retention is over", "network", b.Network, "addr", k.Addr.String(), "for", k.For, "why", why)
		}
	}
	s.retained.mu.Lock()
	for key := range s.retained.unused {
		if !seen[key] {
			delete(s.retained.unused, key)
		}
	}
	s.retained.mu.Unlock()
	return errors.Join(errs...)
}

// retentionOver says why the keeping of k (an address of network, key its
// sweep key) is over, "" when it is not, or when the StatefulSet cache cannot
// tell (unknown means keep).
func (s *Server) retentionOver(network string, k cluster.Borrow, key string, now time.Duration) string {
	ns, rest, ok1 := strings.Cut(k.For, "/")
	sts, pod, ok2 := strings.Cut(rest, "/")
	if !ok1 || !ok2 {
		return ""
	}
	start, replicas, exists, known := s.cfg.StatefulSetCache.Ordinals(ns, sts)
	switch {
	case !known:
		return ""
	case !exists:
		return fmt.Sprintf("StatefulSet %s/%s is deleted", ns, sts)
	}
	if o, ok := ordinalOf(sts, pod); ok && (o < int(start) || o >= int(start)+int(replicas)) {
		return fmt.Sprintf("StatefulSet %s/%s has no ordinal %d any more (ordinals %d to %d)", ns, sts, o, start, int(start)+int(replicas)-1)
	}
	if s.cfg.StickyRetention <= 0 {
		return ""
	}
	s.retained.mu.Lock()
	defer s.retained.mu.Unlock()
	if s.retained.unused == nil {
		s.retained.unused = map[string]time.Duration{}
	}
	if _, held := s.cfg.Ledger.Holder(network, k.Addr); held || k.Node != "" {
		delete(s.retained.unused, key)
		return ""
	}
	since, ok := s.retained.unused[key]
	if !ok {
		s.retained.unused[key] = now
		return ""
	}
	if now-since >= s.cfg.StickyRetention {
		return fmt.Sprintf("unused for %v (--sticky-retention %v)", (now - since).Round(time.Second), s.cfg.StickyRetention)
	}
	return ""
}

// ordinalOf is the ordinal of the StatefulSet sts's pod named pod ("web-2": 2).
func ordinalOf(sts, pod string) (int, bool) {
	n, ok := strings.CutPrefix(pod, sts+"-")
	if !ok {
		return 0, false
	}
	o, err := strconv.Atoi(n)
	return o, err == nil && o >= 0
}
