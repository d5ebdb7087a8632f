package cluster

import (
	"context"
	"errors"
)

// Sweep runs the periodic duties: suspends the blocks when the lease is no longer
// provable; gives back blocks that stayed empty past the grace (keeping the last one
// per range set), and at once the emptied blocks of ranges removed from their pool;
// reclaims the blocks of nodes whose lease stayed expired past the
// quarantine.
//
// Concurrency: Sweep holds stepMu for its whole run, excluding the re-verification
// after a lapse (a block it gives back is never re-affirmed or resumed meanwhile),
// but not the lease renewals: those go on beside it (renewMu), however many
// datastore calls it makes. The lease may therefore lapse, or be renewed, while it
// runs; it reads the fencing state afresh where it decides on it (Provable before
// the hand-backs and each re-adoption), and a lapse meanwhile leaves any block it
// re-adopts suspended in effect (the allocation guard refuses until the
// re-verification that follows it).
func (m *Manager) Sweep(ctx context.Context) error {
	m.stepMu.Lock()
	defer m.stepMu.Unlock()
	m.fence()
	var errs []error
	if m.Provable() {
		errs = append(errs, m.handBack(ctx))
		m.shrinkLedgers()
	}
	errs = append(errs, m.reclaim(ctx))
	return errors.Join(errs...)
}
