package cluster

import (
	"sort"
	"time"
)

// Health is what the manager knows about its datastore and its node lease, for the
// operator's doctor. Ages and the time left are on the manager's monotonic clock.
type Health struct {
	Node     string
	Started  bool // Start was called
	Provable bool // the node lease is provable now: its blocks hand out addresses
	// ProvableFor is the time left before the node fences itself (stops allocating)
	// unless a renewal succeeds; 0 when not provable.
	ProvableFor time.Duration
	LeaseTTL    time.Duration
	// Called: some datastore call's outcome was noted; then Reachable says whether
	// the last one succeeded, LastCallAge how long ago it was, and LastError why it
	// failed.
	Called      bool
	Reachable   bool
	LastCallAge time.Duration
	LastError   string
	// SinceSuccess is how long ago the last datastore call succeeded (or Start, when
	// none has).
	SinceSuccess time.Duration
	// Networks are the networks set up for cluster mode since the manager started.
	Networks []string
}

// Health reports the manager's datastore and lease health.
func (m *Manager) Health() Health {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.mono()
	h := Health{Node: m.opts.Node, Started: m.fencing.started, LeaseTTL: m.opts.LeaseTTL,
		Called: m.called, Reachable: m.reachable}
	h.Provable = m.fencing.started && !m.fencing.lapsed && now < m.fencing.deadline
	if h.Provable {
		h.ProvableFor = m.fencing.deadline - now
	}
	if m.called {
		h.LastCallAge = now - m.lastCall
	}
	if m.lastErr != nil {
		h.LastError = m.lastErr.Error()
	}
	if m.fencing.started {
		h.SinceSuccess = now - m.lastOK
	}
	for n := range m.nets {
		h.Networks = append(h.Networks, n)
	}
	sort.Strings(h.Networks)
	return h
}
