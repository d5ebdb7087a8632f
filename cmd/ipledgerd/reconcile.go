package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
)

// criTimeout bounds every CRI call: a fraction of the interval, within [1s, 10s].
func criTimeout(interval time.Duration) time.Duration {
	return min(max(interval/2, time.Second), 10*time.Second)
}

// runtimeParts is the reconciler and the runtime client it shares with the agent's
// operator questions (doctor, release, readiness).
type runtimeParts struct {
	rec *reconcile.Reconciler
	rt  *lazyRuntime
}

// newReconciler builds runtime reconciliation when --cri-endpoint is given (nil
// otherwise); start runs it. The runtime need not answer at start: until it does,
// every round and every Guard question gets "cannot tell" and nothing is released.
func newReconciler(o *options, l *ledger.Ledger, log *slog.Logger) (*runtimeParts, error) {
	if o.criEndpoint == "" {
		return nil, nil
	}
	rt := &lazyRuntime{endpoint: o.criEndpoint, timeout: criTimeout(o.reconcileInterval), log: log}
	r, err := reconcile.New(reconcile.Options{
		Ledger: l, Runtime: rt, Netns: reconcile.NSFS{},
		Interval: o.reconcileInterval, Grace: o.releaseGrace,
		ReclaimStranded: o.reclaimStranded, StrandedGrace: o.strandedGrace,
		Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("reconciler", "cri", o.criEndpoint, "interval", o.reconcileInterval, "grace", o.releaseGrace, "reclaimStranded", o.reclaimStranded, "strandedGrace", o.strandedGrace, "callTimeout", rt.timeout)
	return &runtimeParts{rec: r, rt: rt}, nil
}

// start reconciles at once and then every interval until ctx is done, counting each
// round and each failed runtime call in stats.
func (p *runtimeParts) start(ctx context.Context, interval time.Duration, stats *agent.Stats) {
	p.rt.onErr = stats.RuntimeError
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			began := time.Now()
			rd := p.rec.Reconcile(ctx)
			outcome := agent.RoundOK
			switch {
			case rd.Err != nil:
				outcome = agent.RoundFailed
			case rd.Doubtful:
				outcome = agent.RoundDoubtful
			}
			stats.ObserveRound(outcome, time.Since(began), rd.Reasons)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() { <-ctx.Done(); p.rt.close() }()
}

// lazyRuntime dials the CRI endpoint on first use and again after a failed dial.
type lazyRuntime struct {
	endpoint string
	timeout  time.Duration
	log      *slog.Logger
	// onErr counts a failed call (list, status, version); set before any call.
	onErr func(call string)
	mu    sync.Mutex
	c     *cri.Client
}

var (
	_ reconcile.Runtime = (*lazyRuntime)(nil)
	_ agent.RuntimeInfo = (*lazyRuntime)(nil)
)

func (r *lazyRuntime) failed(call string) {
	if r.onErr != nil {
		r.onErr(call)
	}
}

func (r *lazyRuntime) client(ctx context.Context) (*cri.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		return r.c, nil
	}
	c, err := cri.Dial(ctx, r.endpoint, r.timeout)
	if err != nil {
		return nil, err
	}
	r.log.Info("connected to the container runtime", "cri", r.endpoint)
	r.c = c
	return c, nil
}

func (r *lazyRuntime) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c != nil {
		r.c.Close()
	}
}

func (r *lazyRuntime) ListSandboxes(ctx context.Context) ([]cri.Sandbox, error) {
	c, err := r.client(ctx)
	if err != nil {
		r.failed("list")
		return nil, err
	}
	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
		r.failed("list")
		r.drop(c)
	}
	return sbs, err
}

// drop closes a client whose call failed, so the next call dials afresh instead of
// waiting out gRPC's reconnect backoff after a runtime restart.
func (r *lazyRuntime) drop(c *cri.Client) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == c {
		r.c = nil
		c.Close()
	}
}

func (r *lazyRuntime) SandboxStatus(ctx context.Context, id string) (cri.Sandbox, error) {
	c, err := r.client(ctx)
	if err != nil {
		r.failed("status")
		return cri.Sandbox{}, err
	}
	sb, err := c.SandboxStatus(ctx, id)
	if err != nil && !errors.Is(err, cri.ErrNotFound) {
		r.failed("status")
		r.drop(c)
	}
	return sb, err
}

// Version implements agent.RuntimeInfo.
func (r *lazyRuntime) Version(ctx context.Context) (string, error) {
	c, err := r.client(ctx)
	if err != nil {
		r.failed("version")
		return "", err
	}
	v, err := c.Version(ctx)
	if err != nil {
		r.failed("version")
		r.drop(c)
		return "", err
	}
	return v.Name + " " + v.Version, nil
}

// SandboxState implements agent.RuntimeInfo.
func (r *lazyRuntime) SandboxState(ctx context.Context, id string) (string, error) {
	sb, err := r.SandboxStatus(ctx, id)
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

// NotReady implements agent.RuntimeInfo.
func (r *lazyRuntime) NotReady(ctx context.Context) ([]api.SandboxAge, error) {
	sbs, err := r.ListSandboxes(ctx)
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

var (
	_ agent.Guard    = (*reconcile.Reconciler)(nil)
	_ agent.Verdicts = (*reconcile.Reconciler)(nil)
)
