package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/clock"
	"github.com/ipledger/ipledger/internal/cri"
	"github.com/ipledger/ipledger/internal/kubenode"
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
	rt  *cri.Reconnecting
}

// newReconciler builds runtime reconciliation when --cri-endpoint is given (nil
// otherwise); start runs it. The runtime need not answer at start: until it does,
// every round and every Guard question gets "cannot tell" and nothing is released.
//
// api, when not nil, is the Kubernetes API's view of this node's pods, the
// reconciler's second witness (--api-evidence).
func newReconciler(o *options, l *ledger.Ledger, boot clock.Boot, api reconcile.PodWitness, log *slog.Logger) (*runtimeParts, error) {
	if o.criEndpoint == "" {
		return nil, nil
	}
	timeout := criTimeout(o.reconcileInterval)
	rt := cri.NewReconnecting(o.criEndpoint, timeout, log)
	r, err := reconcile.New(reconcile.Options{
		Ledger: l, Runtime: rt, Netns: reconcile.NSFS{},
		Interval: o.reconcileInterval, Grace: o.releaseGrace,
		ReclaimStranded: o.reclaimStranded, StrandedGrace: o.strandedGrace,
		Boot: boot, API: api, Mounts: reconcile.RuntimeMounts(o.criEndpoint), Logger: log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("reconciler", "cri", o.criEndpoint, "interval", o.reconcileInterval, "grace", o.releaseGrace, "reclaimStranded", o.reclaimStranded, "strandedGrace", o.strandedGrace, "apiEvidence", api != nil, "callTimeout", timeout)
	return &runtimeParts{rec: r, rt: rt}, nil
}

// start reconciles at once and then every interval until ctx is done, counting each
// round and each failed runtime call in srv's stats, and handing each round to srv
// for the pods' Events.
func (p *runtimeParts) start(ctx context.Context, interval time.Duration, srv *agent.Server) {
	stats := srv.Stats()
	p.rt.OnError(stats.RuntimeError)
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
			srv.Reconciled(rd)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() { <-ctx.Done(); p.rt.Close() }()
}

var (
	_ reconcile.PodWitness = (*kubenode.Pods)(nil)
	_ agent.Guard          = (*reconcile.Reconciler)(nil)
	_ agent.Verdicts       = (*reconcile.Reconciler)(nil)
)
