package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/ipledger/ipledger/internal/agent"
	"github.com/ipledger/ipledger/internal/ledger"
)

// startReconciler starts runtime reconciliation when --cri-endpoint is given.
func startReconciler(ctx context.Context, o *options, l *ledger.Ledger, log *slog.Logger) (agent.Guard, error) {
	if o.criEndpoint == "" {
		return nil, nil
	}
	return nil, errors.New("--cri-endpoint: runtime reconciliation is not wired yet")
}
