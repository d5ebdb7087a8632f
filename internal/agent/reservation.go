package agent

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/choice"
	"github.com/ipledger/ipledger/internal/cluster"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Reservations is cluster mode's copy of the operator's IPReservations
// (cluster.Reservations). Contract: Current never calls the datastore; it
// returns every reservation, or an error (wrapping cluster.ErrReservationsUnknown,
// saying why) while the copy cannot vouch for them: it has not listed since the
// agent started, or its watch broke since. Invalid returns the parse error of
// each reservation whose spec did not parse (its other entries are in Current).
// Live is closed while the copy is live (a new channel after each break); Kick
// asks the copy to list again now rather than at the end of its backoff.
type Reservations interface {
	Current() ([]cluster.Reservation, error)
	Invalid() []error
	Live() <-chan struct{}
	Kick()
}

// reservationsWait bounds how long an ADD waits for the copy to list (the agent
// just started, or the datastore came back after a break: the list is one round
// trip away) before it fails.
const reservationsWait = 5 * time.Second

var _ Reservations = (*cluster.Reservations)(nil)

// reserve keeps the reserved addresses out of a cluster-mode allocation: the
// reservations that overlap its ranges join areq.Exclude. An address the pod asks
// for by ipledger.io/ip inside a reservation is refused naming the reservation,
// before anything is allocated or claimed. While the reservations are unknown,
// nothing is allocated: a retryable error names the cause. An ADD that finds the
// copy not live asks it to list now and waits for that (at most reservationsWait,
// and ctx) before it fails: an agent's first ADDs follow its start, and after a
// break the copy's backoff may have grown to 30 s while the datastore is back. Node mode (no
// Reservations) is unchanged: its reservations are the conflist's exclude. A
// StatefulSet pod's sticky (non-nil) learns the reservations, to name the one
// that ends the keeping of an address kept for it.
func (s *Server) reserve(ctx context.Context, areq *ledger.AllocateRequest, chosen *choiceMade, pod api.Pod, sticky *cluster.StickyPod) *api.Error {
	if s.cfg.Cluster == nil || s.cfg.Reservations == nil {
		return nil
	}
	rs, err := s.cfg.Reservations.Current()
	if err != nil {
		live := s.cfg.Reservations.Live()
		s.cfg.Reservations.Kick()
		t := time.NewTimer(reservationsWait)
		select {
		case <-live:
			rs, err = s.cfg.Reservations.Current()
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	if err != nil {
		return &api.Error{Code: api.CodeUnavailable, Msg: fmt.Sprintf("no address is handed out while the reserved ones are unknown: %v; the runtime retries (check the datastore, and that the agent may list and watch ipreservations.ipledger.io)", err)}
	}
	if chosen != nil {
		for _, a := range chosen.want {
			if r, ok := cluster.Covering(rs, a); ok {
				why := ""
				if r.Reason != "" {
					why = fmt.Sprintf(" (%s)", r.Reason)
				}
				return s.refuseChoice(pod, fmt.Sprintf("%s on %s asks for %s: reserved by IPReservation %s%s; give an address outside every IPReservation (kubectl get ipreservations), or remove the annotation", choice.IP, chosen.ipFrom, a, r.Name, why))
			}
		}
	}
	ex := cluster.ReservedIn(rs, areq.Ranges)
	if n := len(areq.Exclude) + len(ex); n > ledger.MaxExclude {
		return &api.Error{Code: api.CodeInvalid, Msg: fmt.Sprintf("%d reserved prefixes (IPReservations and ipam.exclude) overlap the ranges of network %q; at most %d: merge addresses into CIDRs", n, areq.Key.Network, ledger.MaxExclude)}
	}
	areq.Exclude = append(areq.Exclude[:len(areq.Exclude):len(areq.Exclude)], ex...)
	if sticky != nil {
		sticky.Reservations = rs
	}
	return nil
}

// reservationChecks are doctor's lines on the IPReservations (cluster mode): FAIL
// while the copy cannot vouch for them (ADDs fail meanwhile) and for each spec
// that does not parse; WARN naming each live lease inside a reservation (pod,
// address, reservation), which keeps its address until its pod goes; else OK.
// They read the copy and the ledger only.
func (s *Server) reservationChecks() []api.Check {
	if s.cfg.Reservations == nil {
		return nil
	}
	rs, err := s.cfg.Reservations.Current()
	if err != nil {
		return []api.Check{{Level: api.CheckFail, Text: fmt.Sprintf("IPReservations unknown: %v; cluster-mode ADDs fail (retryable) until the agent has listed them again; fix: check the datastore (see the datastore line) and that the agent may list and watch ipreservations.ipledger.io (deploy/cluster/rbac.yaml)", err)}}
	}
	var out []api.Check
	for _, err := range s.cfg.Reservations.Invalid() {
		out = append(out, api.Check{Level: api.CheckFail, Text: fmt.Sprintf("%v (the entries that parse are honoured; fix: correct the IPReservation)", err)})
	}
	prefixes := 0
	for _, r := range rs {
		prefixes += len(r.Prefixes)
	}
	var inside []string
	for _, ls := range s.cfg.Ledger.Leases("") {
		for _, ip := range ls.IPs {
			r, ok := cluster.Covering(rs, ip.Addr())
			if !ok {
				continue
			}
			who := ls.Key.String()
			if ls.Pod.Name != "" {
				who = "pod " + ls.Pod.Namespace + "/" + ls.Pod.Name
			}
			inside = append(inside, fmt.Sprintf("%s (%s, IPReservation %s)", who, ip.Addr(), r.Name))
		}
	}
	if len(inside) > 0 {
		out = append(out, api.Check{Level: api.CheckWarn, Text: fmt.Sprintf("%d live leases inside an IPReservation: %s; each keeps its address until its pod goes, and the address then stays out; fix: delete those pods to move them out of the reserved addresses now, or leave them", len(inside), strings.Join(inside, ", "))})
	} else {
		out = append(out, api.Check{Level: api.CheckOK, Text: fmt.Sprintf("%d IPReservations (%d addresses and CIDRs), no live lease inside one", len(rs), prefixes)})
	}
	return out
}
