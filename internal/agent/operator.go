package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/ledgerview"
	"github.com/ipledger/ipledger/internal/reconcile"
	"github.com/ipledger/ipledger/internal/spool"
)

// RuntimeInfo is the container runtime as the operator's questions reach it
// (doctor, release, readiness). Implemented by *cri.Reconnecting.
//
// Contract: every call is bounded by a timeout and never changes anything. Version
// returns the runtime's name and version, or an error when the runtime cannot be
// reached. SandboxStatus returns one sandbox's state, or an error wrapping
// cri.ErrNotFound when the runtime does not know the ID. ListSandboxes returns every
// sandbox in every state.
type RuntimeInfo interface {
	Version(ctx context.Context) (cri.RuntimeVersion, error)
	SandboxStatus(ctx context.Context, id string) (cri.Sandbox, error)
	ListSandboxes(ctx context.Context) ([]cri.Sandbox, error)
}

var _ RuntimeInfo = (*cri.Reconnecting)(nil)

// runtimeVersion names the runtime and its version (e.g. "containerd 1.6.20").
func runtimeVersion(ctx context.Context, rt RuntimeInfo) (string, error) {
	v, err := rt.Version(ctx)
	if err != nil {
		return "", err
	}
	return v.Name + " " + v.Version, nil
}

// sandboxState returns reconcile.SandboxReady, SandboxNotReady or SandboxGone (the
// runtime answered NotFound) for one sandbox ID, or an error when the runtime cannot
// tell.
func sandboxState(ctx context.Context, rt RuntimeInfo, id string) (string, error) {
	sb, err := rt.SandboxStatus(ctx, id)
	switch {
	case errors.Is(err, cri.ErrNotFound):
		return reconcile.SandboxGone, nil
	case err != nil:
		return "", err
	case sb.State == cri.StateReady:
		return reconcile.SandboxReady, nil
	case sb.State == cri.StateNotReady:
		return reconcile.SandboxNotReady, nil
	}
	return "", fmt.Errorf("sandbox %s: the runtime reports state %s", id, sb.State)
}

// notReady lists the sandboxes the runtime reports NOTREADY.
func notReady(ctx context.Context, rt RuntimeInfo) ([]api.SandboxAge, error) {
	sbs, err := rt.ListSandboxes(ctx)
	if err != nil {
		return nil, err
	}
	var out []api.SandboxAge
	for _, sb := range sbs {
		if sb.State == cri.StateNotReady {
			created := sb.CreatedAt
			if created.UnixNano() <= 0 {
				// containerd 1.6 reports a failed sandbox's zero Go time as
				// -6795364578871345152 ns (1754): unknown
				created = time.Time{}
			}
			out = append(out, api.SandboxAge{ID: sb.ID, Namespace: sb.Namespace, Name: sb.Name, Created: created})
		}
	}
	return out, nil
}

// Verdicts is the reconciler's last round, for operators (leases, audit, metrics,
// the pool page). Contract: neither method calls the runtime. Verdict returns the
// last round's view of lease k (the zero View before any listing has succeeded);
// Summary returns the last round's counts and its suspected leases still held, in
// key order.
type Verdicts interface {
	Verdict(k ledger.Key) reconcile.View
	Summary() reconcile.Summary
}

// annotateVerdict fills in the reconciler's view of a lease: sandbox state,
// suspicion and its class.
func (s *Server) annotateVerdict(v *api.LeaseView) {
	if s.cfg.Verdicts == nil {
		return
	}
	w := s.cfg.Verdicts.Verdict(ledger.Key{Network: v.Network, ContainerID: v.ContainerID, IfName: v.IfName})
	v.Sandbox, v.Suspect = w.Sandbox, w.Suspect
	v.Verdict = verdictOf(w.Class)
}

// verdictOf names a class for operators.
func verdictOf(c reconcile.Class) string {
	switch c {
	case reconcile.ClassAbandoned:
		return api.VerdictLeaked
	case reconcile.ClassStranded:
		return api.VerdictStranded
	case reconcile.ClassDoubt:
		return api.VerdictSuspect
	}
	return ""
}

