package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/ledger"
	"github.com/ipledger/ipledger/internal/reconcile"
)

// criTimeout bounds every CRI call: a fraction of the interval, within [1s, 10s].
func criTimeout(interval time.Duration) time.Duration {
	return min(max(interval/2, time.Second), 10*time.Second)
}

// startReconciler starts runtime reconciliation when --cri-endpoint is given. The
// runtime need not answer at start: until it does, every round and every Guard
// question gets "cannot tell" and nothing is released.
func startReconciler(ctx context.Context, o *options, l *ledger.Ledger, log *slog.Logger) (agent.Guard, error) {
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
	go r.Run(ctx)
	go func() { <-ctx.Done(); rt.close() }()
	return r, nil
}

// lazyRuntime dials the CRI endpoint on first use and again after a failed dial.
type lazyRuntime struct {
	endpoint string
	timeout  time.Duration
	log      *slog.Logger
	mu       sync.Mutex
	c        *cri.Client
}

var _ reconcile.Runtime = (*lazyRuntime)(nil)

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
		return nil, err
	}
	sbs, err := c.ListSandboxes(ctx)
	if err != nil {
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
		return cri.Sandbox{}, err
	}
	sb, err := c.SandboxStatus(ctx, id)
	if err != nil && !errors.Is(err, cri.ErrNotFound) {
		r.drop(c)
	}
	return sb, err
}
