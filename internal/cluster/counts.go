package cluster

import (
	"sync/atomic"

	"github.com/ipledger/ipledger/internal/ledger"
)

// Counts are the manager's figures since New, for the agent's metrics.
type Counts struct {
	Owned       int    // blocks the node's ledger holds and may allocate from (active or suspended)
	Claims      uint64 // blocks claimed by compare-and-swap
	ClaimsAhead uint64 // of Claims, those claimed ahead of need: in the background, or by Prepare (ahead.go)
	HandBacks   uint64 // empty blocks given back after the grace
	Reclaims    uint64 // dead nodes' blocks freed by this manager
	Suspensions uint64 // times the node's blocks were suspended (lease not provable)
	// BlockLists: LISTs of block records sent to the datastore: a claim's (no live
	// watched copy, or the copy was stale), a network's set-up, the sweep's (once a
	// quarantine, and for a network without a live copy) and `ipledgerctl blocks`
	BlockLists uint64
}

type counters struct {
	claims, claimsAhead, handBacks, reclaims, suspensions, blockLists atomic.Uint64
}

// Counts returns the manager's figures.
func (m *Manager) Counts() Counts {
	c := Counts{Claims: m.counts.claims.Load(), ClaimsAhead: m.counts.claimsAhead.Load(), HandBacks: m.counts.handBacks.Load(),
		Reclaims: m.counts.reclaims.Load(), Suspensions: m.counts.suspensions.Load(), BlockLists: m.counts.blockLists.Load()}
	for _, b := range m.l.Blocks("") {
		if b.State != ledger.BlockLost {
			c.Owned++
		}
	}
	return c
}
