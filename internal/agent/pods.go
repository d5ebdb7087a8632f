package agent

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
)

// Pods tells what the Kubernetes API says of this node's pods (ipledgerd
// --node-name). Contract: Pod never calls the API server (it answers from a
// watch's cache) and is safe for concurrent use. known is false when nothing can be
// told (the watch has not listed yet); then inAPI says whether the pod exists and
// phase is its status.phase. A non-empty uid is matched by UID, else namespace and
// name. The agent shows what it says beside each lease; the reconciler weighs it
// too, never alone (reconcile.PodWitness).
type Pods interface {
	Pod(namespace, name, uid string) (phase string, inAPI, known bool)
}

// PodWatch is the health of the watch behind Pods, when it tells one
// (kubenode.Pods): why its word that a pod is absent is not taken now (its watch
// broken since a time, or blind to a READY sandbox's pod), one line each, naming
// the node and the field selector. Doctor shows each as a WARN.
type PodWatch interface {
	Problems() []string
}

// podWatchChecks are doctor's lines on the pod watch.
func (s *Server) podWatchChecks() []api.Check {
	w, ok := s.cfg.Pods.(PodWatch)
	if !ok {
		return nil
	}
	var out []api.Check
	for _, p := range w.Problems() {
		out = append(out, api.Check{Level: api.CheckWarn, Text: p + " (the reconciler takes no pod as deleted from the API meanwhile)"})
	}
	return out
}

// Events records Kubernetes Events regarding pods. Contract: PodEvent never blocks
// and never fails (an Event that cannot be sent is logged and dropped), and may drop
// repeats; eventType is "Normal" or "Warning".
type Events interface {
	PodEvent(namespace, name, uid, eventType, reason, action, note string)
}

// Pod Event reasons and actions the agent records.
const (
	ReasonAddressReleased   = "AddressReleased"
	ReasonAddressSuperseded = "AddressSuperseded"
	ReasonAddressStranded   = "AddressStranded"

	actionRelease   = "Release"
	actionSupersede = "Supersede"
	actionReconcile = "Reconcile"

	eventNormal  = "Normal"
	eventWarning = "Warning"
)

// annotatePod fills in the lease's pod as the API shows it, when the agent watches
// this node's pods and the lease names a pod.
func (s *Server) annotatePod(v *api.LeaseView) {
	if s.cfg.Pods == nil || (v.UID == "" && v.Name == "") {
		return
	}
	phase, in, known := s.cfg.Pods.Pod(v.Namespace, v.Name, v.UID)
	if !known {
		return
	}
	v.PodPhase, v.PodInAPI = phase, api.PodInAPINo
	if in {
		v.PodInAPI = api.PodInAPIYes
	}
}

// podEvent records an Event on ls's pod, if there is an Events and a pod.
func (s *Server) podEvent(ls ledger.Lease, eventType, reason, action, note string) {
	if s.cfg.Events == nil || ls.Pod.Namespace == "" || ls.Pod.Name == "" {
		return
	}
	s.cfg.Events.PodEvent(ls.Pod.Namespace, ls.Pod.Name, ls.Pod.UID, eventType, reason, action, note)
}

// addrs lists a lease's addresses for a note.
func addrs(ls ledger.Lease) string {
	out := make([]string, len(ls.IPs))
	for i, p := range ls.IPs {
		out[i] = p.String()
	}
	return strings.Join(out, ",")
}

// supersededEvents records an AddressSuperseded Event for each of olds (leases of
// the pod judged supersedable before the ADD of k) that the ADD released.
func (s *Server) supersededEvents(olds []ledger.Lease, k ledger.Key) {
	for _, ls := range olds {
		if cur, held := s.cfg.Ledger.Lease(ls.Key); held && cur.Created.Equal(ls.Created) {
			continue
		}
		s.podEvent(ls, eventNormal, ReasonAddressSuperseded, actionSupersede, fmt.Sprintf(
			"address %s of network %s released: sandbox %s of this pod was superseded by sandbox %s (the runtime no longer runs the old one)",
			addrs(ls), ls.Key.Network, ls.Key.ContainerID, k.ContainerID))
	}
}

// strandedSeen is the stranded leases an Event was recorded for, so that each is
// reported once while it stays stranded.
type strandedSeen struct {
	mu sync.Mutex
	m  map[ledger.Key]ledger.Lease
}

// Reconciled records Events for a reconciliation round: AddressReleased (Normal) on
// the pod of each lease it released, with the reconciler's evidence, and
// AddressStranded (Warning) on the pod of each lease the reconciler holds stranded
// now and did not after the last round. It never blocks on the API server. The
// borrowed addresses of the released leases go back to their blocks first.
func (s *Server) Reconciled(rd reconcile.Round) {
	for _, ls := range rd.Released {
		s.returnBorrowed(context.Background(), ls)
	}
	if s.cfg.Events == nil {
		return
	}
	for i, ls := range rd.Released {
		why := ""
		if i < len(rd.Reasons) {
			why = string(rd.Reasons[i])
		}
		if i < len(rd.Details) && rd.Details[i] != "" {
			why += ": " + rd.Details[i]
		}
		s.podEvent(ls, eventNormal, ReasonAddressReleased, actionRelease, fmt.Sprintf(
			"address %s of network %s released by reconciliation (sandbox %s): %s", addrs(ls), ls.Key.Network, ls.Key.ContainerID, why))
	}
	if s.cfg.Verdicts == nil {
		return
	}
	now := map[ledger.Key]ledger.Lease{}
	var fresh []reconcile.Suspected
	s.stranded.mu.Lock()
	for _, sus := range s.cfg.Verdicts.Summary().Suspects {
		if sus.View.Class != reconcile.ClassStranded {
			continue
		}
		now[sus.Lease.Key] = sus.Lease
		if old, ok := s.stranded.m[sus.Lease.Key]; !ok || !old.Created.Equal(sus.Lease.Created) {
			fresh = append(fresh, sus)
		}
	}
	s.stranded.m = now
	s.stranded.mu.Unlock()
	for _, sus := range fresh {
		ls := sus.Lease
		s.podEvent(ls, eventWarning, ReasonAddressStranded, actionReconcile, fmt.Sprintf(
			"address %s of network %s is stranded, kept: sandbox %s is %s but the address is still configured (%s)",
			addrs(ls), ls.Key.Network, ls.Key.ContainerID, sus.View.Sandbox, sus.View.Suspect))
	}
}
