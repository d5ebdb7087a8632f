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
