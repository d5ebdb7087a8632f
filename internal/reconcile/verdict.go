package reconcile

import (
	"github.com/ipledger/ipledger/internal/api"
	"github.com/ipledger/ipledger/internal/ledger"
)

// Verdict implements the agent's Verdicts: the last round's class of lease k, as
// api.VerdictLeaked (abandoned, awaiting release), api.VerdictStranded or
// api.VerdictSuspect; "" when not suspected.
func (r *Reconciler) Verdict(k ledger.Key) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch r.views[k].class {
	case classAbandoned:
		return api.VerdictLeaked
	case classStranded:
		return api.VerdictStranded
	case classDoubt:
		return api.VerdictSuspect
	}
	return ""
}
