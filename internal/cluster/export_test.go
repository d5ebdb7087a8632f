package cluster

import (
	"net/netip"
	"time"
)

// SetReservationsPause sets rs's first pause after a break, before Run starts.
func SetReservationsPause(rs *Reservations, d time.Duration) { rs.pause0 = d }

// CopyShows reports whether m's watched copy of network's blocks is live and
// holds a record of block for which ok is true.
func CopyShows(m *Manager, network string, block netip.Prefix, ok func(BlockRecord) bool) bool {
	blocks, live := m.cachedBlocks(network)
	if !live {
		return false
	}
	for _, b := range blocks {
		if b.err == nil && b.rec.CIDR == block && ok(b.rec) {
			return true
		}
	}
	return false
}