// summarize fills in the reconciler's counts for an audit.
func (s *Server) summarize(a *api.Audit) {
	if s.cfg.Verdicts == nil {
		return
	}
	sum := s.cfg.Verdicts.Summary()
	a.Runtime = "ok"
	if !sum.RuntimeOK {
		a.Runtime = "unreachable"
	}
	a.Suspect += sum.Suspect
	a.Stranded += sum.Stranded
	a.Leaked += sum.Leaked
	for _, su := range sum.Suspects {
		lv := ledgerview.Lease(su.Lease, nil)
		lv.Sandbox, lv.Suspect = su.View.Sandbox, su.View.Suspect
		a.SuspectLeases = append(a.SuspectLeases, lv)
	}
}

// held returns those of keys that hold a lease now.
func (s *Server) held(keys []ledger.Key) []ledger.Key {
	var out []ledger.Key
	for _, k := range keys {
		if _, ok := s.cfg.Ledger.Lease(k); ok {
			out = append(out, k)
		}
	}
	return out
}

// countSuperseded counts as superseded those of keys (held before an ADD) that the ADD
// released.
func (s *Server) countSuperseded(keys []ledger.Key) {
	n := 0
	for _, k := range keys {
		if _, ok := s.cfg.Ledger.Lease(k); !ok {
			n++
		}
	}
	if n > 0 {
		s.stats.Released(ledger.ReasonSuperseded, n)
	}
}

// releaseAllowed asks the runtime before an operator's release: a sandbox the runtime
// reports READY keeps its lease (invariant 2), as does one the runtime cannot vouch
// for, unless the request forces it.
func (s *Server) releaseAllowed(ctx context.Context, req api.Request) *api.Error {
	if req.ForceReadySandbox || s.cfg.Runtime == nil {
		return nil
	}
	if _, ok := s.cfg.Ledger.Lease(keyOf(req)); !ok {
		return nil // answered not-found by the release itself
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := sandboxState(ctx, s.cfg.Runtime, req.ContainerID)
	switch {
	case err != nil:
		return &api.Error{Code: api.CodeConflict, Msg: fmt.Sprintf("attachment %s: the runtime could not say whether sandbox %s is in use (%v); kept. Retry when the runtime answers, or force it with --force-release-ready-sandbox", req.Key(), req.ContainerID, err)}
	case st == reconcile.SandboxReady:
		return &api.Error{Code: api.CodeConflict, Msg: fmt.Sprintf("attachment %s: the runtime reports sandbox %s READY, so its pod uses the address; kept. Delete the pod instead, or force it with --force-release-ready-sandbox", req.Key(), req.ContainerID)}
	}
	return nil
}

// doctor answers OpDoctor.
func (s *Server) doctor(ctx context.Context) *api.Response {
	d := &api.Diagnosis{Runtime: "none", Now: time.Now()}
	if s.cfg.SpoolDir != "" {
		d.SpoolBacklog = spool.Len(s.cfg.SpoolDir)
	}
	d.Pools = s.poolUse(time.Now())
	rep, err := s.cfg.Ledger.Audit()
	if err != nil {
		d.Problems = append(d.Problems, "audit failed: "+err.Error())
	} else {
		d.BooksBalanced = rep.OK
		d.Problems = append(d.Problems, rep.Problems...)
		for _, da := range rep.DoubleAssigned {
			d.Problems = append(d.Problems, fmt.Sprintf("%s/%s is held by %d attachments", da.Network, da.IP, len(da.Holders)))
		}
	}
	if s.clock != nil {
		d.ClockSteps, d.LastStep = s.clock.seen()
	}
	if s.cfg.Runtime != nil {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := runtimeVersion(ctx, s.cfg.Runtime)
		if err != nil {
			d.Runtime, d.RuntimeError = "unreachable", err.Error()
		} else {
			d.Runtime, d.RuntimeVersion = "ok", v
			nr, err := notReady(ctx, s.cfg.Runtime)
			if err != nil {
				d.Runtime, d.RuntimeError = "unreachable", err.Error()
			}
			d.NotReady = s.sandboxAges(nr)
		}
	}
	if s.cfg.Cluster != nil {
		d.ClusterChecks = append(s.clusterChecks(d.Pools), s.poolRecordChecks()...)
		d.ClusterChecks = append(d.ClusterChecks, s.reservationChecks()...)
	}
	if s.cfg.NodeNetwork != nil {
		d.NetworkChecks = s.cfg.NodeNetwork.Checks()
	}
	d.NetworkChecks = append(d.NetworkChecks, s.podCIDRChecks()...)
	d.NetworkChecks = append(d.NetworkChecks, s.podWatchChecks()...)
	d.NetworkChecks = append(d.NetworkChecks, s.netnsChecks()...)
	return &api.Response{Doctor: d}
}

// sandboxAges fills in the creation time the runtime did not report (containerd 1.6
// reports none for a sandbox whose network setup failed) with the creation of the
// sandbox's oldest lease, the ADD that followed it; it stays zero when there is none.
func (s *Server) sandboxAges(nr []api.SandboxAge) []api.SandboxAge {
	missing := map[string]int{}
	for i, sb := range nr {
		if sb.Created.IsZero() {
			missing[sb.ID] = i
		}
	}
	if len(missing) == 0 {
		return nr
	}
	for _, ls := range s.cfg.Ledger.Leases("") {
		if i, ok := missing[ls.Key.ContainerID]; ok && (nr[i].Created.IsZero() || ls.Created.Before(nr[i].Created)) {
			nr[i].Created = ls.Created
		}
	}
	return nr
}

// poolUse sums each pool's addresses by state.
func (s *Server) poolUse(now time.Time) []api.PoolUse {
	delay := s.cfg.Ledger.ReuseDelay()
	var out []api.PoolUse
	for _, p := range s.cfg.Ledger.Pools() {
		u := api.PoolUse{Network: p.Network, InUse: p.InUse, Exhausted: !p.Available}
		perSet := 0
		if len(p.Usable) > 0 {
			perSet = p.InUse / len(p.Usable)
		}
		for _, n := range p.Usable {
			u.Usable += n
			if n > 0 {
				u.MostUsed = max(u.MostUsed, float64(perSet)/float64(n))
			}
		}
		for _, f := range s.cfg.Ledger.FreeAddresses(p.Network) {
			if now.Before(f.ReleasedAt.Add(delay)) {
				u.Cooling++
			}
		}
		out = append(out, u)
	}
	return out
}

// ready reports why the agent is not ready to serve, or nil: the ledger's store must
// answer, the socket must answer a ping (Serve applies the spool before it answers
// anything), and the runtime, when configured, must answer.
func (s *Server) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := s.cfg.Ledger.History("", netip.IPv4Unspecified()); err != nil {
		return fmt.Errorf("ledger: %w", err)
	}
	if _, err := api.Call(ctx, s.cfg.Socket, api.Request{Op: api.OpPing}); err != nil {
		return fmt.Errorf("socket: %w (the spool is applied before the first answer)", err)
	}
	if s.cfg.Runtime != nil {
		if _, err := s.cfg.Runtime.Version(ctx); err != nil {
			return fmt.Errorf("runtime: %w", err)
		}
	}
	return nil
}

