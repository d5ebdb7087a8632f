package agent

import (
	"context"
	"errors"
	"fmt"
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
// from the addresses kept for pod when there are (borrowing them by one
// compare-and-swap; cluster.ErrBorrowed, naming the holder, when another node
// holds one), else new ones it keeps for pod; ReturnBorrowed gives the borrowed
// addresses of a released lease back to their blocks (a failure is retried by the
// manager's sweep).
type Sticky interface {
	AllocateSticky(ctx context.Context, req ledger.AllocateRequest, pod cluster.StickyPod) (ledger.Lease, bool, error)
	ReturnBorrowed(ctx context.Context, released ledger.Lease) error
}

var _ Sticky = (*cluster.Manager)(nil)

// Pod Event reason of a sticky address another node holds.
const ReasonStickyAddressHeld = "StickyAddressHeld"

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

// returnBorrowed gives the borrowed addresses of released (a lease this node
// released: DEL, GC, reconciliation, an operator) back to their blocks, where they
// stay kept for their pod. A failure is logged; the manager's sweep returns what
// no lease holds.
func (s *Server) returnBorrowed(ctx context.Context, released ledger.Lease) {
	st, ok := s.cfg.Cluster.(Sticky)
	if !ok || len(released.Borrowed) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), returnTimeout)
	defer cancel()
	if err := st.ReturnBorrowed(ctx, released); err != nil {
		s.log.Warn("returning borrowed addresses of a released lease; the block sweep retries", "attachment", released.Key.String(), "addrs", fmt.Sprint(released.Borrowed), "err", err)
	}
}