// clockWatch detects wall-clock steps: over one check interval, the wall clock moved
// more than a second more (or less) than the monotonic clock.
type clockWatch struct {
	mu       sync.Mutex
	started  bool
	prevWall time.Time
	prevMono time.Duration
	steps    int
	last     string
}

func (c *clockWatch) seen() (int, string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.steps, c.last
}

// check reads clk and returns the step since the previous check (0 when none).
func (c *clockWatch) check(clk clock.Clock) time.Duration {
	wall, mono := clk.Now(), clk.Mono()
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() { c.prevWall, c.prevMono, c.started = wall, mono, true }()
	if !c.started {
		return 0
	}
	step := wall.Sub(c.prevWall) - (mono - c.prevMono)
	if step <= time.Second && step >= -time.Second {
		return 0
	}
	c.steps++
	c.last = fmt.Sprintf("%s at %s", step.Round(time.Millisecond), wall.Format(time.RFC3339))
	return step
}

// WatchClock counts wall-clock steps (shown by doctor and ipledger_clock_steps_total)
// until ctx is done, checking every tick.
func (s *Server) WatchClock(ctx context.Context, tick time.Duration) {
	clk := clock.NewSystem()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		if step := s.clock.check(clk); step != 0 {
			s.stats.clockSteps.Inc()
			s.log.Warn("wall clock stepped", "step", step.Round(time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
